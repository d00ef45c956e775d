package capacity

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// viewFixture is fixture() with u8 reserved by r1, released and idle, so that every unit state
// shows: u0 occupied (vm-res, reserved), u1 exclusive, u2 spot, u3 spot (vm-spot-b, which
// also stands on unreserved u6), u4 occupied (vm-od), u5 terminating, u6 spot unreserved, u7
// unreserved, u8 released.
func viewFixture() *NodeState {
	st := fixture()
	st.Node.UnitIDs = append(st.Node.UnitIDs, "u8")
	r := &st.Reservations[0]
	r.ReservedUnitIDs = append(r.ReservedUnitIDs, "u8")
	r.ReleasedUnitIDs = append(r.ReleasedUnitIDs, "u8")
	for i := range st.VMs {
		st.VMs[i].CreatedAt, st.VMs[i].UpdatedAt = t0, t0.Add(time.Duration(i)*time.Minute)
	}
	return st
}

// describeUnit is one unit of a view as "<unit> <state> <reservation>/<mode> <vm>@<org>".
func describeUnit(u UnitView) string {
	s := fmt.Sprintf("%s %s %s/%s", u.UnitID, u.State, u.ReservationID, u.ReservationMode)
	if u.VM != nil {
		s += fmt.Sprintf(" %s@%s", u.VM.ID, u.VM.OrgID)
	}
	return s
}

func TestUnitStates(t *testing.T) {
	tests := []struct {
		name string
		edit func(*NodeState)
		want []string
	}{
		{"every state", nil, []string{
			"u0 occupied r1/exclusive vm-res@aud",
			"u1 exclusive r1/exclusive",
			"u2 spot r1/released vm-spot-a@x",
			"u3 spot r1/released vm-spot-b@y",
			"u4 occupied r1/released vm-od@z",
			"u5 terminating r1/released vm-gone@x",
			"u6 spot / vm-spot-b@y",
			"u7 unreserved /",
			"u8 released r1/released",
		}},
		{"an ended reservation holds nothing", func(st *NodeState) { st.Reservations[0].EndsAt = ptr(now.Add(-time.Second)) }, []string{
			"u0 occupied / vm-res@aud", "u1 unreserved /", "u2 spot / vm-spot-a@x", "u3 spot / vm-spot-b@y",
			"u4 occupied / vm-od@z", "u5 terminating / vm-gone@x", "u6 spot / vm-spot-b@y", "u7 unreserved /", "u8 unreserved /",
		}},
		{"a cancelled one neither", func(st *NodeState) { st.Reservations[0].Status = StatusCancelled }, []string{
			"u0 occupied / vm-res@aud", "u1 unreserved /", "u2 spot / vm-spot-a@x", "u3 spot / vm-spot-b@y",
			"u4 occupied / vm-od@z", "u5 terminating / vm-gone@x", "u6 spot / vm-spot-b@y", "u7 unreserved /", "u8 unreserved /",
		}},
		{"an upcoming one not yet", func(st *NodeState) { st.Reservations[0].StartsAt = now.Add(time.Hour) }, []string{
			"u0 occupied / vm-res@aud", "u1 unreserved /", "u2 spot / vm-spot-a@x", "u3 spot / vm-spot-b@y",
			"u4 occupied / vm-od@z", "u5 terminating / vm-gone@x", "u6 spot / vm-spot-b@y", "u7 unreserved /", "u8 unreserved /",
		}},
		{"a needs-review one still does", func(st *NodeState) { st.Reservations[0].Status = StatusNeedsReview }, []string{
			"u0 occupied r1/exclusive vm-res@aud", "u1 exclusive r1/exclusive", "u2 spot r1/released vm-spot-a@x",
			"u3 spot r1/released vm-spot-b@y", "u4 occupied r1/released vm-od@z", "u5 terminating r1/released vm-gone@x",
			"u6 spot / vm-spot-b@y", "u7 unreserved /", "u8 released r1/released",
		}},
		{"a terminated VM stands on nothing", func(st *NodeState) { st.VMs[0].State = VMTerminated }, []string{
			"u0 occupied r1/exclusive vm-res@aud", "u1 exclusive r1/exclusive", "u2 released r1/released",
			"u3 spot r1/released vm-spot-b@y", "u4 occupied r1/released vm-od@z", "u5 terminating r1/released vm-gone@x",
			"u6 spot / vm-spot-b@y", "u7 unreserved /", "u8 released r1/released",
		}},
	}
	owner := principal("owner", false, PermRead)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := viewFixture()
			if tt.edit != nil {
				tt.edit(st)
			}
			v, ok := UnitsView(owner, st, now)
			if !ok {
				t.Fatal("the owner does not see its node")
			}
			var got []string
			for _, u := range v.Units {
				got = append(got, describeUnit(u))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("units\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
			}
		})
	}
	// Every state is told by the first case.
	v, _ := UnitsView(owner, viewFixture(), now)
	seen := map[UnitState]bool{}
	for _, u := range v.Units {
		seen[u.State] = true
	}
	for _, s := range UnitStates {
		if !seen[s] {
			t.Errorf("state %s not shown by the fixture", s)
		}
	}
}

