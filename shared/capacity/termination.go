package capacity

import (
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
	Terminate(ctx context.Context, endpoint, vmID string) (alreadyGone bool, err error)
}

// Workflow starts the termination workflow of a committed reclaim operation. Starting the
// same operation twice must not run it twice (the execution is named by the operation id).
type Workflow interface {
	Start(ctx context.Context, op Operation) error
}

// TerminationStore is what the termination side reads and writes.
type TerminationStore interface {
	LoadNode(ctx context.Context, nodeID, idempotencyScope string) (*NodeState, error)
	// GetOperation returns the operation, or an *Error with CodeNotFound.
	GetOperation(ctx context.Context, nodeID, opID string) (*Operation, error)
	// BeginTermination moves a pending-start operation to terminating under the execution.
	// It returns ErrConflict when the operation is no longer pending-start.
	BeginTermination(ctx context.Context, op Operation, executionARN string, now time.Time) error
	// MarkTerminated moves the VM from terminating to terminated, conditioned on it being
	// terminated for this operation; a VM this operation already terminated is no error.
	MarkTerminated(ctx context.Context, op Operation, vmID string, now time.Time) error
	// RecordOutcome stores a VM's final outcome on the operation, once; recording it again,
	// or after the operation ended, is no error.
	RecordOutcome(ctx context.Context, op Operation, vmID string, out VMOutcome) error
	// EndOperation moves a terminating operation to its end state; ErrConflict if another
	// writer ended it first.
	EndOperation(ctx context.Context, op Operation, state OperationState, now time.Time) error
	// OperationsInState lists operations in a state created before the time, oldest first,
	// without their outcomes.
	OperationsInState(ctx context.Context, state OperationState, createdBefore time.Time, limit int) ([]Operation, error)
}

// TerminationTask is one round of one node's terminations within a workflow execution.
type TerminationTask struct {
	ReclaimID    string
	NodeID       string
	VMIDs        []string // the VMs still to terminate
	ExecutionARN string
	Round        int // 0-based
	MaxRounds    int
}

// TerminationReport is the outcome of a round and the next round's task.
type TerminationReport struct {
	Next        TerminationTask // VMIDs: those to retry; Round: the next round
	Done        bool            // nothing left to retry on this node
	Terminated  []string
	AlreadyGone []string
	Failed      []VMFailure // VMs that failed this round (final on the last round)
}

// VMFailure is a VM whose termination failed.
type VMFailure struct {
	VMID  string
	Error string
	Final bool
}

// Terminator carries out a node's share of a reclaim operation: it asks the node's agent to
// terminate each VM, records each VM as terminated (which frees its units), and ends the
// operation when every VM has an outcome. Running it again for the same task does no harm.
type Terminator struct {
	Store TerminationStore
	Agent Agent
	// Concurrency bounds the agent calls in flight per node (default 8).
	Concurrency int
	Now         func() time.Time
	Logger      *slog.Logger
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
	results := t.terminateAll(ctx, st.Node.AgentEndpoint, op, task.VMIDs)

	for _, r := range results {
		switch {
		case r.err != nil && !last && retryable(r.err):
			report.Next.VMIDs = append(report.Next.VMIDs, r.vmID)
			report.Failed = append(report.Failed, VMFailure{VMID: r.vmID, Error: r.err.Error()})
			continue
		case r.err != nil:
			report.Failed = append(report.Failed, VMFailure{VMID: r.vmID, Error: r.err.Error(), Final: true})
			_, recorded := op.Outcomes[r.vmID]
			if !recorded && slices.Contains(op.VMIDs, r.vmID) {
				out := VMOutcome{Outcome: OutcomeFailed, Error: r.err.Error(), At: t.now()}
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
	report.Done = len(report.Next.VMIDs) == 0
	// Read the operation as all of this round's writes (and any other branch's) left it.
	ended, err := t.Store.GetOperation(ctx, task.NodeID, task.ReclaimID)
	if err != nil {
		return nil, fmt.Errorf("read operation %s: %w", task.ReclaimID, err)
	}
	if ended.State == OpTerminating && ended.Ended() {
		err := t.Store.EndOperation(ctx, *ended, ended.EndState(), t.now())
		if err != nil && !errors.Is(err, ErrConflict) {
			return nil, fmt.Errorf("end operation %s: %w", op.ID, err)
		}
		t.logger().InfoContext(ctx, "reclaim operation ended", "reclaim_id", op.ID, "state", ended.EndState())
	}
	return report, nil
}

type vmResult struct {
	vmID        string
	alreadyGone bool
	err         error // the agent's failure
	storeErr    error // a failure to record the outcome
}

// terminateAll terminates the VMs with bounded concurrency and records each final outcome.
func (t *Terminator) terminateAll(ctx context.Context, endpoint string, op *Operation, vmIDs []string) []vmResult {
	limit := t.Concurrency
	if limit <= 0 {
		limit = 8
	}
	results := make([]vmResult, len(vmIDs))
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i, vmID := range vmIDs {
		results[i].vmID = vmID
		if !slices.Contains(op.VMIDs, vmID) {
			results[i].err = Errorf(CodeInvalidRequest, "VM %s is not part of operation %s", vmID, op.ID)
			continue
		}
		if out, ok := op.Outcomes[vmID]; ok { // recorded by an earlier run
			results[i].alreadyGone = out.Outcome == OutcomeAlreadyGone
			if out.Outcome == OutcomeFailed {
				results[i].err = errors.New(out.Error)
			}
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = t.terminate(ctx, endpoint, op, vmID)
		}()
	}
	wg.Wait()
	return results
}

// terminate terminates one VM and, when the agent confirms it gone, marks it terminated and
// records the outcome. A failure is left to Run, which knows whether it is final.
func (t *Terminator) terminate(ctx context.Context, endpoint string, op *Operation, vmID string) vmResult {
	r := vmResult{vmID: vmID}
	r.alreadyGone, r.err = t.Agent.Terminate(ctx, endpoint, vmID)
	now := t.now()
	out := VMOutcome{Outcome: OutcomeTerminated, At: now}
	switch {
	case r.err != nil:
		t.logger().WarnContext(ctx, "VM termination failed", "reclaim_id", op.ID, "vm", vmID, "err", r.err, "retryable", retryable(r.err))
		return r
	case r.alreadyGone:
		out.Outcome = OutcomeAlreadyGone
	}
	if err := t.Store.MarkTerminated(ctx, *op, vmID, now); err != nil {
		r.storeErr = fmt.Errorf("mark VM %s terminated: %w", vmID, err)
		return r
	}
	r.storeErr = t.Store.RecordOutcome(ctx, *op, vmID, out)
	return r
}

// retryable reports whether an agent failure may pass on a later attempt.
func retryable(err error) bool {
	var r interface{ Retryable() bool }
	return errors.As(err, &r) && r.Retryable()
}
