package capacity

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// UnitState is what a unit is doing now, as the node's unit view shows it.
type UnitState string

const (
	// UnitExclusive: reserved, idle, not released: the reservation's own.
	UnitExclusive UnitState = "exclusive"
	// UnitReleased: reserved, released to the spot market, idle.
	UnitReleased UnitState = "released"
	// UnitSpot: under a running spot VM.
	UnitSpot UnitState = "spot"
	// UnitTerminating: under a VM being terminated (a reclaim's victim).
	UnitTerminating UnitState = "terminating"
	// UnitOccupied: under a running reserved or on-demand VM.
	UnitOccupied UnitState = "occupied"
	// UnitUnreserved: in no reservation that holds it now, idle.
	UnitUnreserved UnitState = "unreserved"
)

// UnitStates lists every unit state, in the order the docs tell them.
var UnitStates = []UnitState{UnitExclusive, UnitReleased, UnitSpot, UnitTerminating, UnitOccupied, UnitUnreserved}

// Reservation modes of a reserved unit.
const (
	ModeExclusive = "exclusive"
	ModeReleased  = "released"
)

// UnitVM is the VM on a unit as the caller may see it: ID and OrgID are "" where it may not.
type UnitVM struct {
	ID    string
	OrgID string
	Tier  Tier
	State VMState
	// Since is when the VM entered its state.
	Since time.Time
}

// UnitView is one unit of the node's unit view.
type UnitView struct {
	UnitID string
	State  UnitState
	// ReservationID names the reservation holding the unit now ("" when none does), and
	// ReservationMode says whether the unit is its own (ModeExclusive) or on the spot market
	// (ModeReleased).
	ReservationID   string
	ReservationMode string
	VM              *UnitVM
}

// UnitReservation is a reservation of the unit view: one that holds its units now or will.
type UnitReservation struct {
	ID              string
	Status          Status
	Access          Access
	ReservedUnitIDs []string
	ReleasedUnitIDs []string
}

// NodeUnits is a node's unit view as one caller may see it.
type NodeUnits struct {
	NodeID       string
	TopologyGen  int64
	Version      int64
	Units        []UnitView
	Reservations []UnitReservation
}

// GetNodeUnits returns the node's unit view as the caller may see it (see UnitsView), read
// strongly consistent in one query of the node's partition. A caller who may see neither the
// node nor any of its reservations gets the node's 404.
func (s *Service) GetNodeUnits(ctx context.Context, p Principal, nodeID string) (*NodeUnits, error) {
	if !ValidID(nodeID) || !seesAllNodes(p) && !readsTenantNodes(p) {
		return nil, nodeNotFound()
	}
	start := time.Now()
	st, err := s.Store.LoadNode(ctx, nodeID, "")
	CallStatsFrom(ctx).Since(PhaseRead, start)
	if ErrorCode(err) == CodeNotFound {
		return nil, nodeNotFound()
	}
	if err != nil {
		return nil, fmt.Errorf("load node %s: %w", nodeID, err)
	}
	view, ok := UnitsView(p, st, s.now())
	if !ok {
		return nil, nodeNotFound()
	}
	return view, nil
}

