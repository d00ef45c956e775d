package capacity

import (
	"time"
)

var (
	t0  = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	now = t0.Add(24 * time.Hour)
)

func ptr[T any](v T) *T { return &v }

// fixture is a node of 8 units: r1 reserves u0..u5 for the audience org "aud", managed by
// "mgr", with u2..u5 released to spot. u6, u7 are unreserved.
//
//	vm-spot-a   spot      u2       running
//	vm-spot-b   spot      u3,u6    running  (spans a reserved and an unreserved unit)
//	vm-res      reserved  u0       running  (org aud)
//	vm-od       on-demand u4       running  (legacy placement on a released unit)
//	vm-gone     spot      u5       terminating (another reclaim evicts it)
func fixture() *NodeState {
	return &NodeState{
		Node: Node{ID: "n1", OwnerOrgID: "owner", TopologyGen: 3, UnitIDs: []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}, Version: 10},
		Reservations: []Reservation{{
			ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: []string{"mgr"},
			ReservedUnitIDs: []string{"u0", "u1", "u2", "u3", "u4", "u5"}, ReleasedUnitIDs: []string{"u2", "u3", "u4", "u5"},
			StartsAt: t0, EndsAt: ptr(t0.Add(30 * 24 * time.Hour)), Status: StatusActive, TopologyGen: 3, Version: 4,
		}},
		VMs: []VM{
			{ID: "vm-spot-a", NodeID: "n1", OrgID: "x", Tier: TierSpot, UnitIDs: []string{"u2"}, State: VMRunning, Version: 1},
			{ID: "vm-spot-b", NodeID: "n1", OrgID: "y", Tier: TierSpot, UnitIDs: []string{"u3", "u6"}, State: VMRunning, Version: 1},
			{ID: "vm-res", NodeID: "n1", OrgID: "aud", Tier: TierReserved, UnitIDs: []string{"u0"}, State: VMRunning, Version: 1},
			{ID: "vm-od", NodeID: "n1", OrgID: "z", Tier: TierOnDemand, UnitIDs: []string{"u4"}, State: VMRunning, Version: 1},
			{ID: "vm-gone", NodeID: "n1", OrgID: "x", Tier: TierSpot, UnitIDs: []string{"u5"}, State: VMTerminating, ReclaimID: "rcl_old", Version: 2},
		},
	}
}

func principal(org string, operator bool, perms ...string) Principal {
	return Principal{KeyID: "key-" + org, OrgID: org, Operator: operator, Permissions: perms}
}
