package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Agent terminates VMs through the agent of their node.
type Agent interface {
	// Terminate ends the VM; alreadyGone reports that the agent no longer had it. Errors that
	// a later attempt may not repeat implement Retryable() bool returning true.
	// The node names the agent (its AgentEndpoint) and the key the call is signed with (its ID).
	Terminate(ctx context.Context, node Node, vmID string) (alreadyGone bool, err error)
}

// Workflow starts the termination workflow of a committed reclaim operation: the execution
// ExecutionName(op), for the VMs op.Unfinished(). Starting the same attempt twice must not
// run it twice (executions are named, and a name is never reused).
type Workflow interface {
	Start(ctx context.Context, op Operation) error
}

// WorkflowInspector is the Workflow the reconciler starts through: it needs to tell a start
// refused for the account's start rate from one that took, and (on a Standard machine) an
// execution of the name that closed from one that runs. It never asks what became of a run:
// an Express run cannot be described, so the reconciler reads liveness from the store (see
// Reconciler).
type WorkflowInspector interface {
	Workflow
	// StartChecked starts the execution ExecutionName(op) like Start, but answers a start
	// refused for the account's start rate (after the SDK's retries) with ErrThrottled, and
	// an execution of that name that refused the start with ErrExecutionExists: on a Standard
	// machine, one that closed (a repeated start of a running one is a success). An Express
	// machine never answers it: a second start of a name runs again.
	StartChecked(ctx context.Context, op Operation) error
}

// ErrExecutionExists is returned (wrapped) by StartChecked when an execution of the name
// exists and did not take the start: it closed, and the name is never reused.
var ErrExecutionExists = errors.New("an execution of this name exists")

// CurrentAttempt is the operation's workflow attempt, counting from 1.
func (o Operation) CurrentAttempt() int { return max(1, o.Attempt) }

// ExecutionName names the execution of the operation's current attempt: the operation id for
// the first, "<id>-<n>" for the n-th. A Standard machine never reuses a name (90 days), so an
// attempt runs there at most once; an Express machine runs a name again, which the guards of
// every effect (claims, conditional writes) make harmless.
func ExecutionName(op Operation) string {
	if a := op.CurrentAttempt(); a > 1 {
		return fmt.Sprintf("%s-%d", op.ID, a)
	}
	return op.ID
}

// Final returns the VM's outcome if it is final for the operation's current attempt: a VM
// terminated or already gone stays so; a failure recorded by an earlier attempt is not final
// for a re-drive, which runs the VM again.
func (o Operation) Final(vmID string) (VMOutcome, bool) {
	out, ok := o.Outcomes[vmID]
	if !ok || out.Outcome == OutcomeFailed && max(1, out.Attempt) < o.CurrentAttempt() {
		return VMOutcome{}, false
	}
	return out, true
}

// Unfinished lists the operation's VMs without an outcome final for its current attempt: the
// ones its execution has to terminate.
func (o Operation) Unfinished() []string {
	out := []string{}
	for _, vm := range o.VMIDs {
		if _, ok := o.Final(vm); !ok {
			out = append(out, vm)
		}
	}
	return out
}

