package capacity_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// writeKeys records, for every write the store's client sends, the partition keys it names.
type writeKeys struct {
	mu    sync.Mutex
	calls []writeCall
}

type writeCall struct {
	op  string
	pks []string
}

func (w *writeKeys) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("RecordWriteKeys",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			var pks []string
			pk := func(item map[string]types.AttributeValue) {
				s, _ := item["pk"].(*types.AttributeValueMemberS)
				if s == nil {
					pks = append(pks, "")
					return
				}
				pks = append(pks, s.Value)
			}
			write := true
			switch p := in.Parameters.(type) {
			case *dynamodb.TransactWriteItemsInput:
				for _, it := range p.TransactItems {
					switch {
					case it.Put != nil:
						pk(it.Put.Item)
					case it.Update != nil:
						pk(it.Update.Key)
					case it.Delete != nil:
						pk(it.Delete.Key)
					case it.ConditionCheck != nil:
						pk(it.ConditionCheck.Key)
					}
				}
			case *dynamodb.PutItemInput:
				pk(p.Item)
			case *dynamodb.UpdateItemInput:
				pk(p.Key)
			case *dynamodb.DeleteItemInput:
				pk(p.Key)
			case *dynamodb.BatchWriteItemInput:
				pks = append(pks, "") // never used: it would name items of any node
			default:
				write = false
			}
			if write {
				w.mu.Lock()
				w.calls = append(w.calls, writeCall{awsmiddleware.GetOperationName(ctx), pks})
				w.mu.Unlock()
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
}

// nodeOf is the node a key of the state or audit table belongs to: pk NODE#<node> or
// NODE#<node>#...; "" for any other key (an item shared between nodes).
func nodeOf(pk string) string {
	rest, ok := strings.CutPrefix(pk, "NODE#")
	if !ok {
		return ""
	}
	node, _, _ := strings.Cut(rest, "#")
	return node
}

func twoNodeSeed() dynamo.Seed {
	var s dynamo.Seed
	for _, n := range []string{"n1", "n2"} {
		s.Nodes = append(s.Nodes, capacity.Node{ID: n, OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: []string{"u0", "u1", "u2", "u3"}, Version: 1})
		s.Reservations = append(s.Reservations, capacity.Reservation{
			ID: "r1", NodeID: n, AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u0", "u1", "u2"},
			ReleasedUnitIDs: []string{"u1", "u2"}, StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, Version: 1,
		})
		s.VMs = append(s.VMs, capacity.VM{ID: "s1", NodeID: n, OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u1"}, State: capacity.VMRunning, Version: 1})
	}
	return s
}

// Writes scale out with nodes by construction: across placements, reclaims (with and without
// an Idempotency-Key), terminations, failed and completed ends, re-drives, releases, and the
// reconciler's starts, restarts and failures on two nodes, every write (each action of a
// transaction, each single-item write) names keys of exactly one node, and never an item
// shared between nodes.
func TestEveryWriteStaysOnOneNode(t *testing.T) {
	rec := &writeKeys{}
	env := dynamotest.New(t, dynamotest.WithAPIOptions(rec.middleware))
	ctx := context.Background()
	if err := env.Store.Put(ctx, twoNodeSeed()); err != nil {
		t.Fatal(err)
	}
	rec.calls = nil // the seed's puts are provisioning, one item each: not the subject
	wf := &capacitytest.Workflow{}
	svc := &capacity.Service{Store: env.Store, Workflow: wf, Now: func() time.Time { return t0.Add(time.Hour) }, Logger: quiet}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, node := range []string{"n1", "n2"} {
		req := func(key string, units ...string) capacity.CapacityRequest {
			return capacity.CapacityRequest{NodeID: node, ReservationID: "r1", UnitIDs: units, IdempotencyKey: key}
		}
		place := func(vm, unit string) {
			_, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: node, VMID: vm, OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{unit}}, capacity.RequestMeta{})
			must(err)
		}
		// Reclaim two VMs; one is refused for good, so the operation fails; a re-drive then
		// completes it.
		place("a", "u2")
		res, err := svc.Reclaim(ctx, owner, req("k-"+node, "u1", "u2"), capacity.RequestMeta{})
		must(err)
		op, err := env.Store.GetOperation(ctx, node, res.ReclaimID)
		must(err)
		runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{Permanent: map[string]bool{"a": true}}, Logger: quiet}, op, 2)
		_, err = svc.Redrive(ctx, owner, node, "r1", op.ID, capacity.RequestMeta{})
		must(err)
		task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: node, VMIDs: []string{"a"}, ExecutionARN: "arn:" + op.ID + "-2", Attempt: 2, MaxRounds: 2}
		if r, err := (&capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Logger: quiet}).Run(ctx, task); err != nil || !r.Done {
			t.Fatalf("re-driven round = %+v, %v", r, err)
		}
		reportStep(t, env.Store, op, 2)
		if op, err = env.Store.GetOperation(ctx, node, op.ID); err != nil || op.State != capacity.OpCompleted {
			t.Fatalf("operation %+v, %v: want completed after the re-drive", op, err)
		}
		_, err = svc.Release(ctx, owner, req("", "u1", "u2"), capacity.RequestMeta{})
		must(err)
		// The reconciler starts, restarts and finally fails an operation whose executions close.
		place("b", "u1")
		svc.Workflow = nil
		res, err = svc.Reclaim(ctx, owner, req("", "u1"), capacity.RequestMeta{})
		must(err)
		svc.Workflow = wf
		clock := t0.Add(time.Hour + 2*time.Minute)
		recon := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, MaxRestarts: 1, Logger: quiet,
			Now: func() time.Time { return clock }}
		for _, name := range []string{"", res.ReclaimID, res.ReclaimID + "-2"} {
			if name != "" {
				wf.Close(name)
				clock = clock.Add(2 * time.Minute)
			}
			_, err := recon.Run(ctx)
			must(err)
		}
		if op, err := env.Store.GetOperation(ctx, node, res.ReclaimID); err != nil || op.State != capacity.OpFailed {
			t.Fatalf("operation %+v, %v: want failed by the reconciler", op, err)
		}
	}

	kinds := map[string]int{}
	for _, c := range rec.calls {
		kinds[c.op]++
		nodes := map[string]bool{}
		for _, pk := range c.pks {
			nodes[nodeOf(pk)] = true
		}
		if len(nodes) != 1 || nodes[""] {
			t.Errorf("%s names keys %v: want keys of exactly one node", c.op, c.pks)
		}
	}
	for _, op := range []string{"TransactWriteItems", "PutItem", "UpdateItem"} {
		if kinds[op] == 0 {
			t.Errorf("no %s among the writes %v: the run does not cover it", op, kinds)
		}
	}
	t.Logf("writes checked: %v", kinds)
}