func TestUnitsViewVisibility(t *testing.T) {
	all := []string{"u0 vm-res@aud", "u1", "u2 vm-spot-a@x", "u3 vm-spot-b@y", "u4 vm-od@z", "u5 vm-gone@x", "u6 vm-spot-b@y", "u7", "u8"}
	tests := []struct {
		name   string
		p      Principal
		want   []string // "<unit> <vmId>@<orgId>" as seen; nil: the node's 404
		access Access
	}{
		{"operator with node.manage", principal("platform", true, PermNodeManage), all, AccessManage},
		{"operator with reservation.read", principal("platform", true, PermRead), all, AccessManage},
		{"operator with audit.read", principal("platform", true, PermAuditRead), all, AccessManage},
		{"operator with reservation.capacity", principal("platform", true, PermCapacity), all, AccessManage},
		{"operator with vm.place only", principal("platform", true, PermPlace), nil, AccessNone},
		{"operator with key.manage only", principal("platform", true, PermKeyManage), nil, AccessNone},
		{"owner with reservation.read", principal("owner", false, PermRead), all, AccessManage},
		{"owner with reservation.capacity", principal("owner", false, PermCapacity), all, AccessManage},
		{"owner with vm.place only", principal("owner", false, PermPlace), nil, AccessNone},
		// The managing org: r1's units, every VM id on them, no VM's org (none is its own).
		{"managing org", principal("mgr", false, PermRead, PermCapacity),
			[]string{"u0 vm-res@", "u1", "u2 vm-spot-a@", "u3 vm-spot-b@", "u4 vm-od@", "u5 vm-gone@", "u8"}, AccessManage},
		// The audience: r1's units, only its own org's VM by id and org.
		{"audience", principal("aud", false, PermRead),
			[]string{"u0 vm-res@aud", "u1", "u2 @", "u3 @", "u4 @", "u5 @", "u8"}, AccessView},
		{"audience without a read permission", principal("aud", false, PermPlace), nil, AccessNone},
		// A buyer whose VMs stand on the node sees nothing of it.
		{"buyer", principal("x", false, PermRead, PermCapacity), nil, AccessNone},
		{"stranger", principal("stranger", false, PermRead, PermCapacity), nil, AccessNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, ok := UnitsView(tt.p, viewFixture(), now)
			if ok != (tt.want != nil) {
				t.Fatalf("visible = %v, want %v", ok, tt.want != nil)
			}
			if !ok {
				return
			}
			var got []string
			for _, u := range v.Units {
				s := u.UnitID
				if u.VM != nil {
					s += " " + u.VM.ID + "@" + u.VM.OrgID
					if u.VM.Since.IsZero() || u.VM.Tier == "" || u.VM.State == "" {
						t.Errorf("%s: VM without tier, state or since: %+v", u.UnitID, *u.VM)
					}
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("units\n got %v\nwant %v", got, tt.want)
			}
			if len(v.Reservations) != 1 || v.Reservations[0].ID != "r1" || v.Reservations[0].Access != tt.access {
				t.Errorf("reservations %+v, want r1 with access %v", v.Reservations, tt.access)
			}
		})
	}
}

// An org named on the node only by an ended reservation still sees the node (as it sees the
// reservation in the node's list) but no unit; the ended reservation is not listed.
func TestUnitsViewOfAnEndedReservation(t *testing.T) {
	st := viewFixture()
	st.Reservations[0].EndsAt = ptr(now.Add(-time.Hour))
	v, ok := UnitsView(principal("aud", false, PermRead), st, now)
	if !ok || len(v.Units) != 0 || len(v.Reservations) != 0 {
		t.Errorf("visible %v, view %+v", ok, v)
	}
}

// The node list's check of each candidate: a former owner no longer sees the node.
func TestNodeVisibleTo(t *testing.T) {
	st := viewFixture()
	tests := []struct {
		org  string
		want bool
	}{{"owner", true}, {"mgr", true}, {"aud", true}, {"x", false}, {"former-owner", false}}
	for _, tt := range tests {
		if got := nodeVisibleTo(principal(tt.org, false, PermRead), st); got != tt.want {
			t.Errorf("%s: visible %v, want %v", tt.org, got, tt.want)
		}
	}
}

func TestNodeListAdmission(t *testing.T) {
	tests := []struct {
		p    Principal
		all  bool
		want bool // admitted
	}{
		{principal("platform", true, PermNodeManage), true, true},
		{principal("platform", true, PermAuditRead), true, true},
		{principal("platform", true, PermReservationManage), false, false},
		{principal("platform", true, PermPlace), false, false},
		{principal("owner", false, PermRead), false, true},
		{principal("owner", false, PermCapacity), false, true},
		{principal("owner", false, PermPlace), false, false},
		// The operator flag widens nothing without a permission that reads.
		{principal("owner", false, PermNodeManage), false, false},
	}
	for _, tt := range tests {
		if got := seesAllNodes(tt.p); got != tt.all {
			t.Errorf("%+v: sees all %v, want %v", tt.p, got, tt.all)
		}
		if got := AdmitNodeList(tt.p) == nil; got != tt.want {
			t.Errorf("%+v: admitted %v, want %v", tt.p, got, tt.want)
		}
	}
}
