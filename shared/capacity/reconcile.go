package capacity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Reconciler repairs what a crash or an outage can leave behind between a reclaim's commit
// and the end of its workflow:
//
//   - a pending-start operation whose execution was never started (its StartExecution failed)
//     is started, under the attempt's execution name, so none runs twice;
//   - an operation whose execution closed before the operation ended (its task retries ran
//     out, before or after its first round) is restarted as the next attempt, under a new
//     execution name, at most MaxRestarts times; past that it fails with a reason;
//   - a terminating operation whose VMs all have outcomes is ended, as a backstop to the
//     workflow's own end;
//   - a terminating operation past StuckAfter whose execution still runs is reported;
//   - a failed operation that still holds VMs (their termination failed, so they stay
//     terminating and keep their units) HeldAfter after it failed is reported, until a
//     re-drive or a force-end lets them go.
//
// Pending-start operations are drained: the run pages through all of them, oldest first, and
// starts those past their grace at StartRate (by StartChecked: a start of a running
// execution is a success, a closed one answers ErrExecutionExists and is then asked for its
// status), until none is left or DrainFor is spent, so a burst's throttled starts are made
// good at the rate Step Functions allows rather than a hundred a minute. One still in its
// grace period is asked its status (DescribeExecution, a far smaller quota) for at most Batch
// of them per run: the others are started when their grace ends. Terminating and failed
// operations are read oldest first, at most Batch per state and run. None stays in those
// states for long (restarts are bounded, executions time out), so old records cannot starve
// newer ones.
type Reconciler struct {
	Store    TerminationStore
	Workflow WorkflowInspector
	// StartAfter: an operation younger than this (since it was created or re-driven) may
	// still be started by its API call; older ones are checked here.
	StartAfter time.Duration
	// StuckAfter: a terminating operation older than this is reported as stuck.
	StuckAfter time.Duration
	// HeldAfter: a failed operation that still holds VMs this long after it failed is
	// reported as held (default DefaultHeldAfter).
	HeldAfter time.Duration
	// MaxRestarts bounds the restarts of an operation whose executions keep closing early
	// (default 3).
	MaxRestarts int
	// Batch bounds the terminating and failed operations handled per run, and the
	// pending-start ones still in their grace period whose status a run asks (default 100).
	Batch int
	// StartRate is how many starts a second the drain of pending-start operations makes
	// (default DefaultStartRate), StartWorkers how many at once (default 16: a start takes
	// tens of milliseconds), ThrottleBackoff the first pause of them all after a start the
	// service still throttled after the SDK's retries (default 250ms, doubling to 5s).
	StartRate       float64
	StartWorkers    int
	ThrottleBackoff time.Duration
	// DrainFor bounds how long a run drains pending-start operations (default 45s, within a
	// run a minute); it also stops 5s before ctx's deadline (the function's timeout).
	DrainFor time.Duration
	Now      func() time.Time
	Logger   *slog.Logger
	// Metrics is told of the operations this Reconciler ends (nil: none).
	Metrics Metrics
	// Publisher, if set, publishes an operation's report (see OperationReport) before this
	// Reconciler ends or fails it: once ended, nothing else would report it. A publish that
	// fails leaves the operation as it is for the next run.
	Publisher Publisher
}

// ReconcileReport says what a run did.
type ReconcileReport struct {
	Started     []string // operations whose execution this run started (a first start or a restart)
	Restarted   []string // of those, the ones restarted as a new attempt after a closed execution
	StartFailed []string // operations whose start or status check failed (retried next run)
	Ended       []string // terminating operations whose outcomes were all recorded, ended here
	Exhausted   []Operation
	Stuck       []Operation
	// Held are failed operations past HeldAfter that still hold VMs (Held.VMIDs: those VMs),
	// oldest first, at most Batch.
	Held []Operation
	// PublishFailed are operations due to be ended whose report could not be published:
	// left as they were, for the next run.
	PublishFailed []string
	// DrainCut: the run's time ran out before it had tried every pending-start operation
	// due; the next run goes on from the oldest.
	DrainCut bool
}

