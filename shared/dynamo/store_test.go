package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// seed is one node with units u0..u<n-1>, reservation r1 reserving all of them with the first
// `released` released, and one running spot VM per released unit.
func seed(n, released int) dynamo.Seed {
	units := make([]string, n)
	for i := range units {
		units[i] = fmt.Sprintf("u%d", i)
	}
	s := dynamo.Seed{
		Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: units, Version: 1}},
		Reservations: []capacity.Reservation{{
			ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: []string{"mgr"},
			ReservedUnitIDs: units, ReleasedUnitIDs: slices.Clone(units[:released]),
			StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, CreatedAt: t0, UpdatedAt: t0, Version: 1,
		}},
	}
	for i := range released {
		s.VMs = append(s.VMs, capacity.VM{
			ID: fmt.Sprintf("vm%02d", i), NodeID: "n1", OrgID: "spotbuyer", Tier: capacity.TierSpot,
			UnitIDs: []string{units[i]}, State: capacity.VMRunning, CreatedAt: t0, UpdatedAt: t0, Version: 1,
		})
	}
	return s
}

func newEnv(t *testing.T, s dynamo.Seed) *dynamotest.Env {
	t.Helper()
	env := dynamotest.New(t)
	if err := env.Store.Put(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return env
}

func TestLoadNodeReadsThePartition(t *testing.T) {
	s := seed(4, 2)
	s.VMs = append(s.VMs, capacity.VM{ID: "vm-old", NodeID: "n1", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}, State: capacity.VMTerminated, Version: 3})
	env := newEnv(t, s)
	st, err := env.Store.LoadNode(context.Background(), "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	want := s.Nodes[0]
	want.AuditHead.Start = capacity.ChainStartOf(nil) // a seeded node's chain starts empty, pinned
	if !reflect.DeepEqual(st.Node, want) {
		t.Errorf("node = %+v, want %+v", st.Node, want)
	}
	if len(st.Reservations) != 1 || !reflect.DeepEqual(st.Reservations[0], s.Reservations[0]) {
		t.Errorf("reservations = %+v, want %+v", st.Reservations, s.Reservations)
	}
	if got := capacity.VMIDs(st.VMs); !slices.Equal(got, []string{"vm00", "vm01"}) {
		t.Errorf("VMs = %v: terminated VMs must be filtered out", got)
	}
	if _, err := env.Store.LoadNode(context.Background(), "nope", ""); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("missing node: got %v, want not_found", err)
	}
}

func reclaimCommit(st *capacity.NodeState, vms []capacity.VM) capacity.Commit {
	r := st.Reservations[0]
	r.ReleasedUnitIDs = []string{}
	r.UpdatedAt = t0.Add(time.Hour)
	return capacity.Commit{
		Node: st.Node, BumpNode: true, Reservation: &r, Evict: vms,
		Operation: &capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpPendingStart, VMIDs: capacity.VMIDs(vms), CreatedAt: t0},
		Audit:     capacity.AuditRecord{ID: "a1", Time: t0, NodeID: "n1", Action: capacity.ActionReclaim, Outcome: "ok"},
	}
}

func TestCommitWritesEverythingOrNothing(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(4, 2))
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	stale := reclaimCommit(st, st.VMs)
	stale.Reservation.Version-- // decided on a reservation that has changed since
	beforeState, beforeAudit := env.Items(t, env.Store.Table), env.Items(t, env.Store.AuditTable)
	if err := env.Store.Commit(ctx, stale); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("stale commit: got %v, want ErrConflict", err)
	}
	if !reflect.DeepEqual(env.Items(t, env.Store.Table), beforeState) || !reflect.DeepEqual(env.Items(t, env.Store.AuditTable), beforeAudit) {
		t.Fatal("a failed condition left writes behind")
	}

	if err := env.Store.Commit(ctx, reclaimCommit(st, st.VMs)); err != nil {
		t.Fatal(err)
	}
	after, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	if after.Node.Version != st.Node.Version+1 || after.Reservations[0].Version != 2 || len(after.Reservations[0].ReleasedUnitIDs) != 0 {
		t.Errorf("node/reservation not updated: %+v %+v", after.Node, after.Reservations[0])
	}
	for _, vm := range after.VMs {
		if vm.State != capacity.VMTerminating || vm.ReclaimID != "rcl_1" || vm.Version != 2 {
			t.Errorf("VM %s = %+v, want terminating for rcl_1", vm.ID, vm)
		}
	}
	if n := len(env.Items(t, env.Store.AuditTable)); n != 1 {
		t.Errorf("audit records = %d, want 1", n)
	}
	// The same decision again must fail: its versions are spent.
	if err := env.Store.Commit(ctx, reclaimCommit(st, st.VMs)); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("replayed commit: got %v, want ErrConflict", err)
	}
}

