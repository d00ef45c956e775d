package capacity_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// faultyWorld is world (see service_test.go) with the store's client under the fault
// injector; the seed goes in through a client without faults.
func faultyWorld(t *testing.T, seed int64, rules ...awsfault.Rule) (*dynamotest.Env, *capacity.Service, *awsfault.Injector) {
	t.Helper()
	inj := awsfault.New(seed, rules...)
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	plain := env.Clean()
	if err := plain.Put(context.Background(), worldSeed()); err != nil {
		t.Fatal(err)
	}
	return env, &capacity.Service{Store: env.Store, Now: func() time.Time { return t0.Add(time.Hour) }, Logger: quiet}, inj
}

func worldSeed() dynamo.Seed {
	return dynamo.Seed{
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
}

// ambiguous makes every commit time out after it was applied (the SDK's retry of it then
// fails on the state the first attempt left, as it would on AWS past the request token).
var ambiguous = awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1}

// auditsOf returns the audit records of successful calls of an action.
func auditsOf(t *testing.T, env *dynamotest.Env, action string) int {
	t.Helper()
	n := 0
	for _, it := range env.Items(t, env.Store.AuditTable) {
		if s, ok := it["Action"]; ok && attrString(s) == action {
			if o, ok := it["Outcome"]; ok && attrString(o) == "ok" {
				n++
			}
		}
	}
	return n
}

// TestAmbiguousReclaimAnswersWithItsEvictions: a reclaim whose commit landed but whose
// answer was lost, or came back as a server error (DynamoDB's 500: possibly applied), still
// answers with the VMs it evicted, evicts nothing twice and creates one operation.
func TestAmbiguousReclaimAnswersWithItsEvictions(t *testing.T) {
	for _, f := range []awsfault.Fault{awsfault.AmbiguousTimeout, awsfault.InternalServerError} {
		t.Run(string(f), func(t *testing.T) {
			env, svc, inj := faultyWorld(t, 1, awsfault.Rule{Operation: "TransactWriteItems", Fault: f, Rate: 1})
			ctx := context.Background()
			res, err := svc.Reclaim(ctx, owner, reclaim("u1", "u2"), capacity.RequestMeta{})
			if err != nil {
				t.Fatalf("reclaim: %v", err)
			}
			if inj.Count(f) == 0 {
				t.Fatalf("no %s injected", f)
			}
			if !slices.Equal(res.Terminated, []string{"s1"}) || res.ReclaimID == "" {
				t.Fatalf("answer terminated %v reclaim %q, want [s1] and its reclaim id", res.Terminated, res.ReclaimID)
			}
			if len(res.Reservation.ReleasedUnitIDs) != 0 {
				t.Errorf("answer released %v, want none", res.Reservation.ReleasedUnitIDs)
			}
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			for _, vm := range st.VMs {
				if vm.ID == "s1" && (vm.State != capacity.VMTerminating || vm.ReclaimID != res.ReclaimID || vm.Version != 2) {
					t.Errorf("s1 = %+v, want terminating once (version 2) for %s", vm, res.ReclaimID)
				}
			}
			ops := 0
			for _, it := range env.Items(t, env.Store.Table) {
				if attrString(it["type"]) == "operation" {
					ops++
				}
			}
			if ops != 1 {
				t.Errorf("%d operations, want 1", ops)
			}
			if n := auditsOf(t, env, capacity.ActionReclaim); n != 1 {
				t.Errorf("%d successful reclaim audit records, want 1", n)
			}
		})
	}
}