// TerminationStore is what the termination side reads and writes.
type TerminationStore interface {
	LoadNode(ctx context.Context, nodeID, idempotencyScope string) (*NodeState, error)
	// GetOperation returns the operation, or an *Error with CodeNotFound.
	GetOperation(ctx context.Context, nodeID, opID string) (*Operation, error)
	// BeginTermination moves a pending-start operation to terminating under the execution.
	// It returns ErrConflict when the operation is no longer pending-start at op's attempt.
	BeginTermination(ctx context.Context, op Operation, executionARN string, now time.Time) error
	// MarkTerminated moves the VM from terminating to terminated, conditioned on it being
	// terminated for this operation; a VM this operation already terminated is no error.
	MarkTerminated(ctx context.Context, op Operation, vmID string, now time.Time) error
	// RecordOutcome stores a VM's final outcome (out.Attempt says whose) as an item of its
	// own. An outcome recorded before is kept (no error), except that a success replaces a
	// failure, and a failure replaces an older attempt's failure. Any other failure to write
	// is returned: an outcome is never dropped.
	RecordOutcome(ctx context.Context, op Operation, vmID string, out VMOutcome) error
	// EndOperation moves an operation terminating at op's attempt to its end state;
	// ErrConflict if it is no longer so (another writer ended it first). A completed
	// operation leaves the byState listing (OperationsInState never lists it).
	EndOperation(ctx context.Context, op Operation, state OperationState, now time.Time) error
	// RestartOperation moves an operation still in op.State at op's attempt to pending-start
	// at the next attempt, with one more restart; ErrConflict if it changed since read.
	RestartOperation(ctx context.Context, op Operation, now time.Time) error
	// FailOperation ends an operation still in op.State at op's attempt as failed with the
	// reason; ErrConflict if it changed since read.
	FailOperation(ctx context.Context, op Operation, reason string, now time.Time) error
	// HoldOperation removes the expiry of an operation still failed at op's attempt and of
	// its failed VMs' outcomes: a failed operation holds those VMs terminating, and must stay
	// readable and re-drivable until they are let go. ErrConflict if it changed since read.
	HoldOperation(ctx context.Context, op Operation) error
	// OperationsInState lists operations in a state that entered it (were created, or
	// re-driven) before the time, oldest first, at most limit, without their outcomes; after
	// a cursor it returned ("": from the oldest). It returns the cursor of the next page, ""
	// when none is left.
	OperationsInState(ctx context.Context, state OperationState, before time.Time, after string, limit int) ([]Operation, string, error)
	// ClaimTermination takes the VM's terminate claim for holder until the time: it succeeds
	// when the VM has no claim, an expired one (until before now) or holder's own; ErrConflict
	// when another holder's claim is live. Two runs of one step at once (a duplicate
	// delivery) thereby call the VM's agent once. It answers what the claim carried (see
	// TerminateClaim).
	ClaimTermination(ctx context.Context, op Operation, vmID, holder string, now, until time.Time) (TerminateClaim, error)
	// MarkClaimAnswered records the agent's answer (OutcomeTerminated or OutcomeAlreadyGone)
	// on holder's claim on the VM, where every later holder reads it; ErrConflict when the
	// claim is no longer holder's.
	MarkClaimAnswered(ctx context.Context, op Operation, vmID, holder string, answer Outcome) error
	// ReleaseTermination drops holder's claim on the VM (none, or another's: no error).
	ReleaseTermination(ctx context.Context, op Operation, vmID, holder string) error
}

// TerminateClaim is what taking a VM's terminate claim found on it.
type TerminateClaim struct {
	// TookOver: the claim replaced another holder's lapsed one, which may have recorded an
	// outcome since the caller read the operation.
	TookOver bool
	// Answered is the agent's answer a holder got and marked on the claim because it could
	// not record the outcome ("" if none): the VM is gone, and its agent is not called again.
	Answered Outcome
}

// TerminationTask is one round of one node's terminations within a workflow execution.
type TerminationTask struct {
	ReclaimID    string
	NodeID       string
	VMIDs        []string // the VMs still to terminate
	ExecutionARN string
	// Attempt is the operation's attempt the execution runs (0 or 1: the first). A task of
	// an older attempt than the operation's does nothing.
	Attempt   int
	Round     int // 0-based
	MaxRounds int
}

// TerminationReport is the outcome of a round and the next round's task.
type TerminationReport struct {
	Next        TerminationTask // VMIDs: those to retry; Round: the next round
	Done        bool            // nothing left to retry on this node
	Terminated  []string
	AlreadyGone []string
	Failed      []VMFailure // VMs that failed this round (final on the last round)
	// Busy are VMs another run held the terminate claim of (a duplicate of this step, or a
	// late run of an earlier one): not called, not failed. Retried in the next round; on the
	// last round left to their holder, which records them.
	Busy []string
}

