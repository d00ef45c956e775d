package capacity

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// cloneState deep-copies a node's state, for a test to change the copy.
func cloneState(t *testing.T, st *NodeState) *NodeState {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var out NodeState
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// decidedCommit is the commit of a reclaim or release decided on st, as the service makes it.
func decidedCommit(t *testing.T, st *NodeState, action string, units ...string) Commit {
	t.Helper()
	req := CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: units}
	plan, err := DecideCapacity(action, principal("owner", false, PermCapacity), st, req, now)
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := plan.Commit("rcl_t", AuditRecord{UnitIDs: units}, now)
	return *c
}

// placedCommit is the commit of a spot placement decided on st.
func placedCommit(t *testing.T, st *NodeState, vmID string, units ...string) Commit {
	t.Helper()
	req := PlacementRequest{NodeID: "n1", VMID: vmID, OrgID: "buyer", Tier: TierSpot, UnitIDs: units}
	vm, err := DecidePlacement(principal("platform", true, PermPlace), st, req, now)
	if err != nil {
		t.Fatal(err)
	}
	return Commit{Node: st.Node, BumpNode: true, NewVM: vm, Audit: AuditRecord{UnitIDs: units}}
}

func vmIndex(st *NodeState, id string) int {
	return slices.IndexFunc(st.VMs, func(vm VM) bool { return vm.ID == id })
}

