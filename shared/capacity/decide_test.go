package capacity

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestAuthorisationMatrix(t *testing.T) {
	roles := []struct {
		name   string
		p      Principal
		access Access
	}{
		{"operator", principal("platform", true), AccessManage},
		{"owner", principal("owner", false), AccessManage},
		{"managing", principal("mgr", false), AccessManage},
		{"audience", principal("aud", false), AccessView},
		{"stranger", principal("other", false), AccessNone},
	}
	terms := []struct {
		name string
		at   time.Time
		in   bool
	}{
		{"before term", t0.Add(-time.Second), false},
		{"at start", t0, true},
		{"inside term", now, true},
		{"at end", t0.Add(30 * 24 * time.Hour), false},
	}
	statuses := []Status{StatusPending, StatusActive, StatusExpired, StatusCancelled, StatusNeedsReview}
	for _, role := range roles {
		for _, perm := range []bool{true, false} {
			for _, status := range statuses {
				for _, term := range terms {
					for _, topoMatch := range []bool{true, false} {
						name := fmt.Sprintf("%s/perm=%v/%s/%s/topo=%v", role.name, perm, status, term.name, topoMatch)
						t.Run(name, func(t *testing.T) {
							st := fixture()
							st.Reservations[0].Status = status
							if !topoMatch {
								st.Node.TopologyGen++
							}
							p := role.p
							if perm {
								p.Permissions = []string{PermCapacity}
							}
							// The documented order of checks decides the one expected outcome.
							var want Code
							switch {
							case !perm, role.access == AccessNone:
								want = CodeNotFound
							case role.access == AccessView:
								want = CodeForbidden
							case status != StatusActive:
								want = CodeReservationNotActive
							case !term.in:
								want = CodeOutsideTerm
							case !topoMatch:
								want = CodeTopologyChanged
							}
							for _, decide := range []func() error{
								func() error {
									_, err := DecideReclaim(p, st, CapacityRequest{ReservationID: "r1", UnitIDs: []string{"u1"}}, term.at)
									return err
								},
								func() error {
									_, err := DecideRelease(p, st, CapacityRequest{ReservationID: "r1", UnitIDs: []string{"u1"}}, term.at)
									return err
								},
							} {
								err := decide()
								if want == "" && err != nil {
									t.Fatalf("want success, got %v", err)
								}
								if want != "" && ErrorCode(err) != want {
									t.Fatalf("want %s, got %v", want, err)
								}
							}
						})
					}
				}
			}
		}
	}
}

func TestNotFoundIsIndistinguishable(t *testing.T) {
	st := fixture()
	cases := map[string]error{}
	_, cases["no permission"] = DecideReclaim(principal("owner", false), st, CapacityRequest{ReservationID: "r1", UnitIDs: []string{"u1"}}, now)
	_, cases["no reservation"] = DecideReclaim(principal("owner", false, PermCapacity), st, CapacityRequest{ReservationID: "r9", UnitIDs: []string{"u1"}}, now)
	_, cases["stranger"] = DecideReclaim(principal("other", false, PermCapacity), st, CapacityRequest{ReservationID: "r1", UnitIDs: []string{"u1"}}, now)
	want := notFound().Error()
	for name, err := range cases {
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %v, want %s", name, err, want)
		}
	}
}

