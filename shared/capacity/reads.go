package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// GetOperation returns a reclaim operation to a caller who may see its reservation: whole to
// an operator, the node owner or a managing org; redacted (see OperationView) to the
// reservation's audience.
func (s *Service) GetOperation(ctx context.Context, p Principal, nodeID, reservationID, opID string) (*OperationView, error) {
	if !ValidID(opID) {
		return nil, notFound() // names nothing; checked before any read, like the other path ids
	}
	_, access, err := s.visibleReservation(ctx, p, nodeID, reservationID)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	op, err := s.Store.GetOperation(ctx, nodeID, opID)
	CallStatsFrom(ctx).Since(PhaseRead, start)
	if ErrorCode(err) == CodeNotFound || (err == nil && op.ReservationID != reservationID) {
		return nil, Errorf(CodeNotFound, "reclaim operation not found")
	}
	if err != nil {
		return nil, fmt.Errorf("read operation %s: %w", opID, err)
	}
	if access == AccessManage {
		return &OperationView{Operation: *op}, nil
	}
	return op.redacted(), nil
}

// GetReservation returns a reservation to a caller who may see it, with the status a reader
// sees now (expired once its term has ended).
func (s *Service) GetReservation(ctx context.Context, p Principal, nodeID, reservationID string) (*Reservation, error) {
	r, _, err := s.visibleReservation(ctx, p, nodeID, reservationID)
	if err != nil {
		return nil, err
	}
	out := *r
	out.Status = r.StatusAt(s.now())
	return &out, nil
}

// visibleReservation reads a reservation for a caller who may see it, and the caller's access.
func (s *Service) visibleReservation(ctx context.Context, p Principal, nodeID, reservationID string) (*Reservation, Access, error) {
	if err := AdmitReservationRead(p, nodeID, reservationID); err != nil {
		return nil, AccessNone, err
	}
	start := time.Now()
	st, err := s.Store.LoadNode(ctx, nodeID, "")
	CallStatsFrom(ctx).Since(PhaseRead, start)
	if err != nil {
		if ErrorCode(err) == CodeNotFound {
			return nil, AccessNone, notFound()
		}
		return nil, AccessNone, fmt.Errorf("load node %s: %w", nodeID, err)
	}
	r := st.Reservation(reservationID)
	if r == nil {
		return nil, AccessNone, notFound()
	}
	access := AccessOf(p, st.Node, *r)
	if access == AccessNone {
		return nil, AccessNone, notFound()
	}
	return r, access, nil
}

// readNode reads the node item alone, for the read calls; a missing node is the node's 404.
func (s *Service) readNode(ctx context.Context, nodeID string) (OperatorStore, *Node, error) {
	ops, err := s.operatorStore()
	if err != nil {
		return nil, nil, err
	}
	n, err := ops.GetNode(ctx, nodeID)
	if ErrorCode(err) == CodeNotFound {
		return nil, nil, nodeNotFound()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read node %s: %w", nodeID, err)
	}
	return ops, n, nil
}

