package capacity_test

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
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
	if err := env.Store.Put(context.Background(), worldSeed()); err != nil {
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
	if audit := env.Items(t, env.Store.AuditTable); len(audit) != 1 || auditDryRun(t, audit[0]) {
		t.Errorf("audit = %v, want one record not marked dryRun", audit)
	}
	// A retry of the same reclaim succeeds and evicts nothing new.
	again, err := svc.Reclaim(ctx, owner, reclaim("u0", "u1"), capacity.RequestMeta{})
	if err != nil || len(again.Terminated) != 0 || again.ReclaimID != "" {
		t.Fatalf("retry: %+v, %v", again, err)
	}
}

func TestDryRunChangesNothingButAudit(t *testing.T) {
	env, svc := world(t)
	before := env.StateItems(t)
	req := reclaim("u1", "u0")
	req.DryRun = true
	res, err := svc.Reclaim(context.Background(), owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || !slices.Equal(res.Terminated, []string{"s1"}) || !slices.Equal(res.Skipped, []string{"v0"}) {
		t.Fatalf("dry run = %+v", res)
	}
	if !reflect.DeepEqual(env.StateItems(t), before) {
		t.Fatal("dry run changed the state table")
	}
	audit := env.Items(t, env.Store.AuditTable)
	if len(audit) != 1 || !auditDryRun(t, audit[0]) {
		t.Fatalf("audit = %v, want one record marked dryRun", audit)
	}
}

// auditDryRun returns the value of an audit item's DryRun attribute, which every record has.
func auditDryRun(t *testing.T, item map[string]types.AttributeValue) bool {
	t.Helper()
	v, ok := item["DryRun"].(*types.AttributeValueMemberBOOL)
	if !ok {
		t.Fatalf("audit record has no boolean DryRun: %v", item)
	}
	return v.Value
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
	state := env.StateItems(t)
	second, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Replayed || second.ReclaimID != first.ReclaimID || !slices.Equal(second.Terminated, first.Terminated) {
		t.Fatalf("replay = %+v, want the first result %+v", second, first)
	}
	if !reflect.DeepEqual(env.StateItems(t), state) {
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

// A call whose commit always loses, though its units stay as read (AWS's TransactionConflict
// every time), gives up after a bounded number of rounds, and before its deadline, answering
// concurrent_modification and changing nothing.
func TestReclaimGivesUpAfterBoundedRounds(t *testing.T) {
	tests := []struct {
		name     string
		retry    capacity.RetryPolicy
		deadline time.Duration // 0: none
		commits  func(n int) bool
		want     string
	}{
		{"bounded by Detours", capacity.RetryPolicy{Detours: 5, Base: time.Millisecond, Cap: time.Millisecond}, 0,
			func(n int) bool { return n == 5 }, "5"},
		{"the default bound", capacity.RetryPolicy{Base: time.Millisecond, Cap: time.Millisecond}, 0,
			func(n int) bool { return n == capacity.DefaultDetours }, "DefaultDetours"},
		// Margins wide enough for a loaded machine: a round never takes the margin's second.
		{"bounded by the deadline", capacity.RetryPolicy{Detours: 1000, Base: 20 * time.Millisecond, Cap: 20 * time.Millisecond, Margin: time.Second},
			2 * time.Second, func(n int) bool { return n > 1 && n < 1000 }, "more than one, fewer than Detours"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			calls := 0
			svc.Store, svc.Retry = &alwaysConflict{Store: env.Store, calls: &calls}, tt.retry
			before := env.StateItems(t)
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			_, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{})
			if capacity.ErrorCode(err) != capacity.CodeConcurrentModification {
				t.Fatalf("got %v, want concurrent_modification", err)
			}
			if ctx.Err() != nil {
				t.Errorf("answered after the deadline: %v", ctx.Err())
			}
			if !tt.commits(calls) {
				t.Errorf("commit attempts = %d, want %s", calls, tt.want)
			}
			if !reflect.DeepEqual(env.StateItems(t), before) {
				t.Fatal("state changed")
			}
		})
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
			before := env.StateItems(t)
			call := svc.Reclaim
			if !tt.reclaimFn {
				call = svc.Release
			}
			_, err := call(context.Background(), tt.p, tt.req, capacity.RequestMeta{})
			if capacity.ErrorCode(err) != tt.want {
				t.Fatalf("got %v, want %s", err, tt.want)
			}
			if !reflect.DeepEqual(env.StateItems(t), before) {
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
	wf := &capacitytest.Workflow{}
	svc.Workflow = wf
	res, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.ReclaimID != twinRes.ReclaimID {
		t.Fatalf("result = %+v, want the twin's %s replayed", res, twinRes.ReclaimID)
	}
	if started := wf.Started(); len(started) != 0 {
		t.Fatalf("started %v for an operation that was never committed", started)
	}
}

// The unit ids of a request are a set: a retry that lists them in another order is the same
// request and replays; it is neither refused as a reuse of the key nor applied again.
func TestIdempotencyFingerprintTreatsUnitsAsASet(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	req := reclaim("u1", "u2")
	req.IdempotencyKey = "set-1"
	first, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	state := env.StateItems(t)
	req.UnitIDs = []string{"u2", "u1"}
	again, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("same units in another order: %v", err)
	}
	if !again.Replayed || again.ReclaimID != first.ReclaimID {
		t.Fatalf("retry = %+v, want the first answer (%s) replayed", again, first.ReclaimID)
	}
	if !reflect.DeepEqual(env.StateItems(t), state) {
		t.Fatal("the retry wrote to the state table")
	}
	// A different set under the same key is still a reuse.
	req.UnitIDs = []string{"u2"}
	if _, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeIdempotencyKeyReused {
		t.Fatalf("different units under the same key: got %v", err)
	}
}

// A stored answer is only replayed to a caller who may still make the call: one who lost
// access since gets the 404 (or, still in the audience, the 403), never the stored answer.
func TestReplayComesAfterTheAccessCheck(t *testing.T) {
	op := capacity.Principal{KeyID: "k-op", OrgID: "aud", Operator: true, Permissions: []string{capacity.PermCapacity}}
	tests := []struct {
		name string
		now  capacity.Principal // the same org and key, after its rights changed
		want capacity.Code
	}{
		{"no longer an operator, still in the audience", capacity.Principal{KeyID: "k-op", OrgID: "aud", Permissions: []string{capacity.PermCapacity}}, capacity.CodeForbidden},
		{"lost the permission", capacity.Principal{KeyID: "k-op", OrgID: "aud", Operator: true, Permissions: []string{capacity.PermRead}}, capacity.CodeNotFound},
		{"still an operator", op, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			req := reclaim("u1")
			req.IdempotencyKey = "k"
			if _, err := svc.Reclaim(ctx, op, req, capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
			state := env.StateItems(t)
			res, err := svc.Reclaim(ctx, tt.now, req, capacity.RequestMeta{})
			if tt.want == "" {
				if err != nil || !res.Replayed {
					t.Fatalf("got %+v, %v; want the replay", res, err)
				}
				return
			}
			if capacity.ErrorCode(err) != tt.want {
				t.Fatalf("got %+v, %v; want %s", res, err, tt.want)
			}
			if !reflect.DeepEqual(env.StateItems(t), state) {
				t.Fatal("the refused retry changed the state table")
			}
		})
	}
}

// VM ids are never reused: placing a VM under the id of one that ran on the node and was
// terminated answers vm_exists at once, as for a running one, and writes nothing.
func TestPlacementUnderAnExistingVMID(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	gone := capacity.VM{ID: "old", NodeID: "n1", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}, State: capacity.VMTerminated, Version: 3}
	if err := env.Store.Put(ctx, dynamo.Seed{VMs: []capacity.VM{gone}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, vmID string }{
		{"a terminated VM's id", "old"},
		{"a running VM's id", "s1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			svc.Store = &countCommits{Store: env.Store, calls: &calls}
			before := env.StateItems(t)
			_, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: tt.vmID, OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}}, capacity.RequestMeta{})
			if capacity.ErrorCode(err) != capacity.CodeVMExists {
				t.Fatalf("got %v, want vm_exists", err)
			}
			if calls > 1 {
				t.Errorf("%d commits: a taken id is not a race to retry", calls)
			}
			if !reflect.DeepEqual(env.StateItems(t), before) {
				t.Fatal("the refused placement changed the state table")
			}
		})
	}
}

