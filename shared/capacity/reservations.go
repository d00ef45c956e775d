package capacity

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// CreateReservation creates a reservation on a node's units (see DecideCreateReservation).
func (s *Service) CreateReservation(ctx context.Context, p Principal, req ReservationRequest, meta RequestMeta) (*ReservationResult, error) {
	if !p.CanOperate(PermReservationManage) || !ValidID(req.NodeID) {
		return nil, nodeNotFound()
	}
	id := req.ID
	if id == "" {
		id = "res-" + s.newID() // once per call: every round creates the same reservation
	}
	fp := req
	fp.ReservedUnitIDs, fp.AllowedOrgIDs, fp.ManagingOrgIDs = sortedSet(req.ReservedUnitIDs), sortedSet(req.AllowedOrgIDs), sortedSet(req.ManagingOrgIDs)
	fp.StartsAt = req.StartsAt.UTC()
	if req.EndsAt != nil {
		fp.EndsAt = ptrTo(req.EndsAt.UTC())
	}
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionReservationCreate, fp))
	return runOp(s, ctx, opCall[ReservationResult]{
		rec:     s.opAudit(p, meta, ActionReservationCreate, req.NodeID, id, req.ReservedUnitIDs, req.Reason),
		invalid: cmp.Or(req.Validate(s.now()), kerr),
		key:     key,
		missing: nodeNotFound,
		decide: func(st *NodeState, _ *AuditRecord, now time.Time) (*OperatorCommit, *ReservationResult, error) {
			return DecideCreateReservation(st, req, id, now)
		},
	})
}

func ptrTo[T any](v T) *T { return &v }

// termsOverlap reports whether [a.StartsAt, a.EndsAt) and [b.StartsAt, b.EndsAt) meet.
func termsOverlap(a, b Reservation) bool {
	return (b.EndsAt == nil || a.StartsAt.Before(*b.EndsAt)) && (a.EndsAt == nil || b.StartsAt.Before(*a.EndsAt))
}

// claims reports whether a reservation still claims its units for its term: active,
// pending or needs-review, and not ended at now.
func claims(r Reservation, now time.Time) bool {
	switch r.StatusAt(now) {
	case StatusActive, StatusPending, StatusNeedsReview:
		return true
	}
	return false
}

