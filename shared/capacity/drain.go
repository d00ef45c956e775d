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
func (r *Reconciler) drainPending(ctx context.Context, now time.Time, report *ReconcileReport) error {
	stop := r.drainStop(ctx)
	d := &drain{
		r: r, now: now, stop: stop,
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

// one handles a listed pending-start operation: one whose first step is not yet due (its
// grace, or StartAfter) is left; one due is started again; one due for longer than a whole
// attempt takes is restarted as the next attempt.
func (d *drain) one(ctx context.Context, listed Operation, report *ReconcileReport) {
	r := d.r
	if !time.Now().Before(d.stop) {
		report.DrainCut = true
		return
	}
	if d.now.Sub(listed.pendingSince()) < r.StartAfter {
		return // in its grace period (the index carries it): not read
	}
	op, ok := r.current(ctx, listed, OpPendingStart, report)
	if !ok {
		return
	}
	overdue := d.now.Sub(op.pendingSince())
	var err error
	switch {
	case overdue < r.StartAfter:
		return // restarted or re-driven since listed
	case overdue >= r.StartAfter+r.attemptBound():
		// Started again run after run and still not begun: the first step keeps failing (an
		// input its definition cannot read), not a throttle. Bounded by MaxRestarts.
		why := fmt.Sprintf("attempt %d not begun %s after it was due", op.CurrentAttempt(), overdue.Round(time.Second))
		err = r.restart(ctx, *op, why, d.now, report, d.startPaced)
	default:
		err = d.start(ctx, *op, report)
	}
	if err != nil {
		if errors.Is(err, errPastDeadline) {
			report.DrainCut = true
		}
		r.logger().ErrorContext(ctx, "start reclaim operation", "reclaim_id", op.ID, "node", op.NodeID, "err", err)
		report.StartFailed = append(report.StartFailed, op.ID)
	}
}

// start starts the operation's attempt again (its first step was lost, or its start
// throttled) at the drain's pace; no restart is counted: a second run of the first step is a
// duplicate delivery, which the effects' guards make harmless. On a Standard machine a start
// refused because the attempt's execution closed (it never began the operation) restarts it
// as the next attempt.
func (d *drain) start(ctx context.Context, op Operation, report *ReconcileReport) error {
	r := d.r
	err := d.startPaced(ctx, op)
	switch {
	case err == nil:
		r.logger().InfoContext(ctx, "started termination workflow left unstarted", "reclaim_id", op.ID, "node", op.NodeID,
			"execution", ExecutionName(op), "age_s", int(d.now.Sub(op.CreatedAt).Seconds()))
		report.Started = append(report.Started, op.ID)
		return nil
	case errors.Is(err, ErrExecutionExists):
		return r.restart(ctx, op, fmt.Sprintf("execution %s closed before it began the operation", ExecutionName(op)), d.now, report, d.startPaced)
	default:
		return fmt.Errorf("start execution %s: %w", ExecutionName(op), err)
	}
}

// startPaced starts the operation's attempt at the drain's pace, again after each throttle,
// until the run's time for starts is over.
func (d *drain) startPaced(ctx context.Context, op Operation) error {
	for {
		if err := d.pace.wait(ctx, d.stop); err != nil {
			return err
		}
		err := d.r.Workflow.StartChecked(ctx, op)
		if errors.Is(err, ErrThrottled) {
			d.pace.throttled()
			continue
		}
		d.pace.ok()
		return err
	}
}

func orDefault[T float64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
