package capacity

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ActionRetry is the audit action of a re-drive of a reclaim operation.
const ActionRetry = "retry"

// RedriveResult is the outcome of a re-drive.
type RedriveResult struct {
	// Operation as the re-drive left it: pending-start at a new attempt, or unchanged when
	// there was nothing to retry.
	Operation Operation
	// Retried lists the VMs the new attempt terminates; empty when every VM is terminated
	// or already gone (nothing was written or started).
	Retried []string
}

// Redrive runs again the termination of a reclaim operation's VMs that have no outcome of
// terminated or already-gone, as a new attempt (a new execution, ExecutionName). Callers are
// those who may reclaim on the reservation; the operation must have ended (completed or
// failed): while it is pending-start or terminating its workflow still runs, and the answer
// is CodeOperationRunning. Every call past the access check leaves an audit record.
//
// The new attempt is what keeps a re-drive and a late branch of the old execution apart:
// the old branch's tasks carry the old attempt and do nothing, its outcomes cannot replace
// the new attempt's, and only a writer at the new attempt can end the operation.
func (s *Service) Redrive(ctx context.Context, p Principal, nodeID, reservationID, opID string, meta RequestMeta) (*RedriveResult, error) {
	res, err := s.redrive(ctx, p, nodeID, reservationID, opID, meta)
	// Nothing left to retry changes nothing: not an applied re-drive.
	s.recordCall(ctx, CallOutcome{Action: ActionRetry, RequestID: meta.RequestID, Applied: res != nil && len(res.Retried) > 0}, err)
	return res, err
}

func (s *Service) redrive(ctx context.Context, p Principal, nodeID, reservationID, opID string, meta RequestMeta) (*RedriveResult, error) {
	if err := AdmitCapacityCall(p, nodeID, reservationID); err != nil {
		return nil, err
	}
	if !ValidID(opID) {
		return nil, Errorf(CodeNotFound, "reclaim operation not found")
	}
	var unchanged *RedriveResult // nothing to retry: answered with the operation as read
	var noop AuditRecord
	w := writer[NodeState, redriveWrite]{
		kind: "re-drive", subject: "the reclaim operation", logAttrs: []any{"node", nodeID, "reclaim_id", opID},
		read: nodeRead(s.Store.LoadNode, nodeID, ""),
		commit: func(ctx context.Context, c *redriveWrite) error {
			return s.Store.RedriveOperation(ctx, c.op, c.audit, c.audit.Time)
		},
		audit: func(c *redriveWrite) AuditRecord { return c.audit },
		// The answer may have been lost after the write landed: the audit record written with
		// it tells.
		landed: func(ctx context.Context, c *redriveWrite) (bool, error) { return s.landedOn(ctx, c.node, c.audit) },
	}
	landed, err := commitRounds(s, ctx, w, anew(func(st *NodeState, now time.Time) (*redriveWrite, error) {
		audit := AuditRecord{
			ID: s.newID(), Time: now, RequestID: meta.RequestID, ActorKeyID: p.KeyID, CallerOrgID: p.OrgID,
			ActingFor: st.Node.OwnerOrgID, Action: ActionRetry, NodeID: nodeID, ReservationID: reservationID,
			ReclaimID: opID, TopologyGen: st.Node.TopologyGen, Via: meta.via(), EventID: meta.EventID,
		}
		if _, err := authorizeCapacityCall(p, st, reservationID); err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		op, err := s.Store.GetOperation(ctx, nodeID, opID)
		if ErrorCode(err) == CodeNotFound || err == nil && op.ReservationID != reservationID {
			return nil, Errorf(CodeNotFound, "reclaim operation not found")
		}
		if err != nil {
			return nil, fmt.Errorf("read operation %s: %w", opID, err)
		}
		if op.State == OpPendingStart || op.State == OpTerminating {
			err := Errorf(CodeOperationRunning, "reclaim operation %s is %s; retry it once it has ended", op.ID, op.State)
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		next := *op
		next.State, next.Attempt, next.Restarts, next.Reason, next.UpdatedAt = OpPendingStart, op.CurrentAttempt()+1, 0, "", now
		retry := next.Unfinished() // at the next attempt, failures are no longer final
		audit.Terminated, audit.Outcome = retry, "ok"
		if len(retry) == 0 {
			// A safe repeat of a re-drive that finished.
			unchanged, noop = &RedriveResult{Operation: *op, Retried: []string{}}, audit
			return nil, nil
		}
		return &redriveWrite{op: *op, next: next, retry: retry, audit: audit, node: st.Node}, nil
	}))
	switch {
	case errors.Is(err, errNodeNotFound):
		return nil, notFound()
	case err != nil:
		return nil, err
	case landed == nil:
		s.append(ctx, noop) // nothing to retry: only the record of the call
		return unchanged, nil
	}
	s.logger().InfoContext(ctx, "reclaim operation re-driven", "reclaim_id", opID, "node", nodeID,
		"execution", ExecutionName(landed.next), "vms", landed.retry, "request_id", meta.RequestID)
	s.startWorkflow(ctx, landed.next)
	return &RedriveResult{Operation: landed.next, Retried: landed.retry}, nil
}

// redriveWrite is one round's re-drive: the operation as read, as it goes on (next) with the
// VMs it retries, and its audit record for the changes chain of node (as read).
type redriveWrite struct {
	op, next Operation
	retry    []string
	audit    AuditRecord
	node     Node
}
