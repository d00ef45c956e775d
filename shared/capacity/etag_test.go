package capacity_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

func TestETagMatches(t *testing.T) {
	const etag = `"0123abcd"`
	tests := []struct {
		ifMatch string
		want    bool
	}{
		{`"0123abcd"`, true},
		{`0123abcd`, false}, // malformed: never a match (HTTP refuses it with 400)
		{`W/"0123abcd"`, true},
		{`"0123abcd,x"`, false}, // one tag holding a comma, not two
		{`"0123abcd" x`, false},
		{`*`, true},
		{`"other", W/"0123abcd"`, true},
		{` "other" ,"0123abcd" `, true},
		{`"other"`, false},
		{`"0123abc"`, false},
		{`,`, false},
		{`"other", "x"`, false},
	}
	for _, tt := range tests {
		if got := capacity.ETagMatches(tt.ifMatch, etag); got != tt.want {
			t.Errorf("ETagMatches(%q) = %v, want %v", tt.ifMatch, got, tt.want)
		}
	}
}

func dryRun(t *testing.T, svc *capacity.Service, units ...string) *capacity.CapacityResult {
	t.Helper()
	req := reclaim(units...)
	req.DryRun = true
	res, err := svc.Reclaim(context.Background(), owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if res.PlanETag == "" {
		t.Fatal("a dry-run reclaim answered no planEtag")
	}
	return res
}

func withIfMatch(req capacity.CapacityRequest, ifMatch string) capacity.CapacityRequest {
	req.IfMatch = ifMatch
	return req
}

// The plan's ETag names the plan: the same state gives the same ETag, and a real reclaim
// sent with it runs.
func TestPlanETagMatchingCommits(t *testing.T) {
	for _, ifMatch := range []func(etag string) string{
		func(e string) string { return e },
		func(e string) string { return "W/" + e },
		func(e string) string { return `"stale", ` + e },
		func(string) string { return "*" },
	} {
		env, svc := world(t)
		ctx := context.Background()
		first, again := dryRun(t, svc, "u1", "u2"), dryRun(t, svc, "u1", "u2")
		if first.PlanETag != again.PlanETag {
			t.Fatalf("the same state answered ETags %s and %s", first.PlanETag, again.PlanETag)
		}
		res, err := svc.Reclaim(ctx, owner, withIfMatch(reclaim("u1", "u2"), ifMatch(first.PlanETag)), capacity.RequestMeta{})
		if err != nil {
			t.Fatalf("If-Match %s: %v", ifMatch(first.PlanETag), err)
		}
		if !slices.Equal(res.Terminated, []string{"s1"}) || res.PlanETag != "" {
			t.Errorf("result = %+v", res)
		}
		if n := len(env.Items(t, env.Store.AuditTable)); n != 3 {
			t.Errorf("%d audit records, want 3", n)
		}
	}
}

// A change between the dry run and the reclaim refuses the reclaim with the new plan, and
// writes only the refusal's audit record.
func TestPlanETagChanged(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, svc *capacity.Service)
		want   []string // terminated by the new plan
	}{
		{"a placement on a reclaimed unit", func(t *testing.T, svc *capacity.Service) {
			_, err := svc.Place(context.Background(), sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer2",
				Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
		}, []string{"s1", "s2"}},
		{"a version bump alone (another unit reclaimed)", func(t *testing.T, svc *capacity.Service) {
			if _, err := svc.Reclaim(context.Background(), owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
		}, []string{"s1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			units := []string{"u1", "u2"}
			if tt.name != "a placement on a reclaimed unit" {
				units = []string{"u1"}
			}
			before := dryRun(t, svc, units...)
			tt.change(t, svc)
			audits := len(env.Items(t, env.Store.AuditTable))
			_, err := svc.Reclaim(ctx, owner, withIfMatch(reclaim(units...), before.PlanETag), capacity.RequestMeta{})
			var e *capacity.Error
			if !errors.As(err, &e) || e.Code != capacity.CodePlanChanged || e.Plan == nil {
				t.Fatalf("err = %v, want plan_changed with the plan", err)
			}
			now := dryRun(t, svc, units...)
			if !e.Plan.DryRun || e.Plan.PlanETag != now.PlanETag || e.Plan.PlanETag == before.PlanETag ||
				!slices.Equal(e.Plan.Terminated, tt.want) {
				t.Errorf("plan = %+v, want the current dry run %+v", e.Plan, now)
			}
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			for _, vm := range st.VMs {
				if vm.State != capacity.VMRunning {
					t.Errorf("VM %s is %s after a refused reclaim", vm.ID, vm.State)
				}
			}
			// The refusal's record, then the dry run's.
			if n := len(env.Items(t, env.Store.AuditTable)); n != audits+2 {
				t.Errorf("%d audit records after the refusal and a dry run, want %d", n, audits+2)
			}
		})
	}
}

func TestPlanETagReplayAndRelease(t *testing.T) {
	_, svc := world(t)
	ctx := context.Background()
	req := reclaim("u1")
	req.IdempotencyKey = "k1"
	first, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	// A replay answers the stored result whatever If-Match says.
	again, err := svc.Reclaim(ctx, owner, withIfMatch(req, `"stale"`), capacity.RequestMeta{})
	if err != nil || !again.Replayed || again.ReclaimID != first.ReclaimID {
		t.Fatalf("replay with If-Match: %+v, %v", again, err)
	}
	_, err = svc.Release(ctx, owner, withIfMatch(reclaim("u1"), "*"), capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
		t.Errorf("release with If-Match: %v, want invalid_request", err)
	}
}

// A plan's ETag admits only that plan: a dry run of some units, or with some grace, names
// nothing a reclaim of other units or with another grace would do, even when the VMs it
// would terminate and skip are the same. The units are a set: their order does not matter.
func TestPlanETagCoversTheRequest(t *testing.T) {
	tests := []struct {
		name    string
		dry     capacity.CapacityRequest
		real    capacity.CapacityRequest
		matches bool
	}{
		{"same units", reclaim("u1", "u2"), reclaim("u1", "u2"), true},
		{"same units in another order", reclaim("u1", "u2"), reclaim("u2", "u1"), true},
		{"a unit more, same VMs", reclaim("u1"), reclaim("u1", "u2"), false},
		{"a unit less, same VMs", reclaim("u1", "u2"), reclaim("u1"), false},
		{"other grace", reclaim("u1"), withGrace(reclaim("u1"), 30), false},
		{"grace dropped", withGrace(reclaim("u1"), 30), reclaim("u1"), false},
		{"same grace", withGrace(reclaim("u1"), 30), withGrace(reclaim("u1"), 30), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			tt.dry.DryRun = true
			plan, err := svc.Reclaim(ctx, owner, tt.dry, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			before := env.Items(t, env.Store.Table)
			_, err = svc.Reclaim(ctx, owner, withIfMatch(tt.real, plan.PlanETag), capacity.RequestMeta{})
			if tt.matches {
				if err != nil {
					t.Fatalf("the dry run's own plan refused: %v", err)
				}
				return
			}
			if capacity.ErrorCode(err) != capacity.CodePlanChanged {
				t.Fatalf("err = %v, want plan_changed", err)
			}
			if after := env.Items(t, env.Store.Table); len(after) != len(before) {
				t.Errorf("a refused reclaim wrote: %d items, then %d", len(before), len(after))
			}
		})
	}
}

func withGrace(req capacity.CapacityRequest, s int) capacity.CapacityRequest {
	req.GraceSeconds = s
	return req
}