// VMFailure is a VM whose termination failed.
type VMFailure struct {
	VMID  string
	Error string
	Final bool
}

// Terminator carries out a node's share of a reclaim operation: it asks the node's agent to
// terminate each VM, records each VM as terminated (which frees its units) and its outcome.
// It does not end the operation: the workflow's Report step does, after publishing the
// report (Announcer.Report). Running it again for the same task does no harm.
type Terminator struct {
	Store TerminationStore
	Agent Agent
	// Concurrency bounds the agent calls in flight per node (default 8).
	Concurrency int
	Now         func() time.Time
	Logger      *slog.Logger
	// ClaimFor is how long a VM's terminate claim lasts when the context has no deadline
	// (default DefaultClaimFor). With one (a Lambda invocation's), the claim lasts until the
	// deadline plus ClaimMargin: past it the holder can no longer be calling the agent.
	ClaimFor time.Duration
	// Record is how the writes that record an agent's answer are retried within the
	// invocation (Base and Cap shape the waits, Margin is kept before the deadline for the
	// claim's mark); RecordTries bounds them (defaults DefaultRecordRetry and
	// DefaultRecordTries).
	Record      RetryPolicy
	RecordTries int
}

// Defaults of Terminator.Record and RecordTries: up to 10 tries, the waits doubling from
// 100 ms to at most 3 s (about 8 s in all on average, to outlast a partition's throttling),
// none starting within 5 s of the invocation's deadline.
var DefaultRecordRetry = RetryPolicy{Base: 100 * time.Millisecond, Cap: 3 * time.Second, Margin: 5 * time.Second}

const DefaultRecordTries = 10

// Terminate claims' leases (see Terminator.ClaimFor).
const (
	// DefaultClaimFor covers terminate-node's 60 s timeout and the margin.
	DefaultClaimFor = 90 * time.Second
	// ClaimMargin allows for clocks that disagree between the holder and a later taker.
	ClaimMargin = 30 * time.Second
)

// claimUntil is when a claim taken now by a run with ctx lapses.
func (t *Terminator) claimUntil(ctx context.Context, now time.Time) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d.UTC().Add(ClaimMargin)
	}
	if t.ClaimFor > 0 {
		return now.Add(t.ClaimFor)
	}
	return now.Add(DefaultClaimFor)
}

func (t *Terminator) now() time.Time {
	if t.Now != nil {
		return t.Now().UTC()
	}
	return time.Now().UTC()
}

func (t *Terminator) logger() *slog.Logger {
	if t.Logger != nil {
		return t.Logger
	}
	return slog.Default()
}

