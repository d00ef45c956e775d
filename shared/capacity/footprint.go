package capacity

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A node's commits serialise on its item: every change to the node bumps its version and
// advances its audit chain's head in the same transaction, so a commit on some units loses to
// any commit on others that lands between its read and its write. What it lost, though, is
// only the node's version and head; what its decision read of its own units may be as it was.
// The footprint of a commit is that read, so that a lost commit can be told apart: a real race
// (another write changed what the decision stood on) or a loss to a commit elsewhere on the
// node. Either way the call reads and decides again and its write conditions on the new read;
// the footprint only decides which retry budget the loss is counted against (commitRounds).

// Raced reports whether c, decided on before and lost, lost a real race: whether after, the
// node read again, differs from before in anything c's decision read of the units c touches
// (see Footprint). A commit that names no unit, or a footprint that cannot be taken, counts
// the loss as a real race. A scheduled reclaim's firing also conditions on its scheduled
// item, which no node read shows: a loss to its cancel counts as a loss elsewhere, and the
// next round, which reads the item again, refuses the firing.
func Raced(before, after *NodeState, c Commit) bool {
	units := c.units(before)
	if len(units) == 0 {
		return true
	}
	vmID := ""
	if c.NewVM != nil {
		vmID = c.NewVM.ID
	}
	a, aerr := Footprint(before, units, vmID)
	b, berr := Footprint(after, units, vmID)
	return aerr != nil || berr != nil || a != b
}

// units returns the units c touches, sorted: the call's units (its audit record's, which
// names them for every capacity call), those whose released state c changes, those under the
// VMs it evicts or places, and those of its operation.
func (c Commit) units(before *NodeState) []string {
	units := slices.Clone(c.Audit.UnitIDs)
	if r := c.Reservation; r != nil {
		var was []string
		if old := before.Reservation(r.ID); old != nil {
			was = old.ReleasedUnitIDs
		}
		units = append(units, notIn(was, r.ReleasedUnitIDs)...)
		units = append(units, notIn(r.ReleasedUnitIDs, was)...)
	}
	for _, vm := range c.Evict {
		units = append(units, vm.UnitIDs...)
	}
	if c.NewVM != nil {
		units = append(units, c.NewVM.UnitIDs...)
	}
	if c.Operation != nil {
		units = append(units, c.Operation.UnitIDs...)
	}
	return slices.Compact(sortedSet(units))
}

// Footprint is st's view of the units (a sorted set), in a form two reads compare with ==:
// the node's owner and topology generation and which of the units it has; each reservation
// that reserves one of them (its status, term, generation and orgs, and which of the units it
// reserves and has released); each live VM on one of them or named vmID (its org, tier, units,
// state and reclaim); the caller's idempotency record. Versions, update times and other units'
// state are left out: they move with every commit on the node.
func Footprint(st *NodeState, units []string, vmID string) (string, error) {
	type reservationView struct {
		ID, Status         string
		StartsAt           time.Time
		EndsAt             *time.Time
		TopologyGen        int64
		Allowed, Managing  []string
		Reserved, Released []string
	}
	type vmView struct {
		ID, OrgID, Tier, State, ReclaimID string
		UnitIDs                           []string
	}
	view := struct {
		Owner        string
		TopologyGen  int64
		Units        []string
		Reservations []reservationView
		VMs          []vmView
		Idempotency  *IdempotencyRecord
	}{Owner: st.Node.OwnerOrgID, TopologyGen: st.Node.TopologyGen, Idempotency: st.Idempotency}
	view.Units = within(st.Node.UnitIDs, units)
	for _, r := range st.Reservations {
		reserved := within(r.ReservedUnitIDs, units)
		if len(reserved) == 0 {
			continue
		}
		view.Reservations = append(view.Reservations, reservationView{
			ID: r.ID, Status: string(r.Status), StartsAt: r.StartsAt, EndsAt: r.EndsAt, TopologyGen: r.TopologyGen,
			Allowed: sortedSet(r.AllowedOrgIDs), Managing: sortedSet(r.ManagingOrgIDs),
			Reserved: reserved, Released: within(r.ReleasedUnitIDs, units),
		})
	}
	slices.SortFunc(view.Reservations, func(a, b reservationView) int { return strings.Compare(a.ID, b.ID) })
	for _, vm := range st.VMs {
		if vm.ID != vmID && len(within(vm.UnitIDs, units)) == 0 {
			continue
		}
		view.VMs = append(view.VMs, vmView{
			ID: vm.ID, OrgID: vm.OrgID, Tier: string(vm.Tier), State: string(vm.State), ReclaimID: vm.ReclaimID,
			UnitIDs: sortedSet(vm.UnitIDs),
		})
	}
	slices.SortFunc(view.VMs, func(a, b vmView) int { return strings.Compare(a.ID, b.ID) })
	b, err := json.Marshal(view)
	if err != nil {
		return "", fmt.Errorf("encode the footprint of units %v on node %s: %w", units, st.Node.ID, err)
	}
	return string(b), nil
}

// within returns the ids of set that are among units (sorted), nil if none.
func within(set, units []string) []string {
	var out []string
	for _, id := range set {
		if _, ok := slices.BinarySearch(units, id); ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
