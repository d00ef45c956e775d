// Command reconciler runs on a schedule (every minute in AWS; `make invoke FN=reconciler`
// locally): it starts again the termination workflows that a throttle, a crash or a lost
// message left unstarted, restarts (a bounded number of times) the operations whose attempt
// made no progress for longer than an attempt takes, reports and ends the operations whose
// VMs are all final but whose Report step never came (a run cut off), and reports stuck ones
// and failed ones that still hold VMs. It never asks Step Functions what became of a run.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/emf"
)

func main() {
	s, logger, cfg := config.Start(envvar.Reconciler, readSettings)
	metrics := s.Metrics()
	store := s.Store.Open(cfg)
	r := &capacity.Reconciler{
		// No bus (EVENT_BUS_NAME unset, a stack without it): no reports published.
		Publisher: config.Bus(cfg, s.eventBusName),
		// Each report once: under the attempt's report claim, shared with the workflow.
		Claims:      store,
		Store:       store,
		Workflow:    config.Workflow(cfg, s.stateMachineARN),
		StartAfter:  s.startAfter,
		StuckAfter:  s.stuckAfter,
		HeldAfter:   s.heldAfter,
		MaxRestarts: 3,
		StartRate:   float64(s.startRate), // 0: the domain's default
		Logger:      logger,
		Metrics:     metrics,
	}
	lambda.Start(handler(r, metrics))
}

// settings are the function's configuration (envvar.Reconciler).
type settings struct {
	config.Common
	config.Store
	stateMachineARN        string
	eventBusName           string // "": no bus, no reports published
	startAfter, stuckAfter time.Duration
	heldAfter              time.Duration // 0: the domain's default
	startRate              int           // 0: the domain's default
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	s := settings{
		Common:          config.ReadCommon(e),
		Store:           config.ReadStore(e),
		stateMachineARN: envvar.StateMachineARN.Get(e),
		eventBusName:    envvar.EventBusName.Optional(e),
		startAfter:      envvar.StartAfter.Get(e),
		stuckAfter:      envvar.StuckAfter.Get(e),
		heldAfter:       envvar.HeldAfter.Get(e),
		startRate:       envvar.StartRate.Get(e),
	}
	return s
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
	// PublishFailed: operations whose report was not published (next run, or next check).
	PublishFailed []string `json:"publishFailed"`
	// Reported: operations with every VM final whose Report step never came, reported (and
	// then ended: Ended) here.
	Reported []string `json:"reported"`
	// DrainCut: the run's time ran out before every due pending-start operation was tried.
	DrainCut bool `json:"drainCut"`
}

// handler runs one reconciliation for any event (the schedule's, or an empty one on demand),
// and records its counts as metrics (alarms on StuckReclaimOperations,
// ReclaimStartsExhausted and HeldReclaimOperations).
func handler(r *capacity.Reconciler, metrics *emf.Recorder) func(context.Context, json.RawMessage) (Result, error) {
	return func(ctx context.Context, _ json.RawMessage) (Result, error) {
		report, err := r.Run(ctx)
		if report == nil {
			return Result{}, fmt.Errorf("reconcile: %w", err)
		}
		res := Result{
			Started: nonNil(report.Started), Restarted: nonNil(report.Restarted), StartFailed: nonNil(report.StartFailed),
			Ended: nonNil(report.Ended), Exhausted: []string{}, Stuck: []string{}, Held: []string{}, Reported: nonNil(report.Reported),
			PublishFailed: nonNil(report.PublishFailed), DrainCut: report.DrainCut,
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
		// What the run did is counted even when a part of it failed (a listing): a restart
		// exhausted before it still alarms.
		metrics.Reconciled(ctx, report)
		if err != nil {
			return res, fmt.Errorf("reconcile: %w", err)
		}
		return res, nil
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
