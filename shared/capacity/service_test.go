package capacity_test

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

var (
	quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
	t0    = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	owner = capacity.Principal{KeyID: "k-owner", OrgID: "owner", Permissions: []string{capacity.PermCapacity}}
	audi  = capacity.Principal{KeyID: "k-aud", OrgID: "aud", Permissions: []string{capacity.PermCapacity}}
	sched = capacity.Principal{KeyID: "k-sched", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermPlace}}
)

// world: node n1 with units u0..u3; r1 reserves u0..u2 and has released u1, u2; spot VM s1
// runs on u1, reserved VM v0 on u0.
func world(t *testing.T) (*dynamotest.Env, *capacity.Service) {
	t.Helper()
	env := dynamotest.New(t)
	seed := dynamo.Seed{
		Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: []string{"u0", "u1", "u2", "u3"}, Version: 1}},
		Reservations: []capacity.Reservation{{
			ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u0", "u1", "u2"},
			ReleasedUnitIDs: []string{"u1", "u2"}, StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, Version: 1,
		}},
		VMs: []capacity.VM{
			{ID: "s1", NodeID: "n1", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u1"}, State: capacity.VMRunning, Version: 1},
			{ID: "v0", NodeID: "n1", OrgID: "aud", Tier: capacity.TierReserved, UnitIDs: []string{"u0"}, State: capacity.VMRunning, Version: 1},
		},
	}
	if err := env.Store.Put(context.Background(), seed); err != nil {
		t.Fatal(err)
	}
	return env, &capacity.Service{Store: env.Store, Now: func() time.Time { return t0.Add(time.Hour) }, Logger: quiet}
}

func reclaim(units ...string) capacity.CapacityRequest {
	return capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: units}
}

