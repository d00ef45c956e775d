package capacity

import (
	"context"
	"errors"
	"fmt"
	"time"
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
	var answer *ScheduledReclaim
	w := scheduledCancels(s, nodeRead(s.Store.LoadNode, nodeID, ""), &wrote)
	w.logAttrs = []any{"node", nodeID, "scheduled_reclaim_id", id}
	landed, err := commitRounds(s, ctx, w, anew(func(st *NodeState, now time.Time) (*scheduledCancel, error) {
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
				// Perhaps by this call's own write, landed after its check: its schedule too.
				s.deleteSchedule(ctx, *sr)
			}
			answer = sr
			return nil, nil
		case ScheduledCompleted, ScheduledRefused:
			err := Errorf(CodeScheduledReclaimFired, "scheduled reclaim %s has fired (%s); it can no longer be cancelled", sr.ID, sr.State)
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		audit.Outcome = "ok"
		return &scheduledCancel{from: *sr, to: cancelled(*sr, now), audit: audit, node: st.Node}, nil
	}))
	switch {
	case errors.Is(err, errNodeNotFound):
		return nil, notFound()
	case err != nil:
		return nil, err
	case landed != nil:
		return &landed.to, nil
	}
	return answer, nil
}

// scheduledCancel is one round's cancel of a scheduled reclaim: from as read, to cancelled,
// with its audit record for the changes chain of node (as read).
type scheduledCancel struct {
	from, to ScheduledReclaim
	audit    AuditRecord
	node     Node
}

// cancelled is sr cancelled at now.
func cancelled(sr ScheduledReclaim, now time.Time) ScheduledReclaim {
	sr.State, sr.CancelledAt, sr.UpdatedAt = ScheduledCancelled, &now, now
	return sr
}

// scheduledCancels writes cancels of scheduled reclaims, each conditioned on its state and
// version as read, its audit record on the node's changes chain (which tells whether one of
// unknown outcome landed). Rounds read with read; *wrote (if given) is set once a cancel was
// sent. A cancel that landed has its version moved on (c.to is the scheduled reclaim as
// stored) and its schedule deleted.
func scheduledCancels[S any](s *Service, read func(ctx context.Context) (*S, error), wrote *bool) writer[S, scheduledCancel] {
	done := func(ctx context.Context, c *scheduledCancel) {
		c.to.Version++
		s.deleteSchedule(ctx, c.to)
	}
	return writer[S, scheduledCancel]{
		kind: "scheduled reclaim cancel", subject: "the scheduled reclaim",
		read: read,
		commit: func(ctx context.Context, c *scheduledCancel) error {
			if wrote != nil {
				*wrote = true
			}
			err := s.Schedules.UpdateScheduled(ctx, c.from, c.to, &c.audit)
			if err == nil {
				done(ctx, c)
			}
			return err
		},
		audit: func(c *scheduledCancel) AuditRecord { return c.audit },
		landed: func(ctx context.Context, c *scheduledCancel) (bool, error) {
			ok, err := s.landedOn(ctx, c.node, c.audit)
			if ok {
				done(ctx, c)
			}
			return ok, err
		},
	}
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
			if err := s.cancelPending(ctx, sr, reason, rec, st.Node); err != nil {
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
// that read, so the write lands at most once and the org's count moves once; one of unknown
// outcome is looked for on the changes chain of node (as the sweep read it). One found
// cancelled (by another call) has its schedule deleted again, which is safe; one that fired or
// was refused is left as it is.
func (s *Service) cancelPending(ctx context.Context, listed ScheduledReclaim, reason string, audit AuditRecord, node Node) error {
	read := func(ctx context.Context) (*ScheduledReclaim, error) {
		sr, err := s.Schedules.GetScheduled(ctx, listed.NodeID, listed.ID)
		if err != nil {
			return nil, fmt.Errorf("read scheduled reclaim %s: %w", listed.ID, err)
		}
		return sr, nil
	}
	w := scheduledCancels(s, read, nil)
	w.logAttrs = []any{"node", listed.NodeID, "scheduled_reclaim_id", listed.ID}
	_, err := commitRounds(s, ctx, w, anew(func(sr *ScheduledReclaim, now time.Time) (*scheduledCancel, error) {
		switch sr.State {
		case ScheduledCancelled:
			s.deleteSchedule(ctx, *sr)
			return nil, nil
		case ScheduledCompleted, ScheduledRefused:
			return nil, nil
		}
		next := cancelled(*sr, now)
		next.Code, next.Detail = CodeReservationNotActive, reason
		audit.ID, audit.Time, audit.ReclaimID, audit.Outcome = s.newID(), now, sr.ID, "ok"
		return &scheduledCancel{from: *sr, to: next, audit: audit, node: node}, nil
	}))
	return err
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