// GetNode returns a node to an operator holding node.manage or reservation.read, or to its
// owner org with reservation.read.
func (s *Service) GetNode(ctx context.Context, p Principal, nodeID string) (*Node, error) {
	anyNode := p.CanOperate(PermNodeManage) || p.CanOperate(PermRead)
	if !anyNode && !p.Can(PermRead) || !ValidID(nodeID) {
		return nil, nodeNotFound()
	}
	_, n, err := s.readNode(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	if !anyNode && n.OwnerOrgID != p.OrgID {
		return nil, nodeNotFound()
	}
	return n, nil
}

// AdmitReservationList is ListReservations' first gate, before anything is read: the HTTP
// layer calls it before the query, so a caller who may not list gets the same 404 whatever
// the query says. Anyone without reservation.read (an operator too), or a node id that names
// nothing, gets the 404 of a missing node.
func AdmitReservationList(p Principal, nodeID string) error {
	if !p.Can(PermRead) || !ValidID(nodeID) {
		return nodeNotFound()
	}
	return nil
}

// AdmitReservationRead is the first gate of every read of one reservation (itself, its
// audit), before anything is read: a caller with neither reservation.read nor
// reservation.capacity, or ids that name nothing, gets the 404 of a missing reservation.
// The finer checks (owner, managing or audience org) follow once the reservation is read.
func AdmitReservationRead(p Principal, nodeID, reservationID string) error {
	if !p.Can(PermRead) && !p.Can(PermCapacity) || !ValidID(nodeID) || !ValidID(reservationID) {
		return notFound()
	}
	return nil
}

// ListReservations returns a page of the node's reservations as the caller may see them: all
// to an operator and to the node's owner; to another caller with reservation.read, those whose
// audience or managing orgs hold its org (its pages are read on until they are full). Such a
// caller who sees nothing on the node gets the 404 of a missing node, whatever its cursor
// says, so it cannot tell a node without reservations for it from no node. The next cursor
// names the last reservation on the page (one the caller may see) and is answered only when
// something the caller may see follows it.
func (s *Service) ListReservations(ctx context.Context, p Principal, nodeID string, page PageRequest) (*ReservationPage, error) {
	if err := AdmitReservationList(p, nodeID); err != nil {
		return nil, err
	}
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	// listed: the ids of the reservations that name the caller's org, when its membership
	// entry lists them; an org that sees a little then reads those alone, not the partition.
	var listed []string
	var dir NodeDirectory
	if !p.Operator {
		// An org never named on the node (neither its owner nor in a reservation's orgs) sees
		// nothing there: its 404 costs one small read, the same as for a node that does not
		// exist, rather than the node's partition, whose size its time would tell.
		if d, ok := s.Store.(NodeDirectory); ok {
			named, ids, err := d.NamedOn(ctx, nodeID, p.OrgID)
			if err != nil {
				return nil, fmt.Errorf("list reservations of node %s: %w", nodeID, err)
			}
			if !named {
				return nil, nodeNotFound()
			}
			dir, listed = d, ids
		}
	}
	ops, n, err := s.readNode(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	all := p.Operator || p.OrgID == n.OwnerOrgID
	visible := func(r Reservation) bool { return all || names(r, p.OrgID) }
	read := func(afterID string, limit int) ([]Reservation, bool, error) {
		if !all && listed != nil {
			return s.listedReservations(ctx, dir, nodeID, listed, afterID, limit, visible)
		}
		return s.visibleReservations(ctx, ops, nodeID, afterID, limit, visible)
	}
	after, cerr := "", error(nil)
	if parts, err := parseCursor(page.Cursor, "reservations", 2); err != nil {
		cerr = err
	} else if parts != nil {
		if parts[0] != nodeID || !ValidID(parts[1]) {
			cerr = Errorf(CodeInvalidRequest, "invalid cursor")
		}
		after = parts[1]
	}
	if cerr == nil {
		rs, more, err := read(after, limit)
		if err != nil {
			return nil, err
		}
		if len(rs) > 0 || all {
			out := &ReservationPage{Reservations: rs}
			if more {
				out.NextCursor = listCursor("reservations", nodeID, rs[len(rs)-1].ID)
			}
			return out, nil
		}
	}
	// Nothing to show, or a cursor this list never hands out: whether the caller sees anything
	// on the node at all decides between the node's 404 and the cursor's answer.
	if !all {
		first, _, err := read("", 1)
		if err != nil {
			return nil, err
		}
		if len(first) == 0 {
			return nil, nodeNotFound()
		}
	}
	if cerr != nil {
		return nil, cerr
	}
	return &ReservationPage{Reservations: []Reservation{}}, nil
}

// listedReservations is visibleReservations over the reservations of ids (in id order) alone:
// it reads those after afterID, a page's worth at a time, and keeps the visible ones.
func (s *Service) listedReservations(ctx context.Context, dir NodeDirectory, nodeID string, ids []string, afterID string, limit int,
	visible func(Reservation) bool) ([]Reservation, bool, error) {
	out := []Reservation{}
	now := s.now()
	from, _ := slices.BinarySearch(ids, afterID+"\x00") // the first id strictly after afterID
	ids = ids[from:]
	for len(ids) > 0 {
		batch := ids[:min(len(ids), limit+1-len(out))]
		ids = ids[len(batch):]
		rs, err := dir.GetReservations(ctx, nodeID, batch)
		if err != nil {
			return nil, false, fmt.Errorf("list reservations of node %s: %w", nodeID, err)
		}
		var full bool
		if out, full = keepVisible(out, rs, limit, now, visible); full {
			return out, true, nil
		}
	}
	return out, false, nil
}

// keepVisible appends the visible ones of rs to out, with their status at now, until out holds
// limit; full reports that another visible one followed.
func keepVisible(out, rs []Reservation, limit int, now time.Time, visible func(Reservation) bool) ([]Reservation, bool) {
	for _, r := range rs {
		if !visible(r) {
			continue
		}
		if len(out) == limit {
			return out, true
		}
		r.Status = r.StatusAt(now)
		out = append(out, r)
	}
	return out, false
}

// visibleReservations reads the node's reservations after afterID in id order and keeps the
// visible ones, until it has limit of them and knows whether another visible one follows
// (more), or the node has no more.
func (s *Service) visibleReservations(ctx context.Context, ops OperatorStore, nodeID, afterID string, limit int,
	visible func(Reservation) bool) ([]Reservation, bool, error) {
	out := []Reservation{}
	now := s.now()
	for {
		rs, more, err := ops.ListReservations(ctx, nodeID, limit+1, afterID)
		if err != nil {
			if e := (*Error)(nil); errors.As(err, &e) {
				return nil, false, err
			}
			return nil, false, fmt.Errorf("list reservations of node %s: %w", nodeID, err)
		}
		var full bool
		if out, full = keepVisible(out, rs, limit, now, visible); full {
			return out, true, nil
		}
		if !more || len(rs) == 0 {
			return out, false, nil
		}
		afterID = rs[len(rs)-1].ID
	}
}