// DecideCreateReservation decides the creation of reservation id on the state read: units on
// the node (unknown_units), not claimed by another reservation whose term overlaps
// (reservation_overlap), not carrying a reserved or on-demand VM (units_in_use); units under
// a spot VM start released, so a reclaim evicts it.
func DecideCreateReservation(st *NodeState, req ReservationRequest, id string, now time.Time) (*OperatorCommit, *ReservationResult, error) {
	if st.Reservation(id) != nil {
		return nil, nil, Errorf(CodeReservationExists, "reservation %s exists on this node", id)
	}
	if unknown := notIn(req.ReservedUnitIDs, st.Node.UnitIDs); len(unknown) > 0 {
		return nil, nil, &Error{Code: CodeUnknownUnits, Message: "units do not exist on this node", UnitIDs: unknown}
	}
	status := req.Status
	if status == "" {
		status = StatusActive
	}
	r := Reservation{
		ID: id, NodeID: st.Node.ID, AllowedOrgIDs: nonNil(slices.Clone(req.AllowedOrgIDs)),
		ReservedUnitIDs: slices.Clone(req.ReservedUnitIDs), ManagingOrgIDs: nonNil(slices.Clone(req.ManagingOrgIDs)),
		StartsAt: req.StartsAt.UTC(), Status: status, ContractRef: req.ContractRef, CreatedAt: now, UpdatedAt: now,
		Reason: req.Reason, TopologyGen: st.Node.TopologyGen, Version: 1, ReleasedUnitIDs: []string{},
	}
	if req.EndsAt != nil {
		r.EndsAt = ptrTo(req.EndsAt.UTC())
	}
	var overlap []string
	for _, o := range st.Reservations {
		if !claims(o, now) || !termsOverlap(r, o) {
			continue
		}
		for _, u := range r.ReservedUnitIDs {
			if slices.Contains(o.ReservedUnitIDs, u) && !slices.Contains(overlap, u) {
				overlap = append(overlap, u)
			}
		}
	}
	if len(overlap) > 0 {
		slices.Sort(overlap)
		return nil, nil, &Error{Code: CodeReservationOverlap, Message: "units are held by another reservation whose term overlaps", UnitIDs: overlap}
	}
	var inUse []string
	for _, vm := range st.VMs {
		if !vm.occupies() {
			continue
		}
		for _, u := range vm.UnitIDs {
			if !slices.Contains(r.ReservedUnitIDs, u) {
				continue
			}
			if vm.Tier == TierSpot {
				if !slices.Contains(r.ReleasedUnitIDs, u) {
					r.ReleasedUnitIDs = append(r.ReleasedUnitIDs, u)
				}
			} else {
				inUse = append(inUse, u)
			}
		}
	}
	if len(inUse) > 0 {
		slices.Sort(inUse)
		return nil, nil, &Error{Code: CodeUnitsInUse, Message: "units carry reserved or on-demand VMs", UnitIDs: inUse}
	}
	slices.Sort(r.ReleasedUnitIDs)
	c := &OperatorCommit{Node: st.Node, BumpNode: true, NewReservation: &r, OrgReservations: map[string][]string{}}
	for _, o := range append(slices.Clone(st.Reservations), r) {
		for _, org := range append(slices.Clone(o.AllowedOrgIDs), o.ManagingOrgIDs...) {
			if names(r, org) && !slices.Contains(c.OrgReservations[org], o.ID) {
				c.OrgReservations[org] = append(c.OrgReservations[org], o.ID)
			}
		}
	}
	for _, ids := range c.OrgReservations {
		slices.Sort(ids)
	}
	return c, &ReservationResult{Reservation: r}, nil
}

// names reports whether the reservation names org among its allowed or managing orgs.
func names(r Reservation, org string) bool {
	return slices.Contains(r.AllowedOrgIDs, org) || slices.Contains(r.ManagingOrgIDs, org)
}

// CancelReservation cancels a reservation: its units stop being withheld and the VMs on them
// keep running (listed in the answer). A cancelled one answers as it is; an expired one is
// invalid_transition. Its pending scheduled reclaims are then cancelled (cancelScheduledOf),
// after every answer that says cancelled: a repeat finishes what an earlier sweep left.
func (s *Service) CancelReservation(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta) (*ReservationResult, error) {
	res, err := s.changeReservation(ctx, p, req, meta, ActionReservationCancel, DecideCancel)
	if err == nil && res.Reservation.Status == StatusCancelled {
		s.cancelScheduledOf(ctx, p, req, meta)
	}
	return res, err
}

// ReaffirmReservation moves a needs-review reservation back to active at the node's current
// topology generation.
func (s *Service) ReaffirmReservation(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta) (*ReservationResult, error) {
	return s.changeReservation(ctx, p, req, meta, ActionReservationReaffirm, DecideReaffirm)
}

func (s *Service) changeReservation(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta, action string,
	decide func(st *NodeState, req ReservationChange, now time.Time) (*OperatorCommit, *ReservationResult, error)) (*ReservationResult, error) {
	if !p.CanOperate(PermReservationManage) || !ValidID(req.NodeID) || !ValidID(req.ReservationID) {
		return nil, notFound()
	}
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(action, req))
	return runOp(s, ctx, opCall[ReservationResult]{
		rec:     s.opAudit(p, meta, action, req.NodeID, req.ReservationID, nil, req.Reason),
		invalid: cmp.Or(req.Validate(), kerr),
		key:     key,
		missing: notFound,
		decide: func(st *NodeState, audit *AuditRecord, now time.Time) (*OperatorCommit, *ReservationResult, error) {
			if r := st.Reservation(req.ReservationID); r != nil {
				audit.UnitIDs = slices.Clone(r.ReservedUnitIDs)
				audit.ReleasedBefore = nonNil(slices.Clone(r.ReleasedUnitIDs))
			}
			c, r, err := decide(st, req, now)
			if err == nil {
				audit.ReleasedAfter = nonNil(slices.Clone(r.Reservation.ReleasedUnitIDs))
			}
			return c, r, err
		},
	})
}

