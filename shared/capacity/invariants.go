package capacity

import (
	"fmt"
	"slices"
	"time"
)

// Violations checks a node's state against the invariants every interleaving of reclaim,
// release and placement must keep, and describes each breach. Tests assert it is empty; an
// auditing job can run it on live partitions.
func Violations(st *NodeState, now time.Time) []string {
	var out []string
	releasedBy := map[string][]string{}
	for _, r := range st.Reservations {
		for _, u := range r.ReleasedUnitIDs {
			if !slices.Contains(r.ReservedUnitIDs, u) {
				out = append(out, fmt.Sprintf("reservation %s releases %s, which it does not reserve", r.ID, u))
			}
			// Only a reservation in its term puts its released units on the market: one whose
			// term has ended (its item may still say active) or is still to come may release
			// the same unit as the one in term (a spot VM on the unit at its creation
			// started it released).
			if r.Status == StatusActive && r.InTerm(now) {
				releasedBy[u] = append(releasedBy[u], r.ID)
			}
		}
	}
	for u, rs := range releasedBy {
		if len(rs) > 1 {
			out = append(out, fmt.Sprintf("unit %s is released by %d active reservations %v", u, len(rs), rs))
		}
	}
	out = append(out, offNodeViolations(st, now)...)
	occupant := map[string]string{}
	for _, vm := range st.VMs {
		if !vm.occupies() {
			continue
		}
		for _, u := range vm.UnitIDs {
			if other, ok := occupant[u]; ok {
				out = append(out, fmt.Sprintf("unit %s carries both %s and %s", u, other, vm.ID))
			}
			occupant[u] = vm.ID
			if vm.Tier == TierSpot && vm.State == VMRunning && exclusive(st, vm, u, now) {
				out = append(out, fmt.Sprintf("running spot VM %s stands on exclusive reserved unit %s", vm.ID, u))
			}
		}
		if vm.State == VMTerminating && vm.Tier != TierSpot {
			out = append(out, fmt.Sprintf("%s VM %s is being terminated by a reclaim", vm.Tier, vm.ID))
		}
		if vm.State == VMTerminating && vm.ReclaimID == "" {
			out = append(out, fmt.Sprintf("VM %s is terminating for no reclaim operation", vm.ID))
		}
	}
	slices.Sort(out)
	return out
}

// exclusive reports whether a unit that vm stands on is held, not released, by an active
// reservation in term that vm was not placed before: a spot VM placed while the reservation
// was still to start (which placement allows) stays until its owner reclaims the unit.
func exclusive(st *NodeState, vm VM, unit string, now time.Time) bool {
	for _, r := range st.Reservations {
		if r.Status == StatusActive && r.InTerm(now) && slices.Contains(r.ReservedUnitIDs, unit) && !slices.Contains(r.ReleasedUnitIDs, unit) &&
			(vm.CreatedAt.IsZero() || !vm.CreatedAt.Before(r.StartsAt)) {
			return true
		}
	}
	return false
}

// offNodeViolations: an active reservation that has not ended reserves only units of the
// node (a topology change moves it to needs-review in the node's transaction). A pending one
// keeps its status and units through a change: nothing acts on it, and it may name a removed
// unit.
func offNodeViolations(st *NodeState, now time.Time) []string {
	var out []string
	for _, r := range st.Reservations {
		status := r.StatusAt(now)
		if status != StatusActive {
			continue
		}
		for _, u := range r.ReservedUnitIDs {
			if !slices.Contains(st.Node.UnitIDs, u) {
				out = append(out, fmt.Sprintf("%s reservation %s reserves %s, which is not on the node", status, r.ID, u))
			}
		}
	}
	return out
}

// OverlapViolations describes each unit claimed by two reservations (active, pending or
// needs-review, not ended) whose terms overlap. The operator calls never create such a state;
// items written by hand may hold one, which placements then treat as withheld from everyone,
// so it is not among Violations.
func OverlapViolations(st *NodeState, now time.Time) []string {
	var out []string
	var claiming []Reservation
	for _, r := range st.Reservations {
		if claims(r, now) {
			claiming = append(claiming, r)
		}
	}
	for i, a := range claiming {
		for _, b := range claiming[i+1:] {
			if !termsOverlap(a, b) {
				continue
			}
			for _, u := range a.ReservedUnitIDs {
				if slices.Contains(b.ReservedUnitIDs, u) {
					out = append(out, fmt.Sprintf("unit %s is claimed by reservations %s and %s, whose terms overlap", u, a.ID, b.ID))
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