// Run carries out one round of a node's terminations. Business failures (an agent that
// refuses or is unreachable) are reported, not returned: the workflow retries them in a
// later round. Returned errors are faults the platform should retry (e.g. the store failing).
func (t *Terminator) Run(ctx context.Context, task TerminationTask) (*TerminationReport, error) {
	op, err := t.Store.GetOperation(ctx, task.NodeID, task.ReclaimID)
	if err != nil {
		return nil, fmt.Errorf("read operation %s: %w", task.ReclaimID, err)
	}
	report := &TerminationReport{Next: task}
	report.Next.Round = task.Round + 1
	report.Next.VMIDs = []string{}
	if attempt := max(1, task.Attempt); attempt != op.CurrentAttempt() {
		// A late branch of an execution the operation has moved past (a restart or a
		// re-drive runs its VMs now): acting could record a stale failure or end it early.
		t.logger().WarnContext(ctx, "termination task of an older attempt ignored", "reclaim_id", op.ID,
			"task_attempt", attempt, "attempt", op.CurrentAttempt())
		report.Done = true
		return report, nil
	}
	switch op.State {
	case OpCompleted, OpFailed:
		report.Done = true // a re-run of a finished operation: nothing to do
		return report, nil
	case OpPendingStart:
		err := t.Store.BeginTermination(ctx, *op, task.ExecutionARN, t.now())
		if err != nil && !errors.Is(err, ErrConflict) { // conflict: another node's branch began it
			return nil, fmt.Errorf("begin operation %s: %w", op.ID, err)
		}
		op.State = OpTerminating
	}
	st, err := t.Store.LoadNode(ctx, task.NodeID, "")
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", task.NodeID, err)
	}
	last := report.Next.Round >= task.MaxRounds
	results := t.terminateAll(ctx, st, op, task.VMIDs)

	for _, r := range results {
		switch {
		case r.busy:
			report.Busy = append(report.Busy, r.vmID)
			if !last {
				report.Next.VMIDs = append(report.Next.VMIDs, r.vmID)
			}
			continue
		case r.err != nil && !last && retryable(r.err):
			report.Next.VMIDs = append(report.Next.VMIDs, r.vmID)
			report.Failed = append(report.Failed, VMFailure{VMID: r.vmID, Error: r.err.Error()})
			continue
		case r.err != nil:
			report.Failed = append(report.Failed, VMFailure{VMID: r.vmID, Error: r.err.Error(), Final: true})
			_, recorded := op.Final(r.vmID)
			if !recorded && slices.Contains(op.VMIDs, r.vmID) {
				out := VMOutcome{Outcome: OutcomeFailed, Error: r.err.Error(), At: t.now(), Attempt: op.CurrentAttempt()}
				if err := t.Store.RecordOutcome(ctx, *op, r.vmID, out); err != nil {
					return nil, fmt.Errorf("record failure of VM %s: %w", r.vmID, err)
				}
			}
		case r.alreadyGone:
			report.AlreadyGone = append(report.AlreadyGone, r.vmID)
		default:
			report.Terminated = append(report.Terminated, r.vmID)
		}
		if r.storeErr != nil {
			return nil, r.storeErr
		}
	}
	// Done: every VM of this node has an outcome (or is left to its claim's holder). The
	// workflow's Report step then reads every outcome item and, once all are final, ends the
	// operation after publishing its report; a round never writes the end.
	report.Done = len(report.Next.VMIDs) == 0
	return report, nil
}

type vmResult struct {
	vmID        string
	busy        bool // another run holds its terminate claim
	alreadyGone bool
	err         error // the agent's failure
	storeErr    error // a failure to record the outcome
}

// terminateAll terminates the VMs with bounded concurrency and records each final outcome.
// Only a VM whose own record is terminating for the operation is sent the kill: the
// operation's list alone is not trusted (see notTerminating).
func (t *Terminator) terminateAll(ctx context.Context, st *NodeState, op *Operation, vmIDs []string) []vmResult {
	limit := t.Concurrency
	if limit <= 0 {
		limit = 8
	}
	live := make(map[string]VM, len(st.VMs))
	for _, vm := range st.VMs {
		live[vm.ID] = vm
	}
	results := make([]vmResult, len(vmIDs))
	holder := NewID() // this run's: a duplicate run of the step holds another
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i, vmID := range vmIDs {
		results[i].vmID = vmID
		if !slices.Contains(op.VMIDs, vmID) {
			results[i].err = Errorf(CodeInvalidRequest, "VM %s is not part of operation %s", vmID, op.ID)
			continue
		}
		if out, ok := op.Final(vmID); ok { // recorded by an earlier run of this attempt, or a success
			results[i].alreadyGone = out.Outcome == OutcomeAlreadyGone
			if out.Outcome == OutcomeFailed {
				results[i].err = errors.New(out.Error)
			}
			continue
		}
		if vm, ok := live[vmID]; !ok || vm.State != VMTerminating || vm.ReclaimID != op.ID {
			results[i] = t.notTerminating(ctx, op, vmID)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = t.claimAndTerminate(ctx, st.Node, op, vmID, holder)
		}()
	}
	wg.Wait()
	return results
}