// DecideCancel decides the cancel of a reservation.
func DecideCancel(st *NodeState, req ReservationChange, now time.Time) (*OperatorCommit, *ReservationResult, error) {
	r := st.Reservation(req.ReservationID)
	if r == nil {
		return nil, nil, notFound()
	}
	res := &ReservationResult{VMsOnUnits: vmsOn(st.VMs, r.ReservedUnitIDs)}
	switch r.StatusAt(now) {
	case StatusCancelled:
		// Repeat-safe: nothing to write but the audit record, on the calls chain.
		res.Reservation = *r
		return &OperatorCommit{Node: st.Node}, res, nil
	case StatusExpired:
		return nil, nil, Errorf(CodeInvalidTransition, "reservation has expired; only a reservation that has not ended can be cancelled")
	}
	c := *r
	c.Status, c.UpdatedAt = StatusCancelled, now
	if req.Reason != "" {
		c.Reason = req.Reason
	}
	res.Reservation = c
	res.Reservation.Version++
	return &OperatorCommit{Node: st.Node, BumpNode: true, Reservations: []Reservation{c}}, res, nil
}

// DecideReaffirm decides the re-affirmation of a needs-review reservation: active again at the
// node's topology generation, with every reserved unit still on the node (else unknown_units:
// cancel it and create another). Its released units are kept (those still on the node).
func DecideReaffirm(st *NodeState, req ReservationChange, now time.Time) (*OperatorCommit, *ReservationResult, error) {
	r := st.Reservation(req.ReservationID)
	if r == nil {
		return nil, nil, notFound()
	}
	if status := r.StatusAt(now); status != StatusNeedsReview {
		return nil, nil, Errorf(CodeInvalidTransition, "reservation is %s; only a needs-review reservation can be reaffirmed", status)
	}
	if gone := notIn(r.ReservedUnitIDs, st.Node.UnitIDs); len(gone) > 0 {
		return nil, nil, &Error{Code: CodeUnknownUnits,
			Message: "reserved units are no longer on the node; cancel the reservation and create a new one", UnitIDs: gone}
	}
	c := *r
	c.Status, c.TopologyGen, c.UpdatedAt = StatusActive, st.Node.TopologyGen, now
	c.Reason = req.Reason
	if c.Reason == "" {
		c.Reason = fmt.Sprintf("reaffirmed at topology gen %d", st.Node.TopologyGen)
	}
	released := []string{}
	for _, u := range r.ReleasedUnitIDs {
		if slices.Contains(st.Node.UnitIDs, u) {
			released = append(released, u)
		}
	}
	c.ReleasedUnitIDs = released
	out := c
	out.Version++
	return &OperatorCommit{Node: st.Node, BumpNode: true, Reservations: []Reservation{c}}, &ReservationResult{Reservation: out}, nil
}

// notIn returns the ids that are not in set, in their order (nil when there are none).
func notIn(ids, set []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(set, id) {
			out = append(out, id)
		}
	}
	return out
}

// vmsOn returns the live VMs standing on any of the units, by id.
func vmsOn(vms []VM, units []string) []VM {
	out := []VM{}
	for _, vm := range vms {
		if vm.occupies() && overlaps(vm.UnitIDs, units) {
			out = append(out, vm)
		}
	}
	sortVMs(out)
	return out
}
