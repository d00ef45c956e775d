// Command operation-events is a task of the termination workflow: it publishes a reclaim
// operation's events on the capacity bus. Phase "notice" (before the grace period) publishes
// the eviction notices of the VMs still to terminate; phase "report" (after the terminations)
// publishes each VM's outcome and, once every VM's is final, the operation's end, then writes
// that end (completed or failed) on the operation. Both derive the events from the stored
// operation under stable ids, so Step Functions' retries and the reconciler's restarts only
// repeat events consumers deduplicate; the report of an operation's end goes out once per
// attempt, under a claim in the operation's partition (two runs of the task at once: one
// publishes and ends it), and a report of an operation already ended publishes nothing.
//
// Environment: envvar.OperationEvents.
package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	s, logger, cfg := config.Start(envvar.OperationEvents, readSettings)
	store := s.Store.Open(cfg)
	announcer := &capacity.Announcer{
		Store:     store,
		Publisher: config.Bus(cfg, s.eventBusName),
		Logger:    logger,
		// The end's report once per attempt, though a task is run twice (a duplicate delivery).
		Claims: store,
		// ReclaimTerminationTime, from the report's end write.
		Metrics: s.Metrics(),
	}
	lambda.Start(handler(announcer, logger))
}

// settings are the function's configuration (envvar.OperationEvents).
type settings struct {
	config.Common
	config.Store
	eventBusName string
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	s := settings{Common: config.ReadCommon(e), Store: config.ReadStore(e), eventBusName: envvar.EventBusName.Get(e)}
	return s
}

// handler publishes one phase's events. A returned error (the operation could not be read,
// or an event was not accepted) fails the task, and Step Functions retries it.
func handler(a *capacity.Announcer, logger *slog.Logger) func(context.Context, stepfn.EventsTask) (stepfn.EventsResult, error) {
	return func(ctx context.Context, task stepfn.EventsTask) (stepfn.EventsResult, error) {
		var run func(ctx context.Context, nodeID, reclaimID string, attempt int) (int, error)
		switch task.Phase {
		case stepfn.PhaseNotice:
			run = a.Notify
		case stepfn.PhaseReport:
			run = a.Report
		default:
			return stepfn.EventsResult{}, fmt.Errorf("operation events of %s: unknown phase %q", task.ReclaimID, task.Phase)
		}
		n, err := run(ctx, task.NodeID, task.ReclaimID, task.Attempt)
		if err != nil {
			return stepfn.EventsResult{}, fmt.Errorf("operation events (%s) of %s on node %s: %w", task.Phase, task.ReclaimID, task.NodeID, err)
		}
		logger.InfoContext(ctx, "operation events", "phase", task.Phase, "reclaim_id", task.ReclaimID, "node", task.NodeID,
			"attempt", task.Attempt, "published", n)
		return stepfn.EventsResult{Published: n}, nil
	}
}
