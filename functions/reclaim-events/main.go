// Command reclaim-events is the Lambda behind the reclaim request queue: it applies the
// Capacity Reclaim Requested events the bus routes there (from the configured event
// principals and the service's own schedules) and the Node Topology Changed events through the
// domain, each as its source's principal (EVENT_PRINCIPALS, from cdk.json eventPrincipals),
// publishes each outcome on the bus, and reports the records to deliver again (partial batch
// response).
package main

import (
	"fmt"
	"log/slog"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/eventapi"
)

func main() {
	s, logger, cfg := config.Start(envvar.ReclaimEvents, readSettings)

	// The keys table read-only (GetItem): a scheduled reclaim's firing checks the key that
	// scheduled it.
	store := s.Store.Open(cfg)
	h := newHandler(store, config.Workflow(cfg, s.stateMachineARN), s.Metrics(), config.Bus(cfg, s.origin.Bus), s.principals, logger)
	h.Origin = s.origin
	h.Receipts = &eventapi.QueueReceipts{Client: sqs.NewFromConfig(cfg), QueueURL: s.queueURL}
	lambda.Start(h.Handle)
}

// settings are the function's configuration (envvar.ReclaimEvents).
type settings struct {
	config.Common
	config.Store
	stateMachineARN string
	principals      capacity.EventPrincipals
	origin          eventapi.Origin // where a genuine request comes from
	queueURL        string          // the intake queue, which proves each record's receipt
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	s := settings{
		Common:          config.ReadCommon(e),
		Store:           config.ReadStore(e),
		stateMachineARN: envvar.StateMachineARN.Get(e),
		origin: eventapi.Origin{QueueARN: envvar.IntakeQueueARN.Get(e), Account: envvar.EventAccount.Get(e),
			Region: envvar.Region.Get(e), Bus: envvar.EventBusName.Get(e)},
		queueURL: envvar.IntakeQueueURL.Get(e),
	}
	if principals := envvar.EventPrincipals.Get(e); principals != "" {
		var err error
		if s.principals, err = capacity.ParseEventPrincipals(principals); err != nil {
			e.Fail(fmt.Errorf("environment variable %s: %w", envvar.EventPrincipals.Name(), err))
		}
	}
	return s
}

// newHandler wires the store, workflow and bus into the event API.
func newHandler(store *dynamo.Store, workflow capacity.Workflow, metrics *emf.Recorder, bus capacity.Publisher, principals capacity.EventPrincipals, logger *slog.Logger) *eventapi.Handler {
	return &eventapi.Handler{
		Service: &capacity.Service{
			Store: store, Schedules: store, CreatorKeys: store, Workflow: workflow, Logger: logger, Metrics: metrics,
		},
		Publisher:  bus,
		Principals: principals,
		Refusals:   metrics,
		Logger:     logger,
	}
}