func TestDecideReclaimVictims(t *testing.T) {
	owner := principal("owner", false, PermCapacity)
	tests := []struct {
		name           string
		units          []string
		wantReleased   []string
		wantTerminated []string
		wantSkipped    []string
		wantChanges    bool
		wantCode       Code
		wantBadUnits   []string
	}{
		{"one released unit with a spot VM", []string{"u2"}, []string{"u3", "u4", "u5"}, []string{"vm-spot-a"}, nil, true, "", nil},
		{"VM spanning a reclaimed and an unreserved unit goes whole", []string{"u3"}, []string{"u2", "u4", "u5"}, []string{"vm-spot-b"}, nil, true, "", nil},
		{"non-spot VM is skipped", []string{"u4"}, []string{"u2", "u3", "u5"}, nil, []string{"vm-od"}, true, "", nil},
		{"terminating VM is not evicted twice", []string{"u5"}, []string{"u2", "u3", "u4"}, nil, nil, true, "", nil},
		{"already exclusive units are a no-op", []string{"u0", "u1"}, []string{"u2", "u3", "u4", "u5"}, nil, []string{"vm-res"}, false, "", nil},
		{"everything", []string{"u0", "u1", "u2", "u3", "u4", "u5"}, []string{}, []string{"vm-spot-a", "vm-spot-b"}, []string{"vm-od", "vm-res"}, true, "", nil},
		{"units outside the reservation", []string{"u2", "u6", "u9"}, nil, nil, nil, false, CodeUnitsNotReserved, []string{"u6", "u9"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := DecideReclaim(owner, fixture(), CapacityRequest{ReservationID: "r1", UnitIDs: tt.units}, now)
			if tt.wantCode != "" {
				var e *Error
				if ErrorCode(err) != tt.wantCode || !asError(err, &e) || !slices.Equal(e.UnitIDs, tt.wantBadUnits) {
					t.Fatalf("got %v, want %s naming %v", err, tt.wantCode, tt.wantBadUnits)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(plan.Released, tt.wantReleased) {
				t.Errorf("released = %v, want %v", plan.Released, tt.wantReleased)
			}
			if got := VMIDs(plan.Victims); !slices.Equal(got, nonNil(tt.wantTerminated)) {
				t.Errorf("terminated = %v, want %v", got, tt.wantTerminated)
			}
			if got := VMIDs(plan.Skipped); !slices.Equal(got, nonNil(tt.wantSkipped)) {
				t.Errorf("skipped = %v, want %v", got, tt.wantSkipped)
			}
			if plan.Changes() != tt.wantChanges {
				t.Errorf("changes = %v, want %v", plan.Changes(), tt.wantChanges)
			}
		})
	}
}

func TestDecideRelease(t *testing.T) {
	owner := principal("owner", false, PermCapacity)
	tests := []struct {
		name     string
		units    []string
		want     []string
		wantCode Code
		wantBad  []string
	}{
		{"idle exclusive unit", []string{"u1"}, []string{"u1", "u2", "u3", "u4", "u5"}, "", nil},
		{"already released is a no-op", []string{"u2"}, []string{"u2", "u3", "u4", "u5"}, "", nil},
		{"unit with a reserved VM on it", []string{"u0", "u1"}, nil, CodeUnitsInUse, []string{"u0"}},
		{"unit not reserved", []string{"u7"}, nil, CodeUnitsNotReserved, []string{"u7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := DecideRelease(owner, fixture(), CapacityRequest{ReservationID: "r1", UnitIDs: tt.units}, now)
			if tt.wantCode != "" {
				var e *Error
				if !asError(err, &e) || e.Code != tt.wantCode || !slices.Equal(e.UnitIDs, tt.wantBad) {
					t.Fatalf("got %v, want %s naming %v", err, tt.wantCode, tt.wantBad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(plan.Released, tt.want) {
				t.Errorf("released = %v, want %v", plan.Released, tt.want)
			}
		})
	}
}

func TestDecidePlacement(t *testing.T) {
	sched := principal("platform", true, PermPlace)
	free := func(st *NodeState) { st.VMs = nil } // every unit free
	tests := []struct {
		name     string
		p        Principal
		prep     func(*NodeState)
		tier     Tier
		org      string
		units    []string
		wantCode Code
	}{
		{"spot on a released unit", sched, free, TierSpot, "x", []string{"u2"}, ""},
		{"spot on an unreserved unit", sched, free, TierSpot, "x", []string{"u7"}, ""},
		{"spot on exclusive reserved capacity", sched, free, TierSpot, "x", []string{"u1"}, CodeUnitsUnavailable},
		{"spot on a needs-review reservation's released unit", sched, func(st *NodeState) {
			free(st)
			st.Reservations[0].Status = StatusNeedsReview
		}, TierSpot, "x", []string{"u2"}, CodeUnitsUnavailable},
		{"spot on released unit after topology change", sched, func(st *NodeState) {
			free(st)
			st.Node.TopologyGen++
		}, TierSpot, "x", []string{"u2"}, CodeUnitsUnavailable},
		{"spot on an expired reservation's unit", sched, func(st *NodeState) {
			free(st)
			st.Reservations[0].Status = StatusExpired
		}, TierSpot, "x", []string{"u1"}, ""},
		{"reserved for the audience on an exclusive unit", sched, free, TierReserved, "aud", []string{"u1"}, ""},
		{"reserved for the audience on a released unit", sched, free, TierReserved, "aud", []string{"u2"}, CodeUnitsUnavailable},
		{"reserved for an org outside the audience", sched, free, TierReserved, "mgr", []string{"u1"}, CodeUnitsUnavailable},
		{"reserved on an unreserved unit", sched, free, TierReserved, "aud", []string{"u7"}, CodeUnitsUnavailable},
		{"on-demand on an unreserved unit", sched, free, TierOnDemand, "z", []string{"u7"}, ""},
		{"on-demand on a released unit", sched, free, TierOnDemand, "z", []string{"u2"}, CodeUnitsUnavailable},
		{"occupied by a running VM", sched, nil, TierSpot, "x", []string{"u2"}, CodeUnitsInUse},
		{"occupied by a terminating VM", sched, nil, TierSpot, "x", []string{"u5"}, CodeUnitsInUse},
		{"unknown unit", sched, free, TierSpot, "x", []string{"u99"}, CodeUnknownUnits},
		{"VM id taken", sched, func(st *NodeState) {
			st.VMs = []VM{{ID: "vm-new", State: VMTerminated, UnitIDs: []string{"u7"}}}
		}, TierSpot, "x", []string{"u7"}, CodeVMExists},
		{"not an operator", principal("owner", false, PermPlace), free, TierSpot, "x", []string{"u7"}, CodeNotFound},
		// A unit reserved by two reservations that both hold it is nobody's to use until the
		// overlap is resolved, whatever either of them grants.
		{"spot on a unit released by one of two holders", sched, twoHolders, TierSpot, "x", []string{"u2"}, CodeUnitsUnavailable},
		{"reserved on a unit exclusive to both holders' audience", sched, twoHolders, TierReserved, "aud", []string{"u1"}, CodeUnitsUnavailable},
		{"on-demand on a unit of two holders", sched, twoHolders, TierOnDemand, "z", []string{"u2"}, CodeUnitsUnavailable},
		{"second reservation expired: spot on the released unit", sched, func(st *NodeState) {
			twoHolders(st)
			st.Reservations[1].Status = StatusExpired
		}, TierSpot, "x", []string{"u2"}, ""},
		{"second reservation ended: reserved on the exclusive unit", sched, func(st *NodeState) {
			twoHolders(st)
			st.Reservations[1].EndsAt = ptr(now)
		}, TierReserved, "aud", []string{"u1"}, ""},
		// A reservation that starts later does not hold its units yet. Until it starts they
		// take spot VMs only, which a reclaim evicts at the start; a reserved or on-demand VM
		// would keep the units from the reservation.
		{"spot on a unit of a reservation starting later", sched, startsLater(StatusPending), TierSpot, "x", []string{"u7"}, ""},
		{"spot on a unit of an active reservation starting later", sched, startsLater(StatusActive), TierSpot, "x", []string{"u7"}, ""},
		{"on-demand on a unit of a reservation starting later", sched, startsLater(StatusPending), TierOnDemand, "z", []string{"u7"}, CodeUnitsUnavailable},
		{"reserved on a unit of a reservation starting later", sched, startsLater(StatusActive), TierReserved, "aud", []string{"u7"}, CodeUnitsUnavailable},
		{"spot on a unit of a needs-review reservation starting later", sched, startsLater(StatusNeedsReview), TierSpot, "x", []string{"u7"}, CodeUnitsUnavailable},
		{"spot on a unit of a pending reservation that has started", sched, func(st *NodeState) {
			startsLater(StatusPending)(st)
			st.Reservations[1].StartsAt = now
		}, TierSpot, "x", []string{"u7"}, CodeUnitsUnavailable},
		{"operator without vm.place", principal("platform", true, PermCapacity), free, TierSpot, "x", []string{"u7"}, CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := fixture()
			if tt.prep != nil {
				tt.prep(st)
			}
			vm, err := DecidePlacement(tt.p, st, PlacementRequest{NodeID: "n1", VMID: "vm-new", OrgID: tt.org, Tier: tt.tier, UnitIDs: tt.units}, now)
			if ErrorCode(err) != tt.wantCode && !(tt.wantCode == "" && err == nil) {
				t.Fatalf("got %v, want %q", err, tt.wantCode)
			}
			if tt.wantCode == "" && (vm.State != VMRunning || vm.Tier != tt.tier || vm.NodeID != "n1") {
				t.Fatalf("placed %+v", vm)
			}
		})
	}
}

// twoHolders adds r2, an active reservation of u1 and u2 for the same audience, overlapping
// r1 on both (u2 released by r1 only); every unit is free.
func twoHolders(st *NodeState) {
	st.VMs = nil
	st.Reservations = append(st.Reservations, Reservation{
		ID: "r2", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u1", "u2"},
		StartsAt: t0, Status: StatusActive, TopologyGen: 3, Version: 1,
	})
}

// startsLater adds r2 with the status, reserving the unreserved u7 from a day after now.
func startsLater(status Status) func(*NodeState) {
	return func(st *NodeState) {
		st.VMs = nil
		st.Reservations = append(st.Reservations, Reservation{
			ID: "r2", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u7"},
			StartsAt: now.Add(24 * time.Hour), Status: status, TopologyGen: 3, Version: 1,
		})
	}
}

func TestValidatePlacementRequest(t *testing.T) {
	ok := PlacementRequest{NodeID: "n1", VMID: "vm-1", OrgID: "org-1", Tier: TierSpot, UnitIDs: []string{"u1", "u2"}}
	with := func(f func(*PlacementRequest)) PlacementRequest {
		r := ok
		f(&r)
		return r
	}
	tests := []struct {
		name string
		req  PlacementRequest
		want Code
	}{
		{"ok", ok, ""},
		{"reserved", with(func(r *PlacementRequest) { r.Tier = TierReserved }), ""},
		{"on-demand", with(func(r *PlacementRequest) { r.Tier = TierOnDemand }), ""},
		{"vmId at the length limit", with(func(r *PlacementRequest) { r.VMID = strings.Repeat("v", MaxIDLen) }), ""},
		{"no tier", with(func(r *PlacementRequest) { r.Tier = "" }), CodeInvalidRequest},
		{"tier in another case", with(func(r *PlacementRequest) { r.Tier = "Spot" }), CodeInvalidRequest},
		{"unknown tier", with(func(r *PlacementRequest) { r.Tier = "preemptible" }), CodeInvalidRequest},
		{"no vmId", with(func(r *PlacementRequest) { r.VMID = "" }), CodeInvalidRequest},
		{"vmId too long", with(func(r *PlacementRequest) { r.VMID = strings.Repeat("v", MaxIDLen+1) }), CodeInvalidRequest},
		{"vmId ..", with(func(r *PlacementRequest) { r.VMID = ".." }), CodeInvalidRequest},
		{"vmId with a slash", with(func(r *PlacementRequest) { r.VMID = "vm/1" }), CodeInvalidRequest},
		{"vmId with a space", with(func(r *PlacementRequest) { r.VMID = "vm 1" }), CodeInvalidRequest},
		{"no orgId", with(func(r *PlacementRequest) { r.OrgID = "" }), CodeInvalidRequest},
		{"orgId with a hash", with(func(r *PlacementRequest) { r.OrgID = "org#1" }), CodeInvalidRequest},
		{"no units", with(func(r *PlacementRequest) { r.UnitIDs = nil }), CodeInvalidRequest},
		{"duplicate unit", with(func(r *PlacementRequest) { r.UnitIDs = []string{"u1", "u1"} }), CodeInvalidRequest},
		{"bad Idempotency-Key", with(func(r *PlacementRequest) { r.IdempotencyKey = "k\n" }), CodeInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if (tt.want == "" && err != nil) || (tt.want != "" && ErrorCode(err) != tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"n1": true, "gpu-0": true, "rcl_01J9ZK": true, "node.a:1": true, strings.Repeat("a", MaxIDLen): true,
		"": false, ".": false, "..": false, "-a": false, "_a": false, "a/b": false, "a b": false, "a#b": false,
		"é": false, "a\x00": false, strings.Repeat("a", MaxIDLen+1): false, strings.Repeat("a", 2048): false,
	} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestValidateCapacityRequest(t *testing.T) {
	many := make([]string, MaxUnits+1)
	for i := range many {
		many[i] = fmt.Sprintf("u%d", i)
	}
	tests := []struct {
		name string
		req  CapacityRequest
		want Code
	}{
		{"ok", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}}, ""},
		{"64 units", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: many[:MaxUnits]}, ""},
		{"65 units", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: many}, CodeInvalidRequest},
		{"no units", CapacityRequest{NodeID: "n1", ReservationID: "r1"}, CodeInvalidRequest},
		{"duplicate unit", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1", "u1"}}, CodeInvalidRequest},
		{"empty unit id", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{""}}, CodeInvalidRequest},
		{"unit id with a space", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u 1"}}, CodeInvalidRequest},
		{"reason too long", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, Reason: string(make([]byte, MaxReasonLen+1))}, CodeInvalidRequest},
		{"reason not UTF-8", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, Reason: "\xff"}, CodeInvalidRequest},
		{"idempotency key with space", CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, IdempotencyKey: "a b"}, CodeInvalidRequest},
		{"malformed node id names nothing", CapacityRequest{NodeID: "../x", ReservationID: "r1", UnitIDs: []string{"u1"}}, CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if (tt.want == "" && err != nil) || (tt.want != "" && ErrorCode(err) != tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
}

func asError(err error, target **Error) bool { return errors.As(err, target) }

// TestPlanCommit pins down the one place a reclaim or release plan becomes writes, an answer
// and an audit record, for both actions.
func TestPlanCommit(t *testing.T) {
	owner := principal("owner", false, PermCapacity)
	st := fixture()
	read := st.Reservations[0] // r1 as read: released u2..u5, version 4
	vm := func(id string) VM {
		for _, v := range st.VMs {
			if v.ID == id {
				return v
			}
		}
		t.Fatalf("no VM %s in the fixture", id)
		return VM{}
	}
	after := func(released ...string) *Reservation {
		r := read
		r.ReleasedUnitIDs, r.UpdatedAt = released, now
		return &r
	}
	answered := func(r *Reservation) Reservation { r2 := *r; r2.Version++; return r2 }
	base := AuditRecord{ID: "aud-1", Time: now, ActorKeyID: "key-owner", CallerOrgID: "owner", NodeID: "n1", ReservationID: "r1", TopologyGen: 3}
	audit := func(action string, units, releasedAfter, terminated, skipped []string, reclaimID string, dryRun bool) AuditRecord {
		a := base
		a.Action, a.UnitIDs, a.DryRun = action, units, dryRun
		a.ReleasedBefore, a.ReleasedAfter = read.ReleasedUnitIDs, releasedAfter
		a.Terminated, a.Skipped, a.ReclaimID, a.Outcome = terminated, skipped, reclaimID, "ok"
		return a
	}
	none := []string{}
	tests := []struct {
		name       string
		action     string
		units      []string
		dryRun     bool
		wantCommit *Commit // without Audit: it must equal wantAudit
		wantResult CapacityResult
		wantAudit  AuditRecord
	}{
		{
			name: "reclaim with victims", action: ActionReclaim, units: []string{"u2", "u3"},
			wantCommit: &Commit{
				Node: st.Node, BumpNode: true, Reservation: after("u4", "u5"),
				Evict: []VM{vm("vm-spot-a"), vm("vm-spot-b")},
				Operation: &Operation{
					ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: OpPendingStart,
					VMIDs: []string{"vm-spot-a", "vm-spot-b"}, UnitIDs: []string{"u2", "u3"}, CreatedAt: now, UpdatedAt: now,
					TerminateAfter: now, OwnerOrgID: "owner",
					Victims: []Victim{{VMID: "vm-spot-a", OrgID: "x", UnitIDs: []string{"u2"}}, {VMID: "vm-spot-b", OrgID: "y", UnitIDs: []string{"u3", "u6"}}},
				},
			},
			wantResult: CapacityResult{
				Reservation: answered(after("u4", "u5")), ReclaimID: "rcl_1",
				Terminated: []string{"vm-spot-a", "vm-spot-b"}, Skipped: none, TerminateAfter: now,
			},
			wantAudit: withVictims(audit(ActionReclaim, []string{"u2", "u3"}, []string{"u4", "u5"}, []string{"vm-spot-a", "vm-spot-b"}, none, "rcl_1", false),
				Victim{VMID: "vm-spot-a", OrgID: "x", UnitIDs: []string{"u2"}}, Victim{VMID: "vm-spot-b", OrgID: "y", UnitIDs: []string{"u3", "u6"}}),
		},
		{
			name: "reclaim that changes nothing only checks the node", action: ActionReclaim, units: []string{"u0", "u1"},
			wantCommit: &Commit{Node: st.Node},
			wantResult: CapacityResult{Reservation: read, Terminated: none, Skipped: []string{"vm-res"}},
			wantAudit:  audit(ActionReclaim, []string{"u0", "u1"}, read.ReleasedUnitIDs, none, []string{"vm-res"}, "", false),
		},
		{
			name: "release", action: ActionRelease, units: []string{"u1"},
			wantCommit: &Commit{Node: st.Node, BumpNode: true, Reservation: after("u1", "u2", "u3", "u4", "u5")},
			wantResult: CapacityResult{Reservation: answered(after("u1", "u2", "u3", "u4", "u5")), Terminated: none, Skipped: none},
			wantAudit:  audit(ActionRelease, []string{"u1"}, []string{"u1", "u2", "u3", "u4", "u5"}, none, none, "", false),
		},
		{
			name: "dry run: no commit, the same answer without the change", action: ActionReclaim, units: []string{"u2", "u0"}, dryRun: true,
			// The plan's ETag (v2) over node n1, r1 at version 4, topologyGen 3, units u0,u2, released after, grace, T and S.
			wantResult: CapacityResult{Reservation: read, DryRun: true, Terminated: []string{"vm-spot-a"}, Skipped: []string{"vm-res"},
				PlanETag: `"a798c53a317bd5dc9ab96e541614b69a"`},
			wantAudit: withVictims(audit(ActionReclaim, []string{"u2", "u0"}, read.ReleasedUnitIDs, []string{"vm-spot-a"}, []string{"vm-res"}, "", true),
				Victim{VMID: "vm-spot-a", OrgID: "x", UnitIDs: []string{"u2"}}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := DecideCapacity(tt.action, owner, fixture(), CapacityRequest{ReservationID: "r1", UnitIDs: tt.units, DryRun: tt.dryRun}, now)
			if err != nil {
				t.Fatal(err)
			}
			in := base
			in.Action, in.UnitIDs, in.DryRun = tt.action, tt.units, tt.dryRun
			c, result, gotAudit := plan.Commit("rcl_1", in, now)
			if !reflect.DeepEqual(gotAudit, tt.wantAudit) {
				t.Errorf("audit:\n got %+v\nwant %+v", gotAudit, tt.wantAudit)
			}
			if !reflect.DeepEqual(result, tt.wantResult) {
				t.Errorf("result:\n got %+v\nwant %+v", result, tt.wantResult)
			}
			if tt.wantCommit == nil {
				if c != nil {
					t.Fatalf("commit = %+v, want none", c)
				}
				return
			}
			want := *tt.wantCommit
			want.Audit = tt.wantAudit
			if c == nil || !reflect.DeepEqual(*c, want) {
				t.Errorf("commit:\n got %+v\nwant %+v", c, want)
			}
		})
	}
}

func TestDecideCapacityUnknownAction(t *testing.T) {
	if _, err := DecideCapacity(ActionPlace, principal("owner", false, PermCapacity), fixture(), CapacityRequest{ReservationID: "r1", UnitIDs: []string{"u1"}}, now); err == nil {
		t.Fatal("DecideCapacity(place) succeeded, want an error")
	}
}

func withVictims(a AuditRecord, v ...Victim) AuditRecord {
	a.Victims = v
	return a
}