// TestAmbiguousReleaseAnswersWithItsRelease: the answer is the release that landed.
func TestAmbiguousReleaseAnswersWithItsRelease(t *testing.T) {
	env, svc, _ := faultyWorld(t, 2, ambiguous)
	// u2 is released and idle: reclaim it (under the same faults), then release it again.
	if _, err := svc.Reclaim(context.Background(), owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	res, err := svc.Release(context.Background(), owner, reclaim("u2"), capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !slices.Contains(res.Reservation.ReleasedUnitIDs, "u2") {
		t.Errorf("answer released %v, want u2 among them", res.Reservation.ReleasedUnitIDs)
	}
	if n := auditsOf(t, env, capacity.ActionRelease); n != 1 {
		t.Errorf("%d successful release audit records, want 1", n)
	}
}

// TestAmbiguousPlacementAnswersWithItsVM: a placement that landed answers 201 with its VM on
// the retry, not vm_exists or a conflict.
func TestAmbiguousPlacementAnswersWithItsVM(t *testing.T) {
	env, svc, _ := faultyWorld(t, 3, ambiguous)
	res, err := svc.Place(context.Background(), sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s9", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("placement: %v", err)
	}
	if res.VM.ID != "s9" || res.VM.State != capacity.VMRunning {
		t.Errorf("answer %+v, want s9 running", res.VM)
	}
	if n := auditsOf(t, env, capacity.ActionPlace); n != 1 {
		t.Errorf("%d successful placement audit records, want 1", n)
	}
}

// TestThrottledCommitsAnswerThrottled: a write the database keeps throttling applies nothing
// and answers `throttled` (503, retry later), not an internal error.
func TestThrottledCommitsAnswerThrottled(t *testing.T) {
	env, svc, inj := faultyWorld(t, 4, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.Throttling, Rate: 1})
	before := env.Items(t, env.Store.Table)
	_, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeThrottled {
		t.Fatalf("got %v, want throttled", err)
	}
	if inj.Count(awsfault.Throttling) == 0 {
		t.Fatal("nothing injected")
	}
	if after := env.Items(t, env.Store.Table); len(after) != len(before) {
		t.Errorf("items %d -> %d: a throttled call wrote", len(before), len(after))
	}
}

// TestNoChangeCallsAnswerTheStateTheyRead: a call that changes nothing (a reclaim of units
// already exclusive) is decided on a consistent read and writes nothing a commit conditions
// on. A release and a placement landing between its read and its record neither make it go
// again nor fail it: it answers the state it read (u2 exclusive, nothing evicted), which held
// at an instant within the call, as a commit's answer holds at the instant of its commit.
// The node moved by the racing commits only, and every invariant holds.
func TestNoChangeCallsAnswerTheStateTheyRead(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	other := &capacity.Service{Store: env.Store, Now: svc.Now, Logger: quiet}
	// Make u2 exclusive: reclaiming it again changes nothing.
	if _, err := svc.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	before, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	racing := &interleave{Store: env.Store, before: func() {
		if _, err := other.Release(ctx, owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
			t.Errorf("racing release: %v", err)
		}
		if _, err := other.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s7", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{}); err != nil {
			t.Errorf("racing placement: %v", err)
		}
	}}
	svc.Store = racing
	res, err := svc.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if !racing.done {
		t.Fatal("the race was not run")
	}
	if len(res.Terminated) != 0 || slices.Contains(res.Reservation.ReleasedUnitIDs, "u2") || res.Reservation.Version != before.Reservations[0].Version {
		t.Errorf("reclaim answered %+v, want the reservation as read (u2 exclusive, nothing evicted)", res)
	}
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Node.Version != before.Node.Version+2 || st.Node.AuditHead.Seq != before.Node.AuditHead.Seq+2 {
		t.Errorf("node at version %d, changes head %d; want %d and %d (the release and the placement only)",
			st.Node.Version, st.Node.AuditHead.Seq, before.Node.Version+2, before.Node.AuditHead.Seq+2)
	}
	for _, v := range capacity.Violations(st, t0.Add(time.Hour)) {
		t.Error(v)
	}
}

// interleave runs before() once, just before the first commit (or record of a call that
// changed nothing) it passes on.
type interleave struct {
	capacity.Store
	before func()
	done   bool
}

func (s *interleave) Commit(ctx context.Context, c capacity.Commit) error {
	s.run()
	return s.Store.Commit(ctx, c)
}

func (s *interleave) RecordUnchanged(ctx context.Context, rec capacity.AuditRecord, idem *capacity.IdempotencyRecord) error {
	s.run()
	return s.Store.RecordUnchanged(ctx, rec, idem)
}

func (s *interleave) run() {
	if !s.done {
		s.done = true
		s.before()
	}
}

func attrString(v types.AttributeValue) string {
	if s, ok := v.(*types.AttributeValueMemberS); ok {
		return s.Value
	}
	return ""
}