// DefaultStartRate is the drain's starts a second: two thirds of StartExecution's refill in
// eu-west-1 (300 a second, bucket 1,300), so the API's own starts keep the rest.
const DefaultStartRate = 200

// drainPage is how many pending-start operations the drain lists at once.
const drainPage = 250

func (rep *ReconcileReport) add(o *ReconcileReport) {
	rep.Started = append(rep.Started, o.Started...)
	rep.Restarted = append(rep.Restarted, o.Restarted...)
	rep.StartFailed = append(rep.StartFailed, o.StartFailed...)
	rep.Ended = append(rep.Ended, o.Ended...)
	rep.Exhausted = append(rep.Exhausted, o.Exhausted...)
	rep.Stuck = append(rep.Stuck, o.Stuck...)
	rep.Held = append(rep.Held, o.Held...)
	rep.PublishFailed = append(rep.PublishFailed, o.PublishFailed...)
	rep.DrainCut = rep.DrainCut || o.DrainCut
}

// Run makes one pass.
func (r *Reconciler) Run(ctx context.Context) (*ReconcileReport, error) {
	now := time.Now().UTC()
	if r.Now != nil {
		now = r.Now().UTC()
	}
	batch := r.Batch
	if batch <= 0 {
		batch = 100
	}
	report := &ReconcileReport{}
	if err := r.drainPending(ctx, now, batch, report); err != nil {
		return nil, err
	}
	ops, _, err := r.Store.OperationsInState(ctx, OpTerminating, now.Add(-r.StartAfter), "", batch)
	if err != nil {
		return nil, fmt.Errorf("list %s operations: %w", OpTerminating, err)
	}
	for _, listed := range ops {
		op, ok := r.current(ctx, listed, OpTerminating, report)
		if !ok {
			continue
		}
		if err := r.reconcile(ctx, *op, now, report); err != nil {
			r.logger().ErrorContext(ctx, "reconcile reclaim operation", "reclaim_id", op.ID, "node", op.NodeID, "err", err)
			report.StartFailed = append(report.StartFailed, op.ID)
		}
	}
	if err := r.reportHeld(ctx, now, batch, report); err != nil {
		return nil, err
	}
	return report, nil
}

// current reads an operation listed by the byState index as it is now (the index is
// eventually consistent and carries no outcomes); ok is false when the read failed (logged
// and reported) or the operation has left state, the one it was listed in.
func (r *Reconciler) current(ctx context.Context, listed Operation, state OperationState, report *ReconcileReport) (*Operation, bool) {
	op, err := r.Store.GetOperation(ctx, listed.NodeID, listed.ID)
	if err != nil {
		r.logger().ErrorContext(ctx, "read reclaim operation", "reclaim_id", listed.ID, "node", listed.NodeID, "err", err)
		report.StartFailed = append(report.StartFailed, listed.ID)
		return nil, false
	}
	return op, op.State == state
}

// DefaultHeldAfter is how long a failed operation may hold VMs before it is reported: long
// enough for its owner to re-drive it, short enough that units nobody can use or sell are
// seen to within the hour.
const DefaultHeldAfter = time.Hour

