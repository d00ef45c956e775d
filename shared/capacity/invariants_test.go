package capacity

import (
	"strings"
	"testing"
	"time"
)

func TestViolations(t *testing.T) {
	tests := []struct {
		name string
		prep func(*NodeState)
		want string // substring of the one expected violation; "" for none
	}{
		{"consistent state", func(st *NodeState) { st.VMs = st.VMs[:3] }, ""},
		{"released but not reserved", func(st *NodeState) {
			st.VMs = nil
			st.Reservations[0].ReleasedUnitIDs = append(st.Reservations[0].ReleasedUnitIDs, "u7")
		}, "does not reserve"},
		{"released by two active reservations", func(st *NodeState) {
			st.VMs = nil
			r2 := st.Reservations[0]
			r2.ID = "r2"
			r2.ReleasedUnitIDs = []string{"u2"}
			st.Reservations = append(st.Reservations, r2)
		}, "released by 2 active reservations"},
		{"released by an ended reservation and by the one created on its units since", func(st *NodeState) {
			st.VMs = nil
			r2 := st.Reservations[0]
			r2.ID, r2.StartsAt, r2.EndsAt = "r2", *r2.EndsAt, nil
			r2.ReleasedUnitIDs = []string{"u2"}
			st.Reservations[0].EndsAt = ptr(now.Add(-time.Hour)) // still stored active
			st.Reservations = append(st.Reservations, r2)
		}, ""},
		{"released by the reservation in term and by one still to start", func(st *NodeState) {
			st.VMs = nil
			r2 := st.Reservations[0]
			r2.ID, r2.StartsAt, r2.EndsAt = "r2", *r2.EndsAt, nil
			r2.ReleasedUnitIDs = []string{"u2"}
			st.Reservations = append(st.Reservations, r2)
		}, ""},
		{"two VMs on one unit", func(st *NodeState) {
			st.VMs = append(st.VMs[:1], VM{ID: "vm-x", Tier: TierSpot, UnitIDs: []string{"u2"}, State: VMRunning})
		}, "carries both"},
		{"spot on exclusive capacity", func(st *NodeState) {
			st.VMs = []VM{{ID: "vm-x", Tier: TierSpot, UnitIDs: []string{"u1"}, State: VMRunning}}
		}, "exclusive reserved unit u1"},
		{"spot VM placed on exclusive capacity after the reservation started", func(st *NodeState) {
			st.VMs = []VM{{ID: "vm-x", Tier: TierSpot, UnitIDs: []string{"u1"}, State: VMRunning, CreatedAt: t0.Add(time.Hour)}}
		}, "exclusive reserved unit u1"},
		{"spot VM placed before the reservation started, not yet reclaimed", func(st *NodeState) {
			st.VMs = []VM{{ID: "vm-x", Tier: TierSpot, UnitIDs: []string{"u1"}, State: VMRunning, CreatedAt: t0.Add(-time.Hour)}}
		}, ""},
		{"non-spot VM terminating", func(st *NodeState) {
			st.VMs = []VM{{ID: "vm-x", Tier: TierReserved, UnitIDs: []string{"u1"}, State: VMTerminating, ReclaimID: "rcl_1"}}
		}, "reserved VM vm-x is being terminated"},
		{"terminating for no operation", func(st *NodeState) {
			st.VMs = []VM{{ID: "vm-x", Tier: TierSpot, UnitIDs: []string{"u2"}, State: VMTerminating}}
		}, "for no reclaim operation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := fixture()
			tt.prep(st)
			got := Violations(st, now)
			if tt.want == "" && len(got) > 0 || tt.want != "" && (len(got) != 1 || !strings.Contains(got[0], tt.want)) {
				t.Fatalf("violations = %q, want one containing %q", got, tt.want)
			}
		})
	}
}

func TestOperationEnd(t *testing.T) {
	done := func(o Outcome) VMOutcome { return VMOutcome{Outcome: o, At: now} }
	tests := []struct {
		name     string
		outcomes map[string]VMOutcome
		ended    bool
		state    OperationState
	}{
		{"nothing yet", map[string]VMOutcome{}, false, OpCompleted},
		{"one of two", map[string]VMOutcome{"a": done(OutcomeTerminated)}, false, OpCompleted},
		{"all terminated or gone", map[string]VMOutcome{"a": done(OutcomeTerminated), "b": done(OutcomeAlreadyGone)}, true, OpCompleted},
		{"one failed", map[string]VMOutcome{"a": done(OutcomeTerminated), "b": done(OutcomeFailed)}, true, OpFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op := Operation{VMIDs: []string{"a", "b"}, Outcomes: tt.outcomes}
			if op.Ended() != tt.ended || op.EndState() != tt.state {
				t.Fatalf("ended=%v state=%s, want %v %s", op.Ended(), op.EndState(), tt.ended, tt.state)
			}
		})
	}
}