// notTerminating answers a VM the operation lists whose live record is not terminating for
// the operation, without calling its agent: a forged or stale operation item could list any
// VM, and the commit that makes a VM the operation's marks the VM's own record. A VM the
// operation already terminated (an earlier run moved it to the history, then lost its
// outcome write) is recorded as terminated; any other is a final failure of that VM.
func (t *Terminator) notTerminating(ctx context.Context, op *Operation, vmID string) vmResult {
	now := t.now()
	err := t.Store.MarkTerminated(ctx, *op, vmID, now)
	if errors.Is(err, ErrConflict) {
		t.logger().WarnContext(ctx, "VM listed by the operation is not terminating for it; not terminated", "reclaim_id", op.ID, "vm", vmID, "err", err)
		return vmResult{vmID: vmID, err: Errorf(CodeInvalidTransition, "VM %s is not terminating for operation %s; not terminated", vmID, op.ID)}
	}
	if err != nil {
		return vmResult{vmID: vmID, storeErr: fmt.Errorf("read VM %s: %w", vmID, err)}
	}
	out := VMOutcome{Outcome: OutcomeTerminated, At: now, Attempt: op.CurrentAttempt()}
	if err := t.Store.RecordOutcome(ctx, *op, vmID, out); err != nil {
		return vmResult{vmID: vmID, storeErr: fmt.Errorf("record outcome of VM %s: %w", vmID, err)}
	}
	return vmResult{vmID: vmID}
}

// claimAndTerminate terminates the VM under its terminate claim: only the run that holds the
// claim calls the agent. A failed call releases the claim, so that the next round or the
// task's retry (or a re-drive) may call again at once. Once the agent has answered that the
// VM is gone the claim is never released (a run that took it would call the agent a second
// time): the answer is recorded (see record), and a later holder that finds the answer on
// the claim records it without calling.
func (t *Terminator) claimAndTerminate(ctx context.Context, node Node, op *Operation, vmID, holder string) vmResult {
	now := t.now()
	claim, err := t.Store.ClaimTermination(ctx, *op, vmID, holder, now, t.claimUntil(ctx, now))
	if errors.Is(err, ErrConflict) {
		t.logger().InfoContext(ctx, "VM termination claimed by another run", "reclaim_id", op.ID, "vm", vmID)
		return vmResult{vmID: vmID, busy: true}
	}
	if err != nil {
		// The claim may have landed (an answer lost, then a retry refused): let it go, or the
		// task's retry would find the VM busy for the whole lease. Nobody has called the agent
		// under it.
		t.release(ctx, op, vmID, holder)
		return vmResult{vmID: vmID, storeErr: fmt.Errorf("claim termination of VM %s: %w", vmID, err)}
	}
	if claim.Answered == OutcomeTerminated || claim.Answered == OutcomeAlreadyGone {
		t.logger().InfoContext(ctx, "VM's agent answered an earlier run; recording it", "reclaim_id", op.ID, "vm", vmID, "answer", claim.Answered)
		return t.record(ctx, op, vmID, holder, claim.Answered == OutcomeAlreadyGone)
	}
	if claim.TookOver {
		// The lapsed holder may have finished after this run read the operation: read its
		// outcome again rather than call the agent a second time.
		fresh, err := t.Store.GetOperation(ctx, op.NodeID, op.ID)
		if err != nil {
			return vmResult{vmID: vmID, storeErr: fmt.Errorf("read operation %s: %w", op.ID, err)}
		}
		if out, ok := fresh.Final(vmID); ok && out.Outcome != OutcomeFailed {
			return vmResult{vmID: vmID, alreadyGone: out.Outcome == OutcomeAlreadyGone}
		}
	}
	gone, err := t.Agent.Terminate(ctx, node, vmID)
	if err != nil {
		t.logger().WarnContext(ctx, "VM termination failed", "reclaim_id", op.ID, "vm", vmID, "err", err, "retryable", retryable(err))
		t.release(ctx, op, vmID, holder)
		return vmResult{vmID: vmID, err: err}
	}
	return t.record(ctx, op, vmID, holder, gone)
}