// UnitsView derives the node's unit view for the caller at now; false when the caller may not
// see the node at all.
//
// Who sees what: an operator with node.manage, reservation.read, audit.read or
// reservation.capacity, and the owner
// (with reservation.read or reservation.capacity), see every unit and every VM's id and org.
// A managing or audience org (with one of those permissions) sees the node when one of its
// reservations names it, and the units its visible reservations hold now, nothing else: on
// them a managing org sees every VM's id, an audience org only its own org's VMs' ids (of the
// others: tier, state and since), and either sees a VM's org only when it is its own. The
// reservations listed are the visible ones that hold their units now or will (not ended, not
// cancelled), with the caller's access.
func UnitsView(p Principal, st *NodeState, now time.Time) (*NodeUnits, bool) {
	all := seesAllNodes(p) || readsTenantNodes(p) && st.Node.OwnerOrgID == p.OrgID
	if !all && !(readsTenantNodes(p) && nodeVisibleTo(p, st)) {
		return nil, false
	}
	out := &NodeUnits{NodeID: st.Node.ID, TopologyGen: st.Node.TopologyGen, Version: st.Node.Version,
		Units: []UnitView{}, Reservations: []UnitReservation{}}
	access := map[string]Access{} // of the visible reservations, by id
	for _, r := range st.Reservations {
		if !r.holds(now) && !r.upcoming(now) {
			continue
		}
		a := AccessManage
		if !all {
			a = tenantAccess(p, r)
		}
		if a == AccessNone {
			continue
		}
		access[r.ID] = a
		out.Reservations = append(out.Reservations, UnitReservation{ID: r.ID, Status: r.StatusAt(now), Access: a,
			ReservedUnitIDs: list(r.ReservedUnitIDs), ReleasedUnitIDs: list(r.ReleasedUnitIDs)})
	}
	for _, u := range st.Node.UnitIDs {
		holder := holderOf(st.Reservations, u, now)
		a := AccessManage
		if !all {
			if holder == nil {
				continue
			}
			if a = access[holder.ID]; a == AccessNone {
				continue
			}
		}
		view := UnitView{UnitID: u, State: UnitUnreserved}
		if holder != nil {
			view.ReservationID, view.State, view.ReservationMode = holder.ID, UnitExclusive, ModeExclusive
			if slices.Contains(holder.ReleasedUnitIDs, u) {
				view.State, view.ReservationMode = UnitReleased, ModeReleased
			}
		}
		if vm := vmOn(st.VMs, u); vm != nil {
			view.State = unitStateUnder(*vm)
			view.VM = unitVMFor(p, all, a, *vm)
		}
		out.Units = append(out.Units, view)
	}
	return out, true
}

// tenantAccess is a tenant caller's access to a reservation (AccessOf without the operator's
// and the owner's, which see everything anyway).
func tenantAccess(p Principal, r Reservation) Access {
	switch {
	case slices.Contains(r.ManagingOrgIDs, p.OrgID):
		return AccessManage
	case slices.Contains(r.AllowedOrgIDs, p.OrgID):
		return AccessView
	}
	return AccessNone
}

// holderOf returns the reservation that holds the unit at now, or nil.
func holderOf(rs []Reservation, unitID string, now time.Time) *Reservation {
	for i := range rs {
		if rs[i].holds(now) && slices.Contains(rs[i].ReservedUnitIDs, unitID) {
			return &rs[i]
		}
	}
	return nil
}

// vmOn returns the live VM standing on the unit, or nil.
func vmOn(vms []VM, unitID string) *VM {
	for i := range vms {
		if vms[i].occupies() && slices.Contains(vms[i].UnitIDs, unitID) {
			return &vms[i]
		}
	}
	return nil
}

// unitStateUnder is the state of a unit under the live VM.
func unitStateUnder(vm VM) UnitState {
	switch {
	case vm.State == VMTerminating:
		return UnitTerminating
	case vm.Tier == TierSpot:
		return UnitSpot
	}
	return UnitOccupied
}

// unitVMFor is the VM as the caller sees it on a unit it sees with access a: its id to all
// (operator, owner), to a managing org, and to the VM's own org; its org to all and to its own.
func unitVMFor(p Principal, all bool, a Access, vm VM) *UnitVM {
	since := vm.UpdatedAt
	if since.IsZero() {
		since = vm.CreatedAt
	}
	out := &UnitVM{Tier: vm.Tier, State: vm.State, Since: since}
	own := vm.OrgID == p.OrgID
	if all || a == AccessManage || own {
		out.ID = vm.ID
	}
	if all || own {
		out.OrgID = vm.OrgID
	}
	return out
}