// reportHeld reports the failed operations that still hold VMs HeldAfter after they failed.
// Their VMs stay terminating, and their units unusable, until a re-drive terminates them or
// an operator force-ends them: nothing else would ever free them.
func (r *Reconciler) reportHeld(ctx context.Context, now time.Time, batch int, report *ReconcileReport) error {
	heldAfter := r.HeldAfter
	if heldAfter <= 0 {
		heldAfter = DefaultHeldAfter
	}
	ops, _, err := r.Store.OperationsInState(ctx, OpFailed, now.Add(-heldAfter), "", batch)
	if err != nil {
		return fmt.Errorf("list failed operations: %w", err)
	}
	for _, listed := range ops {
		op, err := r.Store.GetOperation(ctx, listed.NodeID, listed.ID)
		if err != nil {
			// Not a reason to skip the others: the next run reads it again.
			r.logger().ErrorContext(ctx, "read failed reclaim operation", "reclaim_id", listed.ID, "node", listed.NodeID, "err", err)
			continue
		}
		held := op.Held()
		if op.State != OpFailed || len(held) == 0 || now.Sub(op.UpdatedAt) < heldAfter {
			continue // moved on since the index was written, or let go
		}
		if op.Expiring {
			// Failed before failed operations were kept: it would expire with its VMs held.
			if err := r.Store.HoldOperation(ctx, *op); err != nil && !errors.Is(err, ErrConflict) {
				r.logger().ErrorContext(ctx, "remove the expiry of a held reclaim operation", "reclaim_id", op.ID, "node", op.NodeID, "err", err)
			}
		}
		r.logger().ErrorContext(ctx, "failed reclaim operation still holds VMs: re-drive it, or force-end VMs confirmed gone",
			"reclaim_id", op.ID, "node", op.NodeID, "reservation", op.ReservationID, "vms_held", held,
			"failed_at", op.UpdatedAt, "age_s", int(now.Sub(op.UpdatedAt).Seconds()), "reason", op.Reason)
		o := *op
		o.VMIDs = held
		report.Held = append(report.Held, o)
	}
	return nil
}

// Held lists the operation's VMs without a success outcome: those whose termination failed
// or never ran, which it holds terminating (and their units with them) until they have one.
func (o Operation) Held() []string {
	out := []string{}
	for _, vm := range o.VMIDs {
		if got, ok := o.Outcomes[vm]; !ok || got.Outcome == OutcomeFailed {
			out = append(out, vm)
		}
	}
	return out
}

func (r *Reconciler) reconcile(ctx context.Context, op Operation, now time.Time, report *ReconcileReport) error {
	if op.State == OpTerminating && op.Ended() {
		ended := op
		ended.State, ended.UpdatedAt = op.EndState(), now
		if !r.reported(ctx, ended, report) {
			return nil
		}
		err := r.Store.EndOperation(ctx, op, op.EndState(), now)
		if errors.Is(err, ErrConflict) {
			return nil // its workflow ended it meanwhile
		}
		if err != nil {
			return fmt.Errorf("end operation %s: %w", op.ID, err)
		}
		r.logger().WarnContext(ctx, "reclaim operation ended by the reconciler", "reclaim_id", op.ID, "node", op.NodeID, "state", op.EndState())
		if r.Metrics != nil {
			r.Metrics.OperationEnded(ctx, op, now)
		}
		report.Ended = append(report.Ended, op.ID)
		return nil
	}
	status, err := r.Workflow.Status(ctx, op)
	if err != nil {
		return fmt.Errorf("status of execution %s: %w", ExecutionName(op), err)
	}
	switch {
	case status == ExecNotFound && op.State == OpPendingStart:
		// The API's (or an earlier restart's) StartExecution never took: start this attempt.
		if err := r.Workflow.Start(ctx, op); err != nil {
			return fmt.Errorf("start execution %s: %w", ExecutionName(op), err)
		}
		r.logger().InfoContext(ctx, "started termination workflow left unstarted", "reclaim_id", op.ID, "node", op.NodeID,
			"execution", ExecutionName(op), "age_s", int(now.Sub(op.CreatedAt).Seconds()))
		report.Started = append(report.Started, op.ID)
		return nil
	case status.Closed() || status == ExecNotFound:
		return r.restart(ctx, op, status, now, report)
	}
	// Running: its rounds will end it. Report it if that takes too long (counted from when
	// this attempt began terminating: a re-driven operation may be old).
	since := op.UpdatedAt
	if since.IsZero() {
		since = op.CreatedAt
	}
	if op.State == OpTerminating && now.Sub(since) >= r.StuckAfter {
		r.logger().ErrorContext(ctx, "reclaim operation stuck terminating", "reclaim_id", op.ID, "node", op.NodeID,
			"execution_arn", op.ExecutionARN, "vms_waiting", op.Unfinished(), "age_s", int(now.Sub(since).Seconds()))
		report.Stuck = append(report.Stuck, op)
	}
	return nil
}