type countCommits struct {
	capacity.Store
	calls *int
}

func (s *countCommits) Commit(ctx context.Context, c capacity.Commit) error {
	*s.calls++
	return s.Store.Commit(ctx, c)
}

// operationStore answers GetOperation with a fixed operation.
type operationStore struct {
	capacity.Store
	op capacity.Operation
}

func (s *operationStore) GetOperation(_ context.Context, nodeID, opID string) (*capacity.Operation, error) {
	if nodeID != s.op.NodeID || opID != s.op.ID {
		return nil, capacity.Errorf(capacity.CodeNotFound, "no such operation")
	}
	op := s.op
	return &op, nil
}

// The audience may follow a reclaim of its reservation, but not see other orgs' VM ids, the
// execution ARN (account and region) or agent errors (node endpoints): it gets counts.
func TestGetOperationRedactsForTheAudience(t *testing.T) {
	env, svc := world(t)
	at := t0.Add(time.Hour)
	op := capacity.Operation{
		ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpFailed,
		VMIDs: []string{"s1", "s2", "s3", "s4"}, UnitIDs: []string{"u1", "u2"},
		ExecutionARN: "arn:aws:states:eu-west-1:123456789012:execution:terminate:rcl_1",
		Outcomes: map[string]capacity.VMOutcome{
			"s1": {Outcome: capacity.OutcomeTerminated, At: at},
			"s2": {Outcome: capacity.OutcomeAlreadyGone, At: at},
			"s3": {Outcome: capacity.OutcomeFailed, Error: "POST https://10.0.3.7:8443/v2/vms/s3/terminate: connection refused", At: at},
		},
		CreatedAt: t0, UpdatedAt: at,
	}
	svc.Store = &operationStore{Store: env.Store, op: op}
	ctx := context.Background()
	reader := capacity.Principal{KeyID: "k-aud-r", OrgID: "aud", Permissions: []string{capacity.PermRead}}
	for _, p := range []capacity.Principal{audi, reader} {
		view, err := svc.GetOperation(ctx, p, "n1", "r1", "rcl_1")
		if err != nil {
			t.Fatal(err)
		}
		want := capacity.OperationView{
			Operation: capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpFailed,
				UnitIDs: []string{"u1", "u2"}, CreatedAt: t0, UpdatedAt: at},
			Redacted: true,
			Counts:   capacity.OutcomeCounts{Pending: 1, Terminated: 1, AlreadyGone: 1, Failed: 1},
		}
		if !reflect.DeepEqual(*view, want) {
			t.Errorf("%s sees %+v\nwant %+v", p.KeyID, *view, want)
		}
	}
	// Who may move the reservation's capacity sees it whole.
	for _, p := range []capacity.Principal{owner, {OrgID: "platform", Operator: true, Permissions: []string{capacity.PermRead}}} {
		view, err := svc.GetOperation(ctx, p, "n1", "r1", "rcl_1")
		if err != nil {
			t.Fatal(err)
		}
		if view.Redacted || !reflect.DeepEqual(view.Operation, op) {
			t.Errorf("%s sees %+v, want the whole operation", p.OrgID, *view)
		}
	}
}

