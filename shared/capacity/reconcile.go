package capacity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Reconciler repairs what a crash, a throttled start, a lost message or a run cut off can
// leave behind between a reclaim's commit and its report. It never asks Step Functions what
// became of a run (an Express run cannot be described): liveness is read from the store, and
// every step it starts again is safe to run twice (see docs/termination.md).
//
//   - a pending-start operation still pending-start StartAfter past max(its grace's end, its
//     last update) lost its first step (or the scheduled round after its grace), or its start
//     was throttled: its attempt is started again, at StartRate and without counting a
//     restart (a duplicate run is harmless). On a Standard machine, a start refused because
//     the attempt's execution closed restarts it as the next attempt;
//   - one still pending-start AttemptBound past that, or a terminating one with no change
//     (UpdatedAt, its newest outcome) for AttemptBound, longer than an alive attempt takes,
//     is restarted as the next attempt (RestartOperation, conditioned on the state and attempt
//     read), at most MaxRestarts times; past that it fails with a reason;
//   - a terminating operation whose VMs are all final and that has not changed for
//     ReportAfter (its workflow's Report step was cut off, failed, or never came: a VM left
//     to another run's claim on the last round) gets its report and its end, by the same
//     Announcer.Report as the workflow's, under the attempt's report claim: once, even with
//     two reconcilers or a late Report step at once;
//   - a terminating operation past StuckAfter since it began is reported;
//   - a failed operation that still holds VMs (their termination failed, so they stay
//     terminating and keep their units) HeldAfter after it failed is reported, until a
//     re-drive or a force-end lets them go.
//
// Pending-start operations are drained: the run pages through all of them, oldest first, and
// starts those due at StartRate, until none is left or DrainFor is spent, so a burst's
// throttled starts are made good at the rate Step Functions allows rather than a hundred a
// minute. Terminating and failed operations are read oldest first, at most Batch per state
// and run. None stays in those states for long (restarts are bounded), so old records cannot
// starve newer ones.
type Reconciler struct {
	Store    TerminationStore
	Workflow WorkflowInspector
	// StartAfter: an operation younger than this (since it was created or re-driven, or its
	// grace ended) may still be started by its API call or its scheduled step; older ones are
	// started here.
	StartAfter time.Duration
	// ReportAfter: a terminating operation whose VMs are all final and that has not changed
	// for this long (default DefaultReportAfter) is reported and ended here.
	ReportAfter time.Duration
	// AttemptBound is longer than a whole attempt can take alive (default
	// DefaultAttemptBound): an operation pending-start this long past StartAfter's start, or
	// terminating without a change for this long, is restarted as the next attempt.
	AttemptBound time.Duration
	// StuckAfter: a terminating operation older than this is reported as stuck.
	StuckAfter time.Duration
	// HeldAfter: a failed operation that still holds VMs this long after it failed is
	// reported as held (default DefaultHeldAfter).
	HeldAfter time.Duration
	// MaxRestarts bounds the restarts of an operation whose attempts keep making no progress
	// (default 3).
	MaxRestarts int
	// Batch bounds the terminating and failed operations handled per run, and the reports a
	// run publishes for operations whose run was cut off (default 100).
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
	// Claims, if set, makes each report go out once (the attempt's report claim, shared with
	// the workflow's report step).
	Claims ReportClaims
}

// ReconcileReport says what a run did.
type ReconcileReport struct {
	Started     []string // operations whose attempt this run started (again, or after a restart)
	Restarted   []string // of those, the ones restarted as the next attempt (no progress)
	StartFailed []string // operations whose read, start or restart failed (retried next run)
	Ended       []string // terminating operations whose outcomes were all recorded, ended here
	Exhausted   []Operation
	Stuck       []Operation
	// Held are failed operations past HeldAfter that still hold VMs (Held.VMIDs: those VMs),
	// oldest first, at most Batch.
	Held []Operation
	// PublishFailed are operations due to be ended whose report could not be published:
	// left as they were, for the next run.
	PublishFailed []string
	// Reported are terminating operations with every VM final whose report their workflow
	// left out, published here (and then ended: Ended).
	Reported []string
	// DrainCut: the run's time ran out before it had tried every pending-start operation
	// due; the next run goes on from the oldest.
	DrainCut bool
}

