// Command reclaim-events is the Lambda behind the reclaim request queue: it applies the
// Capacity Reclaim Requested events the bus routes there (from the configured event
// principals and the service's own schedules) and the Node Topology Changed events through the
// domain, each as its source's principal (EVENT_PRINCIPALS, from cdk.json eventPrincipals),
// publishes each outcome on the bus, and reports the records to deliver again (partial batch
// response).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/eventapi"
	"github.com/openrelay/capacity/shared/eventbus"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	logger := config.Logger()
	env := config.Must(config.Required("APP_ENV", "STATE_TABLE", "AUDIT_TABLE", "KEYS_TABLE", "STATE_MACHINE_ARN", "EVENT_BUS_NAME",
		"EVENT_PRINCIPALS", "INTAKE_QUEUE_ARN", "EVENT_ACCOUNT", "AWS_REGION"))
	principals := config.Must(capacity.ParseEventPrincipals(env["EVENT_PRINCIPALS"]))
	cfg := config.Must(config.AWS(context.Background()))

	store := dynamo.New(dynamodb.NewFromConfig(cfg), env["STATE_TABLE"], env["AUDIT_TABLE"])
	// How long history is kept (the stack sets it per environment; 0: the store's default).
	store.Retention = config.Must(config.Duration("HISTORY_RETENTION", 0))
	// Read-only (GetItem): a scheduled reclaim's firing checks the key that scheduled it.
	store.KeysTable = env["KEYS_TABLE"]
	workflow := &stepfn.Starter{Client: sfn.NewFromConfig(cfg), StateMachineARN: env["STATE_MACHINE_ARN"]}
	metrics := emf.New(os.Stdout, env["APP_ENV"])
	bus := eventbus.New(eventbridge.NewFromConfig(cfg), env["EVENT_BUS_NAME"])
	h := newHandler(store, workflow, metrics, bus, principals, logger)
	h.Origin = eventapi.Origin{
		QueueARN: env["INTAKE_QUEUE_ARN"], Account: env["EVENT_ACCOUNT"], Region: env["AWS_REGION"], Bus: env["EVENT_BUS_NAME"],
	}
	lambda.Start(h.Handle)
}

// newHandler wires the store, workflow and bus into the event API.
func newHandler(store *dynamo.Store, workflow capacity.Workflow, metrics capacity.Metrics, bus capacity.Publisher, principals capacity.EventPrincipals, logger *slog.Logger) *eventapi.Handler {
	return &eventapi.Handler{
		Service: &capacity.Service{
			Store: store, Schedules: store, CreatorKeys: store, Workflow: workflow, Logger: logger, Metrics: metrics,
		},
		Publisher:  bus,
		Principals: principals,
		Logger:     logger,
	}
}