func TestReclaimEvictsAndCommits(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	res, err := svc.Reclaim(ctx, owner, reclaim("u0", "u1"), capacity.RequestMeta{RequestID: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Terminated, []string{"s1"}) || !slices.Equal(res.Skipped, []string{"v0"}) || res.ReclaimID == "" {
		t.Fatalf("result = %+v", res)
	}
	if !slices.Equal(res.Reservation.ReleasedUnitIDs, []string{"u2"}) {
		t.Errorf("released after = %v, want [u2]", res.Reservation.ReleasedUnitIDs)
	}
	st, _ := env.Store.LoadNode(ctx, "n1", "")
	for _, vm := range st.VMs {
		want := map[string]capacity.VMState{"s1": capacity.VMTerminating, "v0": capacity.VMRunning}[vm.ID]
		if vm.State != want {
			t.Errorf("VM %s is %s, want %s", vm.ID, vm.State, want)
		}
	}
	// A retry of the same reclaim succeeds and evicts nothing new.
	again, err := svc.Reclaim(ctx, owner, reclaim("u0", "u1"), capacity.RequestMeta{})
	if err != nil || len(again.Terminated) != 0 || again.ReclaimID != "" {
		t.Fatalf("retry: %+v, %v", again, err)
	}
}

func TestDryRunChangesNothingButAudit(t *testing.T) {
	env, svc := world(t)
	before := env.Items(t, env.Store.Table)
	req := reclaim("u1", "u0")
	req.DryRun = true
	res, err := svc.Reclaim(context.Background(), owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || !slices.Equal(res.Terminated, []string{"s1"}) || !slices.Equal(res.Skipped, []string{"v0"}) {
		t.Fatalf("dry run = %+v", res)
	}
	if !reflect.DeepEqual(env.Items(t, env.Store.Table), before) {
		t.Fatal("dry run changed the state table")
	}
	audit := env.Items(t, env.Store.AuditTable)
	if len(audit) != 1 || audit[0]["DryRun"] == nil {
		t.Fatalf("audit = %v, want one dry-run record", audit)
	}
}

func TestIdempotencyKey(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	req := reclaim("u1")
	req.IdempotencyKey = "key-1"
	first, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	state := env.Items(t, env.Store.Table)
	second, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Replayed || second.ReclaimID != first.ReclaimID || !slices.Equal(second.Terminated, first.Terminated) {
		t.Fatalf("replay = %+v, want the first result %+v", second, first)
	}
	if !reflect.DeepEqual(env.Items(t, env.Store.Table), state) {
		t.Fatal("a replay wrote to the state table")
	}
	other := reclaim("u2")
	other.IdempotencyKey = "key-1"
	if _, err := svc.Reclaim(ctx, owner, other, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeIdempotencyKeyReused {
		t.Fatalf("different request under the same key: got %v", err)
	}
	// Keys are scoped to the caller's org: another org's identical key is a new request.
	mgr := capacity.Principal{OrgID: "platform", Operator: true, Permissions: []string{capacity.PermCapacity}}
	if res, err := svc.Reclaim(ctx, mgr, other, capacity.RequestMeta{}); err != nil || res.Replayed {
		t.Fatalf("other org, same key: %+v %v", res, err)
	}
	// An expired record no longer binds the key.
	svc.Now = func() time.Time { return t0.Add(26 * time.Hour) }
	if res, err := svc.Reclaim(ctx, owner, other, capacity.RequestMeta{}); err != nil || res.Replayed {
		t.Fatalf("after expiry: %+v %v", res, err)
	}
}

// racingStore lets a competing write land between the service's read and its commit.
type racingStore struct {
	capacity.Store
	before func()
}

func (s *racingStore) Commit(ctx context.Context, c capacity.Commit) error {
	if s.before != nil {
		s.before()
		s.before = nil
	}
	return s.Store.Commit(ctx, c)
}

func TestReclaimRedecidesAfterLosingARace(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	other := &capacity.Service{Store: env.Store, Now: svc.Now, Logger: quiet}
	// While the reclaim of u2 is being decided, the scheduler places a spot VM on u2.
	svc.Store = &racingStore{Store: env.Store, before: func() {
		_, err := other.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
		if err != nil {
			t.Errorf("concurrent placement: %v", err)
		}
	}}
	res, err := svc.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Terminated, []string{"s2"}) {
		t.Fatalf("terminated = %v: the re-decision must evict the VM placed during the race", res.Terminated)
	}
}

func TestReclaimGivesUpAfterBoundedAttempts(t *testing.T) {
	env, svc := world(t)
	calls := 0
	svc.Store = &alwaysConflict{Store: env.Store, calls: &calls}
	before := env.Items(t, env.Store.Table)
	_, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeConcurrentModification {
		t.Fatalf("got %v, want concurrent_modification", err)
	}
	if calls != 3 {
		t.Errorf("commit attempts = %d, want 3", calls)
	}
	if !reflect.DeepEqual(env.Items(t, env.Store.Table), before) {
		t.Fatal("state changed")
	}
}

type alwaysConflict struct {
	capacity.Store
	calls *int
}

func (s *alwaysConflict) Commit(context.Context, capacity.Commit) error {
	*s.calls++
	return capacity.ErrConflict
}

func TestRefusalsChangeNothingAndAreAudited(t *testing.T) {
	tests := []struct {
		name      string
		p         capacity.Principal
		req       capacity.CapacityRequest
		want      capacity.Code
		audited   bool
		reclaimFn bool
	}{
		{"audience may not reclaim", audi, reclaim("u1"), capacity.CodeForbidden, true, true},
		{"unit outside the reservation", owner, reclaim("u3"), capacity.CodeUnitsNotReserved, true, true},
		{"release of a unit in use", owner, reclaim("u0"), capacity.CodeUnitsInUse, true, false},
		{"no permission", capacity.Principal{OrgID: "owner"}, reclaim("u1"), capacity.CodeNotFound, false, true},
		{"stranger", capacity.Principal{OrgID: "x", Permissions: []string{capacity.PermCapacity}}, reclaim("u1"), capacity.CodeNotFound, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			before := env.Items(t, env.Store.Table)
			call := svc.Reclaim
			if !tt.reclaimFn {
				call = svc.Release
			}
			_, err := call(context.Background(), tt.p, tt.req, capacity.RequestMeta{})
			if capacity.ErrorCode(err) != tt.want {
				t.Fatalf("got %v, want %s", err, tt.want)
			}
			if !reflect.DeepEqual(env.Items(t, env.Store.Table), before) {
				t.Fatal("a refused call changed the state table")
			}
			if n := len(env.Items(t, env.Store.AuditTable)); (n == 1) != tt.audited {
				t.Fatalf("audit records = %d, audited = %v", n, tt.audited)
			}
		})
	}
}

func TestReleaseThenSpotPlacement(t *testing.T) {
	_, svc := world(t)
	ctx := context.Background()
	_, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s9", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("spot on a released unit: %v", err)
	}
	if _, err := svc.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	_, err = svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s10", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u1"}}, capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeUnitsInUse {
		t.Fatalf("spot on a unit whose evicted VM still terminates: got %v", err)
	}
	res, err := svc.Release(ctx, owner, reclaim("u2"), capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeUnitsInUse {
		t.Fatalf("release of a unit with a terminating VM: %+v %v", res, err)
	}
}

// startCounter records the operations whose workflow the service starts.
type startCounter struct{ started []string }

func (w *startCounter) Start(_ context.Context, op capacity.Operation) error {
	w.started = append(w.started, op.ID)
	return nil
}

// A twin request under the same Idempotency-Key commits while this one decides: this one
// replays the twin's answer and starts no workflow for the operation it never committed.
func TestLostRaceToATwinStartsNoWorkflow(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	req := reclaim("u1")
	req.IdempotencyKey = "twin"
	twin := &capacity.Service{Store: env.Store, Now: svc.Now, Logger: quiet}
	var twinRes *capacity.CapacityResult
	svc.Store = &racingStore{Store: env.Store, before: func() {
		var err error
		if twinRes, err = twin.Reclaim(ctx, owner, req, capacity.RequestMeta{}); err != nil {
			t.Errorf("twin: %v", err)
		}
	}}
	wf := &startCounter{}
	svc.Workflow = wf
	res, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.ReclaimID != twinRes.ReclaimID {
		t.Fatalf("result = %+v, want the twin's %s replayed", res, twinRes.ReclaimID)
	}
	if len(wf.started) != 0 {
		t.Fatalf("started %v for an operation that was never committed", wf.started)
	}
}
