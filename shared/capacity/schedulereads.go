package capacity

import (
	"context"
	"fmt"
)

// GetScheduledReclaim returns a scheduled reclaim to a caller who may reclaim on its
// reservation, or to an operator; anyone else gets the reservation's 404.
func (s *Service) GetScheduledReclaim(ctx context.Context, p Principal, nodeID, reservationID, id string) (*ScheduledReclaim, error) {
	if err := s.mayReadScheduled(ctx, p, nodeID, reservationID); err != nil {
		return nil, err
	}
	return s.scheduled(ctx, nodeID, reservationID, id)
}

// ListScheduledReclaims returns a page of a reservation's scheduled reclaims, in every state
// (fired and cancelled ones until their retention ends), in order of at, to those who may
// read one of them; anyone else gets the reservation's 404.
func (s *Service) ListScheduledReclaims(ctx context.Context, p Principal, nodeID, reservationID string, page PageRequest) (*ScheduledPage, error) {
	if err := s.mayReadScheduled(ctx, p, nodeID, reservationID); err != nil {
		return nil, err
	}
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	if err := s.scheduledReads(); err != nil {
		return nil, err
	}
	list, next, err := s.Schedules.ListScheduled(ctx, nodeID, reservationID, limit, page.Cursor)
	if ErrorCode(err) == CodeInvalidRequest {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("list scheduled reclaims of reservation %s: %w", reservationID, err)
	}
	if list == nil {
		list = []ScheduledReclaim{}
	}
	return &ScheduledPage{Scheduled: list, NextCursor: next}, nil
}

// AdmitScheduledRead is the first gate of reading a reservation's scheduled reclaims, before
// anything of the request is read: a key that may reclaim, or an operator key that may read
// (anyone else: the reservation's 404). The service checks the reservation after it.
func AdmitScheduledRead(p Principal, nodeID, reservationID string) error {
	if !ValidID(nodeID) || !ValidID(reservationID) || !(p.Can(PermCapacity) || p.Operator && p.Can(PermRead)) {
		return notFound()
	}
	return nil
}

// mayReadScheduled admits a caller who may reclaim on the reservation, or an operator who
// may read it; anyone else gets the reservation's 404.
func (s *Service) mayReadScheduled(ctx context.Context, p Principal, nodeID, reservationID string) error {
	if err := AdmitScheduledRead(p, nodeID, reservationID); err != nil {
		return err
	}
	st, err := s.Store.LoadNode(ctx, nodeID, "")
	if ErrorCode(err) == CodeNotFound {
		return notFound()
	}
	if err != nil {
		return fmt.Errorf("load node %s: %w", nodeID, err)
	}
	r := st.Reservation(reservationID)
	if r == nil || AccessOf(p, st.Node, *r) != AccessManage {
		return notFound()
	}
	return nil
}

// scheduled reads a scheduled reclaim of the reservation.
func (s *Service) scheduled(ctx context.Context, nodeID, reservationID, id string) (*ScheduledReclaim, error) {
	if !ValidID(id) { // names nothing, in any deployment
		return nil, scheduledNotFound()
	}
	if err := s.scheduledReads(); err != nil {
		return nil, err
	}
	sr, err := s.Schedules.GetScheduled(ctx, nodeID, id)
	if ErrorCode(err) == CodeNotFound || err == nil && sr.ReservationID != reservationID {
		return nil, scheduledNotFound()
	}
	if err != nil {
		return nil, fmt.Errorf("read scheduled reclaim %s: %w", id, err)
	}
	return sr, nil
}

func scheduledNotFound() *Error { return Errorf(CodeNotFound, "scheduled reclaim not found") }