// TestRacedTellsOwnUnitsFromOthers: a lost commit raced for real only when what its decision
// read of its own units changed; commits elsewhere on the node (which move the node's version
// and audit head, the reservation's version and its other units) do not count.
func TestRacedTellsOwnUnitsFromOthers(t *testing.T) {
	// The fixture's commits: a reclaim of u2 (evicts vm-spot-a), a reclaim of u3 (evicts
	// vm-spot-b, which also stands on u6), a release of u1, a spot placement on u7.
	reclaimU2 := func(t *testing.T, st *NodeState) Commit { return decidedCommit(t, st, ActionReclaim, "u2") }
	reclaimU3 := func(t *testing.T, st *NodeState) Commit { return decidedCommit(t, st, ActionReclaim, "u3") }
	releaseU1 := func(t *testing.T, st *NodeState) Commit { return decidedCommit(t, st, ActionRelease, "u1") }
	placeU7 := func(t *testing.T, st *NodeState) Commit { return placedCommit(t, st, "vm-new", "u7") }
	tests := []struct {
		name   string
		commit func(*testing.T, *NodeState) Commit
		change func(st *NodeState)
		raced  bool
	}{
		{"nothing changed (a TransactionConflict)", reclaimU2, func(*NodeState) {}, false},
		{"versions, audit head and update times moved", reclaimU2, func(st *NodeState) {
			st.Node.Version += 3
			st.Node.AuditHead = AuditHead{Seq: 99, Hash: "h"}
			st.Reservations[0].Version++
			st.Reservations[0].UpdatedAt = now
			st.VMs[vmIndex(st, "vm-spot-a")].Version++
		}, false},
		{"another unit released", reclaimU2, func(st *NodeState) {
			st.Reservations[0].ReleasedUnitIDs = append(st.Reservations[0].ReleasedUnitIDs, "u1")
		}, false},
		{"another unit reclaimed, its VM evicted", reclaimU2, func(st *NodeState) {
			st.Reservations[0].ReleasedUnitIDs = []string{"u2", "u4", "u5"}
			st.VMs[vmIndex(st, "vm-spot-b")].State = VMTerminating
		}, false},
		{"a VM placed on another unit", reclaimU2, func(st *NodeState) {
			st.VMs = append(st.VMs, VM{ID: "vm-7", NodeID: "n1", Tier: TierSpot, UnitIDs: []string{"u7"}, State: VMRunning})
		}, false},
		{"a VM on another unit terminated", reclaimU2, func(st *NodeState) {
			st.VMs = slices.Delete(st.VMs, vmIndex(st, "vm-gone"), vmIndex(st, "vm-gone")+1)
		}, false},
		{"the unit reclaimed by another call", reclaimU2, func(st *NodeState) {
			st.Reservations[0].ReleasedUnitIDs = []string{"u3", "u4", "u5"}
		}, true},
		{"the unit's VM evicted by another call", reclaimU2, func(st *NodeState) {
			vm := &st.VMs[vmIndex(st, "vm-spot-a")]
			vm.State, vm.ReclaimID = VMTerminating, "rcl_other"
		}, true},
		{"the unit's VM terminated", reclaimU2, func(st *NodeState) {
			st.VMs = slices.Delete(st.VMs, vmIndex(st, "vm-spot-a"), vmIndex(st, "vm-spot-a")+1)
		}, true},
		{"the reservation cancelled", reclaimU2, func(st *NodeState) { st.Reservations[0].Status = StatusCancelled }, true},
		{"the reservation's term moved", reclaimU2, func(st *NodeState) { st.Reservations[0].EndsAt = ptr(now.Add(time.Hour)) }, true},
		{"a managing org added", reclaimU2, func(st *NodeState) {
			st.Reservations[0].ManagingOrgIDs = append(st.Reservations[0].ManagingOrgIDs, "mgr2")
		}, true},
		{"the topology generation moved", reclaimU2, func(st *NodeState) { st.Node.TopologyGen++ }, true},
		{"the node's owner changed", reclaimU2, func(st *NodeState) { st.Node.OwnerOrgID = "owner2" }, true},
		{"the unit left the node", reclaimU2, func(st *NodeState) {
			st.Node.UnitIDs = slices.DeleteFunc(st.Node.UnitIDs, func(u string) bool { return u == "u2" })
		}, true},
		{"another reservation reserves the unit", reclaimU2, func(st *NodeState) {
			st.Reservations = append(st.Reservations, Reservation{ID: "r2", NodeID: "n1", ReservedUnitIDs: []string{"u2"}, Status: StatusPending, StartsAt: now})
		}, true},
		{"the caller's idempotency record appeared", reclaimU2, func(st *NodeState) {
			st.Idempotency = &IdempotencyRecord{Scope: "s", NodeID: "n1", Fingerprint: "f", ExpiresAt: now.Add(time.Hour)}
		}, true},
		// An evicted VM's other units are the commit's too.
		{"evicting a VM: its other unit reserved", reclaimU3, func(st *NodeState) {
			st.Reservations = append(st.Reservations, Reservation{ID: "r2", NodeID: "n1", ReservedUnitIDs: []string{"u6", "u7"}, Status: StatusActive, StartsAt: now})
		}, true},
		{"evicting a VM: a unit it does not stand on released", reclaimU3, func(st *NodeState) {
			st.Reservations[0].ReleasedUnitIDs = append(st.Reservations[0].ReleasedUnitIDs, "u1")
		}, false},
		{"releasing: another unit reclaimed", releaseU1, func(st *NodeState) {
			st.Reservations[0].ReleasedUnitIDs = []string{"u2", "u3", "u4"}
		}, false},
		{"releasing: a VM placed on the unit", releaseU1, func(st *NodeState) {
			st.VMs = append(st.VMs, VM{ID: "vm-1", NodeID: "n1", OrgID: "aud", Tier: TierReserved, UnitIDs: []string{"u1"}, State: VMRunning})
		}, true},
		{"placing: a VM placed elsewhere", placeU7, func(st *NodeState) {
			st.VMs = append(st.VMs, VM{ID: "vm-1", NodeID: "n1", Tier: TierSpot, UnitIDs: []string{"u1"}, State: VMRunning})
		}, false},
		{"placing: its VM id taken elsewhere", placeU7, func(st *NodeState) {
			st.VMs = append(st.VMs, VM{ID: "vm-new", NodeID: "n1", Tier: TierSpot, UnitIDs: []string{"u1"}, State: VMRunning})
		}, true},
		{"placing: the unit reserved", placeU7, func(st *NodeState) {
			st.Reservations = append(st.Reservations, Reservation{ID: "r2", NodeID: "n1", ReservedUnitIDs: []string{"u7"}, Status: StatusActive, StartsAt: now})
		}, true},
		{"a commit that names no unit counts every loss", func(_ *testing.T, st *NodeState) Commit { return Commit{Node: st.Node} },
			func(*NodeState) {}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fixture()
			c := tt.commit(t, before)
			after := cloneState(t, before)
			tt.change(after)
			if got := Raced(before, after, c); got != tt.raced {
				t.Errorf("Raced = %v, want %v", got, tt.raced)
			}
		})
	}
}