// restart runs an operation whose execution closed before the operation ended as its next
// attempt, or fails it once the restarts are spent. The attempt is moved on with a condition
// on the one read, so two reconcilers cannot both restart it.
func (r *Reconciler) restart(ctx context.Context, op Operation, status ExecutionStatus, now time.Time, report *ReconcileReport) error {
	maxRestarts := r.MaxRestarts
	if maxRestarts <= 0 {
		maxRestarts = 3
	}
	if op.Restarts >= maxRestarts {
		reason := fmt.Sprintf("termination workflow closed before the operation ended %d times (last: %s %s)",
			op.Restarts+1, ExecutionName(op), status)
		failed := op
		failed.State, failed.Reason, failed.UpdatedAt = OpFailed, reason, now
		if !r.reported(ctx, failed, report) {
			return nil
		}
		err := r.Store.FailOperation(ctx, op, reason, now)
		if errors.Is(err, ErrConflict) {
			if !r.movedTo(ctx, op, func(o *Operation) bool { return o.State == OpFailed && o.Reason == reason }) {
				return nil // another writer moved it on
			}
			err = nil // this run's write, whose answer was lost: still report and alarm
		}
		if err != nil {
			return fmt.Errorf("fail operation %s: %w", op.ID, err)
		}
		r.logger().ErrorContext(ctx, "reclaim operation failed: restarts exhausted", "reclaim_id", op.ID, "node", op.NodeID,
			"reason", reason, "vms_waiting", op.Unfinished())
		op.State, op.Reason = OpFailed, reason
		report.Exhausted = append(report.Exhausted, op)
		return nil
	}
	err := r.Store.RestartOperation(ctx, op, now)
	next := op.CurrentAttempt() + 1
	if errors.Is(err, ErrConflict) {
		if !r.movedTo(ctx, op, func(o *Operation) bool { return o.State == OpPendingStart && o.CurrentAttempt() == next }) {
			return nil // its workflow moved it on
		}
		// This run's restart whose answer was lost, or another reconciler's: either way the
		// attempt is due, and starting it under its name twice runs it once.
		err = nil
	}
	if err != nil {
		return fmt.Errorf("restart operation %s: %w", op.ID, err)
	}
	prev := ExecutionName(op)
	op.State, op.Attempt, op.Restarts = OpPendingStart, op.CurrentAttempt()+1, op.Restarts+1
	r.logger().WarnContext(ctx, "restarting termination workflow", "reclaim_id", op.ID, "node", op.NodeID,
		"closed_execution", prev, "status", status, "execution", ExecutionName(op), "restarts", op.Restarts)
	report.Restarted = append(report.Restarted, op.ID)
	// A failed start leaves it pending-start at the new attempt: the next run starts it.
	if err := r.Workflow.Start(ctx, op); err != nil {
		return fmt.Errorf("start execution %s: %w", ExecutionName(op), err)
	}
	report.Started = append(report.Started, op.ID)
	return nil
}

// reported publishes the report of an operation about to be ended as ended says, and reports
// whether the end may be written: with no Publisher, or once the report is published. The
// report goes first because nothing reports an operation after its end is written; a report
// whose end write then loses is the same report its winner publishes, under the same ids.
func (r *Reconciler) reported(ctx context.Context, ended Operation, report *ReconcileReport) bool {
	if r.Publisher == nil {
		return true
	}
	if err := publish(ctx, r.Publisher, OperationReport(ended)); err != nil {
		r.logger().ErrorContext(ctx, "operation report not published; its end is left for the next run",
			"reclaim_id", ended.ID, "node", ended.NodeID, "state", ended.State, "err", err)
		report.PublishFailed = append(report.PublishFailed, ended.ID)
		return false
	}
	return true
}

// movedTo reports whether the operation, read again, is as want says: after a conditional
// write fails its condition, it tells a write of this run whose answer was lost (the SDK's
// retry of it then fails the condition it already met) from another writer's.
func (r *Reconciler) movedTo(ctx context.Context, op Operation, want func(*Operation) bool) bool {
	now, err := r.Store.GetOperation(ctx, op.NodeID, op.ID)
	return err == nil && want(now)
}

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}