// The decision read does not grow with a node's history: after cycles of place, reclaim,
// terminate and release, LoadNode reads as many items and bytes as on the fresh node, GET of
// every finished operation still works, and terminated VMs and ended operations carry an
// expiry of at least 90 days.
func TestDecisionReadIgnoresHistory(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	read := func() capacity.Snapshot {
		c, stats := capacity.WithCallStats(ctx)
		if _, err := env.Store.LoadNode(c, "n1", ""); err != nil {
			t.Fatal(err)
		}
		return stats.Snapshot()
	}
	// The fresh node, in the shape it has at the start of every cycle: s1 running on u1. A
	// reclaim and a release of the idle u2 first put the audit chain's head on the node item,
	// as every cycle leaves it.
	for _, call := range []func(context.Context, capacity.Principal, capacity.CapacityRequest, capacity.RequestMeta) (*capacity.CapacityResult, error){svc.Reclaim, svc.Release} {
		if _, err := call(ctx, owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
	}
	fresh := read()
	if fresh.ItemsRead != 4 || fresh.BytesRead == 0 {
		t.Fatalf("fresh node read %d items, %d bytes: want node, reservation, 2 VMs", fresh.ItemsRead, fresh.BytesRead)
	}
	var ops []string
	for i := range 5 {
		res, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{})
		if err != nil {
			t.Fatal(err)
		}
		op, err := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
		if err != nil {
			t.Fatal(err)
		}
		runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Logger: quiet}, op, 2)
		ops = append(ops, op.ID)
		if _, err := svc.Release(ctx, owner, reclaim("u1"), capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
		// A new VM, under a new id, on the released unit: the node is back in shape.
		vm := fmt.Sprintf("s%d", i+2)
		if _, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: vm, OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u1"}}, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
	}
	if after := read(); after.ItemsRead != fresh.ItemsRead || after.BytesRead > fresh.BytesRead+fresh.BytesRead/10 {
		t.Errorf("after 5 cycles LoadNode read %d items, %d bytes; fresh %d, %d", after.ItemsRead, after.BytesRead, fresh.ItemsRead, fresh.BytesRead)
	}
	for _, id := range ops {
		if op, err := env.Store.GetOperation(ctx, "n1", id); err != nil || op.State != capacity.OpCompleted || len(op.Outcomes) != 1 {
			t.Errorf("GET %s = %+v, %v: want completed with its outcome", id, op, err)
		}
	}
	minExpiry := t0.Add(time.Hour + dynamo.MinRetention).Unix()
	history, ended := 0, 0
	for _, it := range env.Items(t, env.Store.Table) {
		pk, typ := attrString(it["pk"]), attrString(it["type"])
		isHistory := strings.HasSuffix(pk, "#HIST")
		if isHistory {
			history++
		}
		if typ == "operation" || typ == "outcome" {
			ended++
		}
		if !isHistory && typ != "operation" && typ != "outcome" {
			continue
		}
		n, ok := it["expiresAt"].(*types.AttributeValueMemberN)
		if !ok {
			t.Errorf("%s %s has no expiry", pk, attrString(it["sk"]))
			continue
		}
		var exp int64
		fmt.Sscan(n.Value, &exp)
		if exp < minExpiry && typ != "outcome" { // an outcome item goes a day after it, folded into its operation
			t.Errorf("%s %s expires at %s, before 90 days", pk, attrString(it["sk"]), time.Unix(exp, 0).UTC())
		}
	}
	if history != 5 || ended != 10 {
		t.Errorf("%d history items and %d operation items, want 5 and 10 (5 operations, 5 outcomes)", history, ended)
	}
	// VM ids stay taken while history remembers them.
	_, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s1", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeVMExists {
		t.Errorf("placing s1 again: %v, want vm_exists", err)
	}
}
