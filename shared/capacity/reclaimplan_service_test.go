package capacity_test

import (
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// TestReclaimPlanChangesNothingAndIsAudited plans on the world (r1: u0 exclusive under
// reserved v0, u1 released under spot s1, u2 released idle), then reclaims exactly that plan
// with If-Match. u0 is already the reservation's: never counted, always named as such.
func TestReclaimPlanChangesNothingAndIsAudited(t *testing.T) {
	tests := []struct {
		name      string
		p         capacity.Principal
		count     int
		units     []string
		terminate []string
		code      capacity.Code
		audited   bool
	}{
		{"one unit: the idle one", owner, 1, []string{"u2"}, []string{}, "", true},
		{"two units: evicts the spot VM", owner, 2, []string{"u2", "u1"}, []string{"s1"}, "", true},
		{"three: u0 is already exclusive", owner, 3, nil, nil, capacity.CodeInsufficientUnits, true},
		{"the audience may not", audi, 1, nil, nil, capacity.CodeForbidden, true},
		{"a stranger learns nothing", capacity.Principal{OrgID: "x", Permissions: []string{capacity.PermCapacity}}, 1, nil, nil, capacity.CodeNotFound, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			before := env.StateItems(t)
			req := capacity.ReclaimPlanRequest{NodeID: "n1", ReservationID: "r1", Count: tt.count, Reason: "need gpus"}
			plan, err := svc.PlanReclaim(ctx, tt.p, req, capacity.RequestMeta{RequestID: "req-plan"})
			if capacity.ErrorCode(err) != tt.code && (tt.code != "" || err != nil) {
				t.Fatalf("err = %v, want %q", err, tt.code)
			}
			if !reflect.DeepEqual(env.StateItems(t), before) {
				t.Fatal("planning changed the state table")
			}
			audit := env.Items(t, env.Store.AuditTable)
			if (len(audit) == 1) != tt.audited {
				t.Fatalf("audit records = %d, audited = %v", len(audit), tt.audited)
			}
			if tt.code != "" {
				return
			}
			if !auditDryRun(t, audit[0]) {
				t.Error("the plan's audit record is not marked dryRun")
			}
			if !slices.Equal(plan.UnitIDs, tt.units) || !slices.Equal(plan.Terminated, tt.terminate) || plan.PlanETag == "" || !plan.DryRun {
				t.Fatalf("plan = %+v", plan)
			}
			if !slices.Equal(plan.AlreadyYours, []string{"u0"}) {
				t.Errorf("already yours = %v, want [u0]", plan.AlreadyYours)
			}
			// The plan's ETag admits the reclaim of exactly its units.
			rc := reclaim(plan.UnitIDs...)
			rc.Reason, rc.IfMatch = req.Reason, plan.PlanETag
			res, err := svc.Reclaim(ctx, tt.p, rc, capacity.RequestMeta{})
			if err != nil {
				t.Fatalf("reclaim of the plan: %v", err)
			}
			if !slices.Equal(res.Terminated, tt.terminate) {
				t.Errorf("reclaim terminated %v, the plan said %v", res.Terminated, tt.terminate)
			}
		})
	}
}
