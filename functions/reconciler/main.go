// Command reconciler runs on a schedule (every minute in AWS; `make invoke FN=reconciler`
// locally): it starts termination workflows that a crash or an outage left unstarted,
// restarts (a bounded number of times) those whose execution closed before the operation
// ended, ends operations whose outcomes are all recorded, and reports stuck ones and failed
// ones that still hold VMs.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/eventbus"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	s, logger, cfg := config.Start(envvar.Reconciler, readSettings)
	store := dynamo.New(dynamodb.NewFromConfig(cfg), s.stateTable, "")
	store.Retention = s.historyRetention
	metrics := emf.New(os.Stdout, s.AppEnv)
	r := &capacity.Reconciler{
		Publisher:   publisher(cfg, s.eventBusName),
		Store:       store,
		Workflow:    &stepfn.Starter{Client: sfn.NewFromConfig(cfg), StateMachineARN: s.stateMachineARN},
		StartAfter:  s.startAfter,
		StuckAfter:  s.stuckAfter,
		HeldAfter:   s.heldAfter,
		MaxRestarts: 3,
		Logger:      logger,
		Metrics:     metrics,
	}
	lambda.Start(handler(r, metrics))
}

// settings are the function's configuration (envvar.Reconciler).
type settings struct {
	config.Common
	stateTable, stateMachineARN string
	eventBusName                string        // "": no bus, no reports published
	historyRetention            time.Duration // per environment; 0: the store's default
	startAfter, stuckAfter      time.Duration
	heldAfter                   time.Duration // 0: the domain's default
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	s := settings{
		Common:           config.ReadCommon(e),
		stateTable:       envvar.StateTable.Get(e),
		stateMachineARN:  envvar.StateMachineARN.Get(e),
		eventBusName:     envvar.EventBusName.Optional(e),
		historyRetention: envvar.HistoryRetention.Get(e),
		startAfter:       envvar.StartAfter.Get(e),
		stuckAfter:       envvar.StuckAfter.Get(e),
		heldAfter:        envvar.HeldAfter.Get(e),
	}
	return s
}

// publisher publishes the reports of the operations the reconciler ends on the bus
// EVENT_BUS_NAME names; none when it is not set (a stack without the bus).
func publisher(cfg aws.Config, bus string) capacity.Publisher {
	if bus == "" {
		return nil
	}
	return eventbus.New(eventbridge.NewFromConfig(cfg), bus)
}

// Result is what an invocation returns (visible to `make invoke` and tests).
type Result struct {
	Started     []string `json:"started"`
	Restarted   []string `json:"restarted"`
	StartFailed []string `json:"startFailed"`
	Ended       []string `json:"ended"`
	Exhausted   []string `json:"exhausted"`
	Stuck       []string `json:"stuck"`
	// Held: failed operations that still hold VMs past HELD_AFTER (re-drive or force-end).
	Held []string `json:"held"`
	// PublishFailed: operations due to end whose report was not published (next run).
	PublishFailed []string `json:"publishFailed"`
}

// handler runs one reconciliation for any event (the schedule's, or an empty one on demand),
// and records its counts as metrics (alarms on StuckReclaimOperations,
// ReclaimStartsExhausted and HeldReclaimOperations).
func handler(r *capacity.Reconciler, metrics *emf.Recorder) func(context.Context, json.RawMessage) (Result, error) {
	return func(ctx context.Context, _ json.RawMessage) (Result, error) {
		report, err := r.Run(ctx)
		if err != nil {
			return Result{}, fmt.Errorf("reconcile: %w", err)
		}
		res := Result{
			Started: nonNil(report.Started), Restarted: nonNil(report.Restarted), StartFailed: nonNil(report.StartFailed),
			Ended: nonNil(report.Ended), Exhausted: []string{}, Stuck: []string{}, Held: []string{},
			PublishFailed: nonNil(report.PublishFailed),
		}
		for _, op := range report.Exhausted {
			res.Exhausted = append(res.Exhausted, op.ID)
		}
		for _, op := range report.Stuck {
			res.Stuck = append(res.Stuck, op.ID)
		}
		for _, op := range report.Held {
			res.Held = append(res.Held, op.ID)
		}
		metrics.Reconciled(ctx, report)
		return res, nil
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
