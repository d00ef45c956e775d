package capacity

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// drainPending pages through the pending-start operations that entered the state before
// StartAfter, oldest first, and handles each (see Reconciler): until none is left or the
// run's time for it is spent.
func (r *Reconciler) drainPending(ctx context.Context, now time.Time, batch int, report *ReconcileReport) error {
	stop := r.drainStop(ctx)
	d := &drain{
		r: r, now: now, stop: stop, graceLeft: batch,
		pace: newPacer(orDefault(r.StartRate, DefaultStartRate), orDefault(r.ThrottleBackoff, 250*time.Millisecond)),
	}
	workers := r.StartWorkers
	if workers <= 0 {
		workers = 16
	}
	for after := ""; ; {
		if !time.Now().Before(stop) {
			report.DrainCut = true
			return nil
		}
		ops, next, err := r.Store.OperationsInState(ctx, OpPendingStart, now.Add(-r.StartAfter), after, drainPage)
		if err != nil {
			return fmt.Errorf("list %s operations: %w", OpPendingStart, err)
		}
		d.page(ctx, ops, workers, report)
		if next == "" || report.DrainCut {
			return nil
		}
		after = next
	}
}

// drainStop is when the drain stops starting: DrainFor from now, and no later than 5s before
// ctx's deadline, so that the run can still report.
func (r *Reconciler) drainStop(ctx context.Context) time.Time {
	stop := time.Now().Add(orDefault(r.DrainFor, 45*time.Second))
	if deadline, ok := ctx.Deadline(); ok && deadline.Add(-5*time.Second).Before(stop) {
		stop = deadline.Add(-5 * time.Second)
	}
	return stop
}

// drain is one run's drain of the pending-start operations.
type drain struct {
	r    *Reconciler
	now  time.Time
	stop time.Time
	pace *pacer

	mu        sync.Mutex
	graceLeft int // status checks left for operations still in their grace period
}

// page handles one page of listed operations with workers at once; each worker reports on
// its own, merged at the end.
func (d *drain) page(ctx context.Context, ops []Operation, workers int, report *ReconcileReport) {
	todo := make(chan Operation)
	reports := make([]*ReconcileReport, workers)
	var wg sync.WaitGroup
	for w := range workers {
		reports[w] = &ReconcileReport{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for op := range todo {
				d.one(ctx, op, reports[w])
			}
		}()
	}
	for _, op := range ops {
		todo <- op
	}
	close(todo)
	wg.Wait()
	for _, rep := range reports {
		report.add(rep)
	}
}

// one handles a listed pending-start operation.
func (d *drain) one(ctx context.Context, listed Operation, report *ReconcileReport) {
	r := d.r
	if !time.Now().Before(d.stop) {
		report.DrainCut = true
		return
	}
	op, ok := r.current(ctx, listed, OpPendingStart, report)
	if !ok {
		return
	}
	if op.TerminateAfter.After(d.now.Add(-r.StartAfter)) {
		// In its grace period, its execution (if it started) waits before beginning it: only
		// DescribeExecution tells, and its quota is a tenth of StartExecution's. A few are
		// asked; the rest are started when their grace ends.
		if !d.takeGraceCheck() {
			return
		}
		if err := r.reconcile(ctx, *op, d.now, report); err != nil {
			r.logger().ErrorContext(ctx, "reconcile reclaim operation", "reclaim_id", op.ID, "node", op.NodeID, "err", err)
			report.StartFailed = append(report.StartFailed, op.ID)
		}
		return
	}
	if err := d.start(ctx, *op, report); err != nil {
		if errors.Is(err, errPastDeadline) {
			report.DrainCut = true
		}
		r.logger().ErrorContext(ctx, "start reclaim operation", "reclaim_id", op.ID, "node", op.NodeID, "err", err)
		report.StartFailed = append(report.StartFailed, op.ID)
	}
}

func (d *drain) takeGraceCheck() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.graceLeft <= 0 {
		return false
	}
	d.graceLeft--
	return true
}

// start starts the operation's attempt at the drain's pace, again after each throttle, until
// the run's time for starts is over. An execution of the name that refused the start has
// closed (it never began the operation): it is restarted as the next attempt.
func (d *drain) start(ctx context.Context, op Operation, report *ReconcileReport) error {
	r := d.r
	for {
		if err := d.pace.wait(ctx, d.stop); err != nil {
			return err
		}
		err := r.Workflow.StartChecked(ctx, op)
		if errors.Is(err, ErrThrottled) {
			d.pace.throttled()
			continue
		}
		d.pace.ok()
		switch {
		case err == nil:
			// Started, or already running (Step Functions answers a repeated start of a
			// running execution with the same input as a success).
			r.logger().InfoContext(ctx, "started termination workflow left unstarted", "reclaim_id", op.ID, "node", op.NodeID,
				"execution", ExecutionName(op), "age_s", int(d.now.Sub(op.CreatedAt).Seconds()))
			report.Started = append(report.Started, op.ID)
			return nil
		case errors.Is(err, ErrExecutionExists):
			status, err := r.Workflow.Status(ctx, op)
			if err != nil {
				return fmt.Errorf("status of execution %s: %w", ExecutionName(op), err)
			}
			if status.Closed() || status == ExecNotFound {
				return r.restart(ctx, op, status, d.now, report)
			}
			return nil // running after all: its rounds will begin it
		default:
			return fmt.Errorf("start execution %s: %w", ExecutionName(op), err)
		}
	}
}

func orDefault[T float64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