// release drops the run's claim on the VM. A failure is not the round's: the claim lapses on
// its own, and until then the VM is busy.
func (t *Terminator) release(ctx context.Context, op *Operation, vmID, holder string) {
	if err := t.Store.ReleaseTermination(ctx, *op, vmID, holder); err != nil {
		t.logger().WarnContext(ctx, "release of a VM's termination claim failed", "reclaim_id", op.ID, "vm", vmID, "err", err)
	}
}

// record records the agent's answer that the VM is gone: marks it terminated and records its
// outcome, both safe to repeat, retrying them within the invocation (DynamoDB throttling the
// operation's partition, or an answer lost). If they still fail, it marks the answer on the
// claim, which it keeps: the VM stays busy until the claim lapses, and whoever takes it then
// records the answer without calling the agent. A failure is left to Run.
func (t *Terminator) record(ctx context.Context, op *Operation, vmID, holder string, gone bool) vmResult {
	r := vmResult{vmID: vmID, alreadyGone: gone}
	out := VMOutcome{Outcome: OutcomeTerminated, Attempt: op.CurrentAttempt()}
	if gone {
		out.Outcome = OutcomeAlreadyGone
	}
	policy := t.Record
	policy.Base = cmp.Or(policy.Base, DefaultRecordRetry.Base)
	policy.Cap = cmp.Or(policy.Cap, DefaultRecordRetry.Cap)
	policy.Margin = cmp.Or(policy.Margin, DefaultRecordRetry.Margin)
	tries := cmp.Or(t.RecordTries, DefaultRecordTries)
	var err error
	for try := 1; ; try++ {
		out.At = t.now()
		if err = t.Store.MarkTerminated(ctx, *op, vmID, out.At); errors.Is(err, ErrConflict) {
			// The VM's record is in a state no retry changes (not terminating for this
			// operation): a final failure of this VM, for an operator, rather than a fault that
			// would fail every retry and restart of the whole operation.
			r.alreadyGone, r.err = false, fmt.Errorf("terminated on its node, but its record cannot be marked terminated: %w", err)
			return r
		}
		if err == nil {
			if err = t.Store.RecordOutcome(ctx, *op, vmID, out); err == nil {
				return r
			}
			err = fmt.Errorf("record outcome of VM %s: %w", vmID, err)
		} else {
			err = fmt.Errorf("mark VM %s terminated: %w", vmID, err)
		}
		wait := policy.Wait(try)
		if try >= tries || !policy.timeFor(ctx, wait) || Sleep(ctx, wait) != nil {
			break
		}
		t.logger().InfoContext(ctx, "recording a terminated VM failed; trying again", "reclaim_id", op.ID, "vm", vmID, "try", try, "err", err)
	}
	r.storeErr = err
	// The margin left before the deadline is this write's: the claim's partition is the
	// outcome's, so it may be throttled too, and then a run after the lease calls again.
	for try := 1; ; try++ {
		merr := t.Store.MarkClaimAnswered(ctx, *op, vmID, holder, out.Outcome)
		if merr == nil {
			t.logger().WarnContext(ctx, "VM terminated but not recorded; its claim is kept with the agent's answer", "reclaim_id", op.ID, "vm", vmID, "err", err)
			break
		}
		if try >= 3 || errors.Is(merr, ErrConflict) || Sleep(ctx, policy.Wait(try)) != nil {
			t.logger().ErrorContext(ctx, "the agent's answer could not be kept: a run after the claim lapses calls the agent again",
				"reclaim_id", op.ID, "vm", vmID, "err", merr)
			break
		}
	}
	return r
}

// retryable reports whether an agent failure may pass on a later attempt.
func retryable(err error) bool {
	var r interface{ Retryable() bool }
	return errors.As(err, &r) && r.Retryable()
}
