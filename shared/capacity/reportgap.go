package capacity

import (
	"context"
	"fmt"
	"time"
)

// reportAges are when, after StartAfter past its end, an ended operation is checked for a
// missing report: soon (a run cut off between its end and its report), then further apart
// (a report that kept failing, an outage of the bus or of the reconciler), within
// ReportWithin. Each check reads the operation (its report claim comes with it), so an
// operation is read about six times in the hour rather than once a minute, and a burst of
// ends is checked at its own few ages rather than by every run.
var reportAges = []time.Duration{0, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 20 * time.Minute, 40 * time.Minute}

// reportSlot is how wide each check's window of end times is: longer than the minute between
// runs, so that a late tick leaves no end unchecked (an end in the overlap is read twice).
const reportSlot = 90 * time.Second

// reportEnded publishes the reports that ended operations' runs left out: for each end state
// and check age, the operations that ended then (byState index, oldest first) whose report
// claim is not done. At most batch reports a run; the rest wait for their next age.
func (r *Reconciler) reportEnded(ctx context.Context, now time.Time, batch int, report *ReconcileReport) error {
	if r.Publisher == nil || r.Claims == nil {
		return nil
	}
	within := orDefault(r.ReportWithin, DefaultReportWithin)
	stop := r.drainStop(ctx)
	published := 0
	for _, state := range []OperationState{OpCompleted, OpFailed} {
		for _, age := range reportAges {
			before := now.Add(-r.StartAfter - age)
			since := before.Add(-reportSlot)
			if now.Sub(since) > within {
				break
			}
			for after := ""; ; {
				ops, next, err := r.Store.OperationsInStateBetween(ctx, state, since, before, after, drainPage)
				if err != nil {
					return fmt.Errorf("list %s operations: %w", state, err)
				}
				for _, listed := range ops {
					if published >= batch || !time.Now().Before(stop) {
						report.DrainCut = true
						return nil
					}
					if r.reportOne(ctx, listed, state, now, report) {
						published++
					}
				}
				if next == "" {
					break
				}
				after = next
			}
		}
	}
	return nil
}

// reportOne publishes the report of a listed ended operation if its attempt's report is not
// done, and says whether it did.
func (r *Reconciler) reportOne(ctx context.Context, listed Operation, state OperationState, now time.Time, report *ReconcileReport) bool {
	op, err := r.Store.GetOperation(ctx, listed.NodeID, listed.ID)
	if err != nil {
		r.logger().ErrorContext(ctx, "read ended reclaim operation", "reclaim_id", listed.ID, "node", listed.NodeID, "err", err)
		return false
	}
	if op.State != state || op.Reported {
		return false // reported, or moved on (re-driven) since the index was written
	}
	published, err := r.publishOnce(ctx, *op, now)
	if err != nil {
		r.logger().ErrorContext(ctx, "report of an ended reclaim operation not published; left for its next check",
			"reclaim_id", op.ID, "node", op.NodeID, "state", op.State, "err", err)
		report.PublishFailed = append(report.PublishFailed, op.ID)
		return false
	}
	if published {
		r.logger().WarnContext(ctx, "report of an ended reclaim operation published by the reconciler (its run left it out)",
			"reclaim_id", op.ID, "node", op.NodeID, "state", op.State, "attempt", op.CurrentAttempt(),
			"ended_s_ago", int(now.Sub(op.UpdatedAt).Seconds()))
		report.Reported = append(report.Reported, op.ID)
	}
	return published
}