// DefaultAttemptBound is longer than an alive attempt takes: 5 rounds of at most 60 s (the
// terminate-node timeout) each, with the retry waits and the platform retries of a task.
const DefaultAttemptBound = 10 * time.Minute

// DefaultReportAfter is how long a terminating operation whose VMs are all final is left to
// its workflow's Report step (which runs seconds after the last round) before the reconciler
// reports and ends it.
const DefaultReportAfter = 2 * time.Minute

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
	rep.Reported = append(rep.Reported, o.Reported...)
	rep.DrainCut = rep.DrainCut || o.DrainCut
}

// Run makes one pass. A listing that fails ends its own part of the pass, not the others:
// the error returned joins theirs, and the report still says what the pass did (a restart
// made before a later listing failed is reported, and alarmed on, all the same).
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
	errs := []error{r.drainPending(ctx, now, report), r.reconcileTerminating(ctx, now, batch, report)}
	errs = append(errs, r.reportHeld(ctx, now, batch, report))
	return report, errors.Join(errs...)
}

// reconcileTerminating handles the terminating operations that entered the state before
// StartAfter, oldest first, at most batch.
func (r *Reconciler) reconcileTerminating(ctx context.Context, now time.Time, batch int, report *ReconcileReport) error {
	ops, _, err := r.Store.OperationsInState(ctx, OpTerminating, now.Add(-r.StartAfter), "", batch)
	if err != nil {
		return fmt.Errorf("list %s operations: %w", OpTerminating, err)
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
	return nil
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
		if now.Sub(op.LastChange()) < orDefault(r.ReportAfter, DefaultReportAfter) {
			return nil // its Report step is due
		}
		res, err := r.announcer(now).report(ctx, op, op.CurrentAttempt())
		if res.publishFailed {
			report.PublishFailed = append(report.PublishFailed, op.ID)
		}
		if err != nil {
			return err
		}
		if res.ended {
			r.logger().WarnContext(ctx, "reclaim operation reported and ended by the reconciler (its Report step left it out)",
				"reclaim_id", op.ID, "node", op.NodeID, "state", op.EndState(), "attempt", op.CurrentAttempt(),
				"idle_s", int(now.Sub(op.LastChange()).Seconds()))
			report.Reported = append(report.Reported, op.ID)
			report.Ended = append(report.Ended, op.ID)
		}
		return nil
	}
	// No run of this attempt has changed it for longer than an alive attempt takes: its
	// scheduled round was lost, its run died, or a VM's claim holder died on the last round.
	last := op.LastChange()
	if idle := now.Sub(last); idle >= r.attemptBound() {
		why := fmt.Sprintf("attempt %d made no change for %s", op.CurrentAttempt(), idle.Round(time.Second))
		return r.restart(ctx, op, why, now, report, r.Workflow.Start)
	}
	// Alive: its rounds will end it. Report it if that takes too long (counted from when this
	// attempt began terminating: a re-driven operation may be old).
	since := op.UpdatedAt
	if since.IsZero() {
		since = op.CreatedAt
	}
	if now.Sub(since) >= r.StuckAfter {
		r.logger().ErrorContext(ctx, "reclaim operation stuck terminating", "reclaim_id", op.ID, "node", op.NodeID,
			"execution_arn", op.ExecutionARN, "vms_waiting", op.Unfinished(), "age_s", int(now.Sub(since).Seconds()),
			"last_change", last)
		report.Stuck = append(report.Stuck, op)
	}
	return nil
}

