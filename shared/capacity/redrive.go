package capacity

import (
	"context"
	"errors"
	"fmt"
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
	for range s.attempts() {
		now := s.now()
		st, err := s.Store.LoadNode(ctx, nodeID, "")
		if ErrorCode(err) == CodeNotFound {
			return nil, notFound()
		}
		if err != nil {
			return nil, fmt.Errorf("load node %s: %w", nodeID, err)
		}
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
			s.append(ctx, audit) // nothing to retry: a safe repeat of a re-drive that finished
			return &RedriveResult{Operation: *op, Retried: []string{}}, nil
		}
		err = s.Store.RedriveOperation(ctx, *op, audit, now)
		if err != nil {
			// The answer may have been lost after the write landed (the SDK's retry of it then
			// fails its condition): the audit record written with it tells.
			landed, lerr := s.Store.Landed(ctx, Commit{Node: st.Node, Audit: audit})
			if lerr != nil {
				return nil, fmt.Errorf("re-drive operation %s: outcome unknown (%v): %w", opID, err, lerr)
			}
			if landed {
				err = nil
			}
		}
		if errors.Is(err, ErrConflict) {
			s.logger().InfoContext(ctx, "re-drive lost a race; reading again", "reclaim_id", opID, "node", nodeID)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("re-drive operation %s: %w", opID, err)
		}
		s.logger().InfoContext(ctx, "reclaim operation re-driven", "reclaim_id", opID, "node", nodeID,
			"execution", ExecutionName(next), "vms", retry, "request_id", meta.RequestID)
		s.startWorkflow(ctx, next)
		return &RedriveResult{Operation: next, Retried: retry}, nil
	}
	return nil, Errorf(CodeConcurrentModification, "the reclaim operation kept changing while this call was applied; retrying is safe")
}
