package capacity

import (
	"context"
	"errors"
	"fmt"
)

// CancelScheduledReclaim cancels a scheduled reclaim that has not fired, then deletes its
// schedule. Cancelling a cancelled one answers it again; one that has fired is refused
// (CodeScheduledReclaimFired). Callers are those who may reclaim on the reservation.
func (s *Service) CancelScheduledReclaim(ctx context.Context, p Principal, nodeID, reservationID, id string, meta RequestMeta) (*ScheduledReclaim, error) {
	if err := AdmitCapacityCall(p, nodeID, reservationID); err != nil {
		return nil, err
	}
	if !ValidID(id) { // names nothing, in any deployment: a 404, not scheduling_unavailable
		return nil, scheduledNotFound()
	}
	if err := s.scheduling(); err != nil {
		return nil, err
	}
	wrote := false // a round sent the cancel
	for range s.attempts() {
		now := s.now()
		st, err := s.Store.LoadNode(ctx, nodeID, "")
		if ErrorCode(err) == CodeNotFound {
			return nil, notFound()
		}
		if err != nil {
			return nil, fmt.Errorf("load node %s: %w", nodeID, err)
		}
		audit := s.auditRecord(p, st, CapacityRequest{NodeID: nodeID, ReservationID: reservationID}, meta, ActionCancelScheduledReclaim, now)
		if _, err := authorizeCapacityCall(p, st, reservationID); err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		sr, err := s.scheduled(ctx, nodeID, reservationID, id)
		if err != nil {
			return nil, err
		}
		audit.ReclaimID, audit.UnitIDs = sr.ID, sr.UnitIDs
		switch sr.State {
		case ScheduledCancelled:
			if wrote {
				// Perhaps by this call's own write whose answer was lost: its schedule too.
				s.deleteSchedule(ctx, *sr)
			}
			return sr, nil
		case ScheduledCompleted, ScheduledRefused:
			err := Errorf(CodeScheduledReclaimFired, "scheduled reclaim %s has fired (%s); it can no longer be cancelled", sr.ID, sr.State)
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		next := *sr
		next.State, next.CancelledAt, next.UpdatedAt = ScheduledCancelled, &now, now
		audit.Outcome = "ok"
		err = s.Schedules.UpdateScheduled(ctx, *sr, next, &audit)
		wrote = true
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrAmbiguous) {
			continue // fired or cancelled meanwhile, or perhaps by this write: read again
		}
		if err != nil {
			return nil, fmt.Errorf("cancel scheduled reclaim %s: %w", sr.ID, err)
		}
		next.Version++
		s.deleteSchedule(ctx, next)
		return &next, nil
	}
	return nil, Errorf(CodeConcurrentModification, "the scheduled reclaim kept changing while this call was applied; retrying is safe")
}

// cancelScheduledOf cancels the pending scheduled reclaims of a cancelled reservation, each
// in a transaction of its own (a reservation may have more than one transaction can hold)
// that moves it to cancelled, conditioned on its state and version as read, takes it off its
// org's pending count and puts its audit record on the node's changes chain; then its
// schedule is deleted. Were they left, each would hold its org's slot until it fired, only to
// be refused. Failures are logged, not returned: the cancel has landed, a repeat of it sweeps
// again, and one the sweep misses (the list is an index, a moment stale) is refused, and
// taken off the count, when it fires.
func (s *Service) cancelScheduledOf(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta) {
	if s.Schedules == nil {
		return // no scheduled reclaims in this deployment
	}
	reason := "reservation " + req.ReservationID + " was cancelled"
	if req.Reason != "" {
		reason += ": " + req.Reason
	}
	var st *NodeState // read once, for the records, when there is one to cancel
	cursor := ""
	for {
		list, next, err := s.Schedules.ListScheduled(ctx, req.NodeID, req.ReservationID, MaxPageLimit, cursor)
		if err != nil {
			s.logger().WarnContext(ctx, "scheduled reclaims of a cancelled reservation not listed; they are refused when they fire",
				"node", req.NodeID, "reservation", req.ReservationID, "err", err)
			return
		}
		for _, sr := range list {
			if sr.State != ScheduledPending {
				continue
			}
			if st == nil {
				if st, err = s.Store.LoadNode(ctx, req.NodeID, ""); err != nil {
					st = &NodeState{Node: Node{ID: req.NodeID}} // the records still say who and what
				}
			}
			rec := s.roundAudit(s.opAudit(p, meta, ActionCancelScheduledReclaim, req.NodeID, req.ReservationID, sr.UnitIDs, reason), st, s.now())
			if err := s.cancelPending(ctx, sr, reason, rec); err != nil {
				s.logger().WarnContext(ctx, "scheduled reclaim of a cancelled reservation not cancelled; it is refused when it fires",
					"scheduled_reclaim_id", sr.ID, "node", req.NodeID, "reservation", req.ReservationID, "err", err)
			}
		}
		if next == "" {
			return
		}
		cursor = next
	}
}

// cancelPending moves one scheduled reclaim, listed as pending, to cancelled with the reason,
// and deletes its schedule. Each round reads it (consistently) and conditions the write on
// that read; a lost race or an unknown outcome is read again, so the write lands at most once
// and the org's count moves once. One found cancelled (perhaps by an earlier round) has its
// schedule deleted again, which is safe; one that fired or was refused is left as it is.
func (s *Service) cancelPending(ctx context.Context, listed ScheduledReclaim, reason string, audit AuditRecord) error {
	for range s.attempts() {
		sr, err := s.Schedules.GetScheduled(ctx, listed.NodeID, listed.ID)
		if err != nil {
			return fmt.Errorf("read scheduled reclaim %s: %w", listed.ID, err)
		}
		switch sr.State {
		case ScheduledCancelled:
			s.deleteSchedule(ctx, *sr)
			return nil
		case ScheduledCompleted, ScheduledRefused:
			return nil
		}
		now := s.now()
		next := *sr
		next.State, next.CancelledAt, next.UpdatedAt = ScheduledCancelled, &now, now
		next.Code, next.Detail = CodeReservationNotActive, reason
		audit.ID, audit.Time, audit.ReclaimID, audit.Outcome = s.newID(), now, sr.ID, "ok"
		err = s.Schedules.UpdateScheduled(ctx, *sr, next, &audit)
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrAmbiguous) || errors.Is(err, ErrThrottled) {
			continue // fired or cancelled meanwhile, or perhaps by this write: read again
		}
		if err != nil {
			return fmt.Errorf("cancel scheduled reclaim %s: %w", sr.ID, err)
		}
		next.Version++
		s.deleteSchedule(ctx, next)
		return nil
	}
	return fmt.Errorf("scheduled reclaim %s kept changing: %w", listed.ID, ErrConflict)
}

// deleteSchedule deletes a cancelled scheduled reclaim's schedule. The cancel is what counts:
// a schedule left behind fires into a refusal.
func (s *Service) deleteSchedule(ctx context.Context, sr ScheduledReclaim) {
	if s.Scheduler == nil {
		return
	}
	if err := s.Scheduler.Delete(ctx, sr); err != nil {
		s.logger().WarnContext(ctx, "schedule of a cancelled reclaim not deleted; its firing will be refused",
			"scheduled_reclaim_id", sr.ID, "node", sr.NodeID, "err", err)
	}
}