// LastChange is when a run of the operation's attempt last wrote to it: its last update
// (its begin, for a terminating one) or its newest outcome, whichever is later. Rounds write
// outcome items, not the operation item; a round whose VMs all failed again writes neither.
func (o Operation) LastChange() time.Time {
	last := o.UpdatedAt
	if last.IsZero() {
		last = o.CreatedAt
	}
	for _, out := range o.Outcomes {
		if out.At.After(last) {
			last = out.At
		}
	}
	return last
}

// pendingSince is when a pending-start operation's first step is due to have begun it: the
// end of its grace, or when it entered the state (created, restarted or re-driven), whichever
// is later.
func (o Operation) pendingSince() time.Time {
	since := o.UpdatedAt
	if since.IsZero() {
		since = o.CreatedAt
	}
	if o.TerminateAfter.After(since) {
		since = o.TerminateAfter
	}
	return since
}

func (r *Reconciler) attemptBound() time.Duration {
	return orDefault(r.AttemptBound, DefaultAttemptBound)
}

// restart runs an operation whose attempt made no progress (why says how) as its next
// attempt, started by start, or fails it once the restarts are spent. The attempt is moved on
// with a condition on the state and attempt read, so two reconcilers cannot both restart it,
// and the old attempt's late steps become no-ops.
func (r *Reconciler) restart(ctx context.Context, op Operation, why string, now time.Time, report *ReconcileReport,
	start func(context.Context, Operation) error) error {
	maxRestarts := r.MaxRestarts
	if maxRestarts <= 0 {
		maxRestarts = 3
	}
	if op.Restarts >= maxRestarts {
		reason := fmt.Sprintf("termination workflow made no progress %d times (last: %s)", op.Restarts+1, why)
		failed := op
		failed.State, failed.Reason, failed.UpdatedAt = OpFailed, reason, now
		if !r.reported(ctx, failed, now, report) {
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
		// attempt is due, and a second start of it is a duplicate delivery, which is harmless.
		err = nil
	}
	if err != nil {
		return fmt.Errorf("restart operation %s: %w", op.ID, err)
	}
	prev := ExecutionName(op)
	op.State, op.Attempt, op.Restarts, op.UpdatedAt = OpPendingStart, next, op.Restarts+1, now
	r.logger().WarnContext(ctx, "restarting termination workflow", "reclaim_id", op.ID, "node", op.NodeID,
		"previous", prev, "why", why, "execution", ExecutionName(op), "restarts", op.Restarts)
	report.Restarted = append(report.Restarted, op.ID)
	// A failed start leaves it pending-start at the new attempt: a later run starts it.
	if err := start(ctx, op); err != nil {
		return fmt.Errorf("start execution %s: %w", ExecutionName(op), err)
	}
	report.Started = append(report.Started, op.ID)
	return nil
}

// announcer is the Announcer the reconciler reports through: the workflow's Report step's,
// on the reconciler's store, bus and clock.
func (r *Reconciler) announcer(now time.Time) *Announcer {
	return &Announcer{Store: r.Store, Publisher: r.Publisher, Claims: r.Claims, Metrics: r.Metrics, Logger: r.Logger,
		Now: func() time.Time { return now }}
}

// reported publishes the report of an operation about to be failed as failed says, and
// reports whether the fail may be written: with no Publisher, or once the report is
// published. The report goes first because its run is gone; the fail write then marks it
// published. With Claims it goes out under the attempt's report claim, so that a late Report
// step or a second reconciler does not publish it at once too; a claim held by another run
// leaves the operation for the next run.
func (r *Reconciler) reported(ctx context.Context, failed Operation, now time.Time, report *ReconcileReport) bool {
	if r.Publisher == nil {
		return true
	}
	n, err := r.announcer(now).publishOnce(ctx, failed, now)
	if err != nil {
		r.logger().ErrorContext(ctx, "operation report not published; its end is left for the next run",
			"reclaim_id", failed.ID, "node", failed.NodeID, "state", failed.State, "err", err)
		report.PublishFailed = append(report.PublishFailed, failed.ID)
		return false
	}
	return n > 0
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
