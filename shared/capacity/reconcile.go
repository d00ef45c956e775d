package capacity

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Reconciler repairs what a crash or an outage can leave behind between a reclaim's commit
// and its workflow: operations still pending-start (their StartExecution failed or never
// ran) are started, under the same execution name so none runs twice; operations terminating
// past a deadline are reported for an operator.
type Reconciler struct {
	Store    TerminationStore
	Workflow Workflow
	// StartAfter: a pending-start operation younger than this may still be started by its
	// API call; older ones are started here.
	StartAfter time.Duration
	// StuckAfter: a terminating operation older than this is reported as stuck.
	StuckAfter time.Duration
	// Batch bounds the operations handled per run (default 100).
	Batch  int
	Now    func() time.Time
	Logger *slog.Logger
}

// ReconcileReport says what a run did.
type ReconcileReport struct {
	Started     []string // operations whose workflow this run started
	StartFailed []string // operations whose start failed again (retried next run)
	Stuck       []Operation
}

// Run makes one pass.
func (r *Reconciler) Run(ctx context.Context) (*ReconcileReport, error) {
	now := time.Now().UTC()
	if r.Now != nil {
		now = r.Now().UTC()
	}
	logger := r.Logger
	if logger == nil {
		logger = slog.Default()
	}
	batch := r.Batch
	if batch <= 0 {
		batch = 100
	}
	report := &ReconcileReport{}
	pending, err := r.Store.OperationsInState(ctx, OpPendingStart, now.Add(-r.StartAfter), batch)
	if err != nil {
		return nil, fmt.Errorf("list pending-start operations: %w", err)
	}
	for _, op := range pending {
		if err := r.Workflow.Start(ctx, op); err != nil {
			logger.ErrorContext(ctx, "start termination workflow", "reclaim_id", op.ID, "node", op.NodeID, "err", err)
			report.StartFailed = append(report.StartFailed, op.ID)
			continue
		}
		logger.InfoContext(ctx, "started termination workflow left unstarted", "reclaim_id", op.ID, "node", op.NodeID,
			"age_s", int(now.Sub(op.CreatedAt).Seconds()))
		report.Started = append(report.Started, op.ID)
	}
	stuck, err := r.Store.OperationsInState(ctx, OpTerminating, now.Add(-r.StuckAfter), batch)
	if err != nil {
		return nil, fmt.Errorf("list terminating operations: %w", err)
	}
	for _, op := range stuck {
		if full, err := r.Store.GetOperation(ctx, op.NodeID, op.ID); err == nil {
			op = *full // with the outcomes recorded so far
		}
		var waiting []string
		for _, vm := range op.VMIDs {
			if _, ok := op.Outcomes[vm]; !ok {
				waiting = append(waiting, vm)
			}
		}
		logger.ErrorContext(ctx, "reclaim operation stuck terminating", "reclaim_id", op.ID, "node", op.NodeID,
			"execution_arn", op.ExecutionARN, "vms_waiting", waiting, "age_s", int(now.Sub(op.CreatedAt).Seconds()))
		report.Stuck = append(report.Stuck, op)
	}
	return report, nil
}