// One reclaim is 1 read (and, with an Idempotency-Key, the caller's record read alongside,
// under its scope and its legacy one),
// 1 transaction and 1 workflow start, counted at the SDK, for the largest reclaim allowed: 64
// units under 64 different spot VMs, in one transaction.
func TestLargestReclaimFitsOneTransaction(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(capacity.MaxUnits, capacity.MaxUnits))
	svc := &capacity.Service{Store: env.Store, Now: func() time.Time { return t0.Add(time.Hour) }, Workflow: env.Workflow(t)}
	units := make([]string, capacity.MaxUnits)
	for i := range units {
		units[i] = fmt.Sprintf("u%d", i)
	}
	owner := capacity.Principal{OrgID: "owner", Permissions: []string{capacity.PermCapacity}}
	env.Calls.Reset()
	res, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: units, IdempotencyKey: "k1"}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Terminated) != capacity.MaxUnits {
		t.Fatalf("terminated %d VMs, want %d", len(res.Terminated), capacity.MaxUnits)
	}
	if got := env.Calls.Snapshot(); got["Query"] != 1 || got["GetItem"] != 2 || got["TransactWriteItems"] != 1 || got["StartExecution"] != 1 || len(got) != 4 {
		t.Errorf("SDK calls = %v, want 1 Query, 2 GetItem (the idempotency record, under both scopes), 1 TransactWriteItems, 1 StartExecution", got)
	}
}

func TestCommitRefusesMoreThanDynamoDBAllows(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(2, 1))
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	vms := make([]capacity.VM, dynamo.MaxTransactItems)
	for i := range vms {
		vms[i] = st.VMs[0]
	}
	before := env.Items(t, env.Store.Table)
	if err := env.Store.Commit(ctx, reclaimCommit(st, vms)); err == nil || errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("got %v, want a size error", err)
	}
	if !reflect.DeepEqual(env.Items(t, env.Store.Table), before) {
		t.Fatal("an oversized commit wrote something")
	}
}

// TestLandedFindsOnlyItsOwnRecord: "did the commit whose answer was lost land?" is answered by
// that commit's own audit record, wherever on the chain after the head it read the store
// put it, never by another call's record that took the slot right after that head.
func TestLandedFindsOnlyItsOwnRecord(t *testing.T) {
	tests := []struct {
		name   string
		before []string // records other calls chain after the head "mine" read, in order
		mine   bool     // "mine" is then committed (on its stale head: the store chains it after them)
		want   bool
	}{
		{name: "mine right after the head", mine: true, want: true},
		{name: "nothing after the head", want: false},
		{name: "another call's record in the slot, mine nowhere", before: []string{"other-1"}, want: false},
		{name: "another call's record in the slot, mine after it", before: []string{"other-1"}, mine: true, want: true},
		{name: "other calls' records in the slot and after it, mine nowhere", before: []string{"other-1", "other-2"}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, seed(2, 0))
			ctx := context.Background()
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			mine := capacity.Commit{Node: st.Node, Audit: opAudit("mine", "n1")}
			for _, id := range tt.before {
				now, err := env.Store.LoadNode(ctx, "n1", "")
				if err != nil {
					t.Fatal(err)
				}
				if err := env.Store.Commit(ctx, capacity.Commit{Node: now.Node, Audit: opAudit(id, "n1")}); err != nil {
					t.Fatalf("commit %s: %v", id, err)
				}
			}
			if tt.mine {
				if err := env.Store.Commit(ctx, mine); err != nil {
					t.Fatalf("commit mine: %v", err)
				}
			}
			landed, err := env.Store.Landed(ctx, mine)
			if err != nil || landed != tt.want {
				t.Fatalf("Landed = %v, %v; want %v", landed, err, tt.want)
			}
		})
	}
}