// A malformed path id names nothing: it is refused with the reservation's 404 before
// anything is read, so it never reaches DynamoDB (where a 2 KB key is a ValidationException).
func TestMalformedPathIDsAreNotFoundBeforeAnyRead(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	long := strings.Repeat("x", capacity.MaxIDLen+1)
	huge := strings.Repeat("r", 2048)
	for _, bad := range []string{"", long, huge, ".", "..", "-x", "a b", "a/b", "n1\x00", "é"} {
		env.Calls.Reset()
		reads := []struct {
			name string
			call func() error
		}{
			{"reclaim node", func() error {
				_, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: bad, ReservationID: "r1", UnitIDs: []string{"u1"}}, capacity.RequestMeta{})
				return err
			}},
			{"release reservation", func() error {
				_, err := svc.Release(ctx, owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: bad, UnitIDs: []string{"u1"}}, capacity.RequestMeta{})
				return err
			}},
			{"get reservation", func() error { _, err := svc.GetReservation(ctx, owner, "n1", bad); return err }},
			{"get operation node", func() error { _, err := svc.GetOperation(ctx, owner, bad, "r1", "rcl_1"); return err }},
			{"get operation id", func() error { _, err := svc.GetOperation(ctx, owner, "n1", "r1", bad); return err }},
		}
		for _, r := range reads {
			if err := r.call(); capacity.ErrorCode(err) != capacity.CodeNotFound || err.Error() != "not_found: reservation not found" {
				t.Errorf("%s %q: got %v, want the reservation's 404", r.name, bad, err)
			}
		}
		if _, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: bad, VMID: "v9", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}}, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
			t.Errorf("place on node %q: got %v, want 404", bad, err)
		}
		if calls := env.Calls.Snapshot(); len(calls) != 0 {
			t.Errorf("id %q reached the store: %v", bad, calls)
		}
	}
}

// Reads report a reservation whose term has ended as expired.
func TestReadsReportExpiredAfterEndsAt(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	end := t0.Add(48 * time.Hour)
	seed := dynamo.Seed{Reservations: []capacity.Reservation{
		{ID: "r-ends", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u3"}, StartsAt: t0, EndsAt: &end, Status: capacity.StatusActive, TopologyGen: 1, Version: 1},
		{ID: "r-later", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u3"}, StartsAt: end, Status: capacity.StatusPending, TopologyGen: 1, Version: 1},
		{ID: "r-cancel", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u3"}, StartsAt: t0, EndsAt: &end, Status: capacity.StatusCancelled, TopologyGen: 1, Version: 1},
	}}
	if err := env.Store.Put(ctx, seed); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id   string
		at   time.Time
		want capacity.Status
	}{
		{"r-ends", end.Add(-time.Second), capacity.StatusActive},
		{"r-ends", end, capacity.StatusExpired},
		{"r-later", end.Add(-time.Second), capacity.StatusPending},
		{"r-cancel", end.Add(time.Hour), capacity.StatusCancelled},
		{"r1", end.Add(time.Hour), capacity.StatusActive}, // open-ended
	}
	for _, tt := range tests {
		svc.Now = func() time.Time { return tt.at }
		r, err := svc.GetReservation(ctx, owner, "n1", tt.id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != tt.want {
			t.Errorf("%s at %s: status %s, want %s", tt.id, tt.at, r.Status, tt.want)
		}
	}
}
