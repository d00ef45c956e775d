package capacity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// EvictionNotice tells a VM's agent, before the grace period of a reclaim ends, that the VM
// will be terminated: the guest may checkpoint until TerminateAfter.
type EvictionNotice struct {
	VMID, ReclaimID string
	TerminateAfter  time.Time
	Reason          string // NoticeReasonReclaim
}

// NoticeReasonReclaim is the reason code of a reclaim's notices: the owner takes capacity back.
const NoticeReasonReclaim = "reclaim"

// Errors a NoticeAgent returns for answers that are no delivery but no fault either.
var (
	ErrNoticeUnsupported = errors.New("agent does not implement eviction notices")
	ErrNoticeUnknownVM   = errors.New("node has no such VM")
)

// NoticeAgent sends eviction notices through the agent of the VM's node.
type NoticeAgent interface {
	Notice(ctx context.Context, node Node, n EvictionNotice) error
}

// NoticeState is what became of a VM's eviction notice.
type NoticeState string

const (
	NoticeDelivered   NoticeState = "delivered"
	NoticeUnsupported NoticeState = "unsupported" // the agent has no notice call
	NoticeUnknownVM   NoticeState = "unknown-vm"  // the agent does not know the VM
	NoticeFailed      NoticeState = "failed"      // not delivered before the grace ended
)

// VMNotice is the recorded fate of one VM's eviction notice.
type VMNotice struct {
	State          NoticeState
	Error          string
	At             time.Time
	TerminateAfter time.Time
}

// NoticeStore is what the notifier reads and writes.
type NoticeStore interface {
	LoadNode(ctx context.Context, nodeID, idempotencyScope string) (*NodeState, error)
	GetOperation(ctx context.Context, nodeID, opID string) (*Operation, error)
	// RecordNotice stores a VM's notice outcome as an item of its own, replacing an earlier
	// one of the same VM unless that one was delivered.
	RecordNotice(ctx context.Context, op Operation, vmID string, n VMNotice) error
}

// NoticeTask asks for the notices of one attempt of a reclaim operation.
type NoticeTask struct {
	ReclaimID, NodeID string
	Attempt           int
}

// EvictionNotifier sends a reclaim operation's eviction notices to its node's agent, once its
// commit is known and before its grace ends. It never makes the termination wait: every call
// is cut off at the operation's TerminateAfter (and at Budget), and what was not delivered is
// recorded as the notice's outcome.
type EvictionNotifier struct {
	Store NoticeStore
	Agent NoticeAgent
	// Concurrency bounds the agent calls in flight (default 8).
	Concurrency int
	// Budget bounds the whole run when the grace is longer (0: no bound but the grace).
	Budget time.Duration
	Now    func() time.Time
	Logger *slog.Logger
}

// recordTimeout bounds the write of an outcome after the notices' own deadline has passed.
const recordTimeout = 5 * time.Second

// Run sends the notices of the task's operation and records each outcome; it returns them by
// VM (none when there is no grace left, or the task's attempt is not the operation's). A
// returned error is a fault of the store.
func (e *EvictionNotifier) Run(ctx context.Context, task NoticeTask) (map[string]VMNotice, error) {
	op, err := e.Store.GetOperation(ctx, task.NodeID, task.ReclaimID)
	if err != nil {
		return nil, fmt.Errorf("read operation %s: %w", task.ReclaimID, err)
	}
	now := e.now()
	if max(1, task.Attempt) != op.CurrentAttempt() || op.State == OpCompleted || op.State == OpFailed ||
		op.TerminateAfter.IsZero() || !now.Before(op.TerminateAfter) {
		return map[string]VMNotice{}, nil // no grace, or none left: a notice would come too late
	}
	st, err := e.Store.LoadNode(ctx, task.NodeID, "")
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", task.NodeID, err)
	}
	left := op.TerminateAfter.Sub(now)
	if e.Budget > 0 {
		left = min(left, e.Budget)
	}
	sendCtx, cancel := context.WithTimeout(ctx, left)
	defer cancel()

	vms := op.Unfinished()
	outs := make([]VMNotice, len(vms))
	limit := e.Concurrency
	if limit <= 0 {
		limit = 8
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i, vmID := range vms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			outs[i] = e.notify(sendCtx, st.Node, *op, vmID)
		}()
	}
	wg.Wait()

	// The records outlive the notices' deadline: an undelivered notice must be recorded too.
	recCtx, cancelRec := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancelRec()
	result := make(map[string]VMNotice, len(vms))
	for i, vmID := range vms {
		if err := e.Store.RecordNotice(recCtx, *op, vmID, outs[i]); err != nil {
			return nil, fmt.Errorf("record notice of VM %s: %w", vmID, err)
		}
		result[vmID] = outs[i]
	}
	return result, nil
}

// notify sends one notice and says what became of it.
func (e *EvictionNotifier) notify(ctx context.Context, node Node, op Operation, vmID string) VMNotice {
	err := e.Agent.Notice(ctx, node, EvictionNotice{
		VMID: vmID, ReclaimID: op.ID, TerminateAfter: op.TerminateAfter, Reason: NoticeReasonReclaim,
	})
	n := VMNotice{State: NoticeDelivered, At: e.now(), TerminateAfter: op.TerminateAfter}
	switch {
	case err == nil:
	case errors.Is(err, ErrNoticeUnknownVM):
		n.State = NoticeUnknownVM
	case errors.Is(err, ErrNoticeUnsupported):
		n.State, n.Error = NoticeUnsupported, err.Error()
	default:
		n.State, n.Error = NoticeFailed, err.Error()
		e.logger().WarnContext(ctx, "eviction notice not delivered", "reclaim_id", op.ID, "vm", vmID, "err", err)
	}
	return n
}

func (e *EvictionNotifier) now() time.Time {
	if e.Now != nil {
		return e.Now().UTC()
	}
	return time.Now().UTC()
}

func (e *EvictionNotifier) logger() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.Default()
}
