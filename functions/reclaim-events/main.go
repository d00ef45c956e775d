// Command reclaim-events is the Lambda behind the reclaim request queue: it applies the
// Capacity Reclaim Requested events the bus routes there (from the allowed sources and the
// service's own schedules) and the Node Topology Changed events (from the topology sources)
// through the domain, publishes each outcome on the bus, and reports the records to deliver
// again (partial batch response).
package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

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
	env := config.Must(config.Required("APP_ENV", "STATE_TABLE", "AUDIT_TABLE", "STATE_MACHINE_ARN", "EVENT_BUS_NAME"))
	cfg := config.Must(config.AWS(context.Background()))

	store := dynamo.New(dynamodb.NewFromConfig(cfg), env["STATE_TABLE"], env["AUDIT_TABLE"])
	// How long history is kept (the stack sets it per environment; 0: the store's default).
	store.Retention = config.Must(config.Duration("HISTORY_RETENTION", 0))
	workflow := &stepfn.Starter{Client: sfn.NewFromConfig(cfg), StateMachineARN: env["STATE_MACHINE_ARN"]}
	metrics := emf.New(os.Stdout, env["APP_ENV"])
	bus := eventbus.New(eventbridge.NewFromConfig(cfg), env["EVENT_BUS_NAME"])
	h := newHandler(store, workflow, metrics, bus, allowedSources(), logger)
	h.TopologySources = topologySources()
	lambda.Start(h.Handle)
}

// newHandler wires the store, workflow and bus into the event API.
func newHandler(store *dynamo.Store, workflow capacity.Workflow, metrics capacity.Metrics, bus capacity.Publisher, allowed []string, logger *slog.Logger) *eventapi.Handler {
	return &eventapi.Handler{
		Service: &capacity.Service{
			Store: store, Schedules: store, Workflow: workflow, Logger: logger, Metrics: metrics,
		},
		Publisher:      bus,
		AllowedSources: allowed,
		Logger:         logger,
	}
}

// topologySources reads TOPOLOGY_EVENT_SOURCES (comma-separated): the sources whose topology
// changes are applied, as an operator. Unset: capacity.SourceFleet; set and empty: none.
func topologySources() []string {
	v, ok := os.LookupEnv("TOPOLOGY_EVENT_SOURCES")
	if !ok {
		return []string{capacity.SourceFleet}
	}
	return splitList(v)
}

// allowedSources reads ALLOWED_EVENT_SOURCES (comma-separated), if set: the bus rule already
// admits only the environment's sources, this refuses a misrouted event too. Unset: nil, the
// rule alone decides.
func allowedSources() []string {
	v, ok := os.LookupEnv("ALLOWED_EVENT_SOURCES")
	if !ok {
		return nil
	}
	return splitList(v)
}

// splitList splits a comma-separated list, dropping blanks; never nil.
func splitList(v string) []string {
	out := []string{}
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
