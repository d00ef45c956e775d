package dynamo_test

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// firstLayout writes items as the first layout did: the domain struct under the key, every
// item of a node in its decision partition.
func firstLayout(t *testing.T, env *dynamotest.Env, pk, sk, typ string, extra map[string]any, v any) {
	t.Helper()
	item, err := attributevalue.MarshalMap(v)
	if err != nil {
		t.Fatal(err)
	}
	item["pk"], item["sk"], item["type"] = &types.AttributeValueMemberS{Value: pk}, &types.AttributeValueMemberS{Value: sk}, &types.AttributeValueMemberS{Value: typ}
	for k, x := range extra {
		av, err := attributevalue.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		item[k] = av
	}
	if _, err := env.Plain.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(env.Store.Table), Item: item}); err != nil {
		t.Fatal(err)
	}
}

// A table of the first layout moves to the live-only layout: a dry run writes nothing, the
// run moves terminated VMs, operations and outcomes with their expiry, a re-run moves nothing
// more, and afterwards the decision read sees live state only while GET of operations works.
func TestMigrateMovesTheFirstLayout(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(4, 2)) // n1 with vm00, vm01 running
	ended := t0.Add(3 * time.Hour)
	gone := capacity.VM{ID: "vm-t", NodeID: "n1", OrgID: "b", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}, State: capacity.VMTerminated, ReclaimID: "rcl_1", CreatedAt: t0, UpdatedAt: ended, Version: 3}
	done := capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpCompleted, VMIDs: []string{"vm-t"}, UnitIDs: []string{"u3"}, CreatedAt: t0, UpdatedAt: ended}
	running := capacity.Operation{ID: "rcl_2", NodeID: "n1", ReservationID: "r1", State: capacity.OpTerminating, VMIDs: []string{"vm-x", "vm-y"}, CreatedAt: t0, UpdatedAt: t0, Attempt: 1}
	firstLayout(t, env, "NODE#n1", "VM#vm-t", "vm", nil, gone)
	firstLayout(t, env, "NODE#n1", "OP#rcl_1", "operation", map[string]any{"gsi1pk": "OPSTATE#completed", "gsi1sk": t0.Format(time.RFC3339Nano) + "#rcl_1", "Outcomes": nil}, done)
	firstLayout(t, env, "NODE#n1", "OP#rcl_1#VM#vm-t", "outcome", map[string]any{"ReclaimID": "rcl_1", "VMID": "vm-t"},
		capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: ended, Attempt: 1})
	firstLayout(t, env, "NODE#n1", "OP#rcl_2", "operation", map[string]any{"gsi1pk": "OPSTATE#terminating", "gsi1sk": t0.Format(time.RFC3339Nano) + "#rcl_2", "Outcomes": nil}, running)
	firstLayout(t, env, "NODE#n1", "OP#rcl_2#VM#vm-x", "outcome", map[string]any{"ReclaimID": "rcl_2", "VMID": "vm-x"},
		capacity.VMOutcome{Outcome: capacity.OutcomeFailed, Error: "old", At: t0, Attempt: 1})
	// Written by the new layout after the deploy, before the migration: it wins.
	newer := capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: ended, Attempt: 1}
	if err := env.Store.RecordOutcome(ctx, running, "vm-x", newer); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Until migrated, a re-run of a termination the first layout recorded still succeeds.
	if err := env.Store.MarkTerminated(ctx, done, "vm-t", ended); err != nil {
		t.Errorf("re-mark a VM terminated in the first layout: %v", err)
	}

	before := env.Items(t, env.Store.Table)
	rep, err := env.Store.Migrate(ctx, true, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if want := (dynamo.MigrationReport{Scanned: 7, TerminatedVMs: 1, Operations: 2, Outcomes: 2}); rep != want {
		t.Errorf("dry run = %+v, want %+v", rep, want)
	}
	if !reflect.DeepEqual(env.Items(t, env.Store.Table), before) {
		t.Fatal("the dry run wrote")
	}

	rep, err = env.Store.Migrate(ctx, false, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if want := (dynamo.MigrationReport{Scanned: 7, TerminatedVMs: 1, Operations: 2, Outcomes: 1, Superseded: 1}); rep != want {
		t.Errorf("run = %+v, want %+v", rep, want)
	}
	if rep, err = env.Store.Migrate(ctx, false, quiet); err != nil || rep.TerminatedVMs+rep.Operations+rep.Outcomes+rep.Superseded != 0 {
		t.Errorf("re-run = %+v, %v: want nothing left to move", rep, err)
	}

	c, stats := capacity.WithCallStats(ctx)
	st, err := env.Store.LoadNode(c, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	if n := stats.Snapshot().ItemsRead; n != 4 || len(st.VMs) != 2 {
		t.Errorf("decision read %d items, VMs %v: want the node, reservation and 2 live VMs", n, capacity.VMIDs(st.VMs))
	}
	op, err := env.Store.GetOperation(ctx, "n1", "rcl_1")
	if err != nil || op.State != capacity.OpCompleted || op.Outcomes["vm-t"].Outcome != capacity.OutcomeTerminated {
		t.Errorf("GET rcl_1 = %+v, %v", op, err)
	}
	op, err = env.Store.GetOperation(ctx, "n1", "rcl_2")
	if err != nil || op.State != capacity.OpTerminating || op.Outcomes["vm-x"] != newer {
		t.Fatalf("GET rcl_2 = %+v, %v: want terminating with the newer outcome", op, err)
	}
	// The moved operation is usable: it ends in place, and the reconciler's index still finds it.
	if ops, _, err := env.Store.OperationsInState(ctx, capacity.OpTerminating, t0.Add(time.Hour), "", 10); err != nil || len(ops) != 1 || ops[0].ID != "rcl_2" {
		t.Errorf("terminating operations = %+v, %v", ops, err)
	}
	if err := env.Store.EndOperation(ctx, *op, capacity.OpCompleted, ended); err != nil {
		t.Errorf("end migrated operation: %v", err)
	}

	minExpiry := ended.Add(dynamo.MinRetention).Unix()
	expiring := 0
	for _, it := range env.Items(t, env.Store.Table) {
		n, ok := it["expiresAt"].(*types.AttributeValueMemberN)
		if !ok || str(it["type"]) == "idempotency" {
			continue
		}
		expiring++
		if str(it["pk"]) == "NODE#n1#OP#rcl_2" && str(it["type"]) == "outcome" {
			continue // recorded since: a day after it, folded into rcl_2 by its end
		}
		if exp, _ := strconv.ParseInt(n.Value, 10, 64); exp < minExpiry {
			t.Errorf("%s %s expires at %s", str(it["pk"]), str(it["sk"]), time.Unix(exp, 0).UTC())
		}
	}
	if expiring != 5 { // vm-t, rcl_1 and its outcome, rcl_2 (ended above) and its outcome
		t.Errorf("%d items with an expiry, want 5", expiring)
	}
}

// TestMigrateListsOldScheduledReclaims: scheduled reclaims written before their reservation's
// list existed have no index keys, so the list misses them; the migration gives them their
// keys (a dry run writes nothing, a re-run finds nothing more), and the list shows them.
func TestMigrateListsOldScheduledReclaims(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(2, 1))
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"srcl_b", "srcl_a"} {
		sr := scheduledAt(id)
		sr.At = sr.At.Add(time.Duration(i) * time.Hour)
		r := *st.Reservation("r1")
		c := capacity.ScheduleCommit{Scheduled: sr, Reservation: r,
			Audit: capacity.AuditRecord{ID: "a-" + id, Time: t0, NodeID: "n1", Action: capacity.ActionScheduleReclaim, Outcome: "ok"}}
		if err := env.Store.CreateScheduled(ctx, c); err != nil {
			t.Fatal(err)
		}
		// As the earlier release wrote it: no index keys.
		if _, err := env.Plain.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(env.Store.Table), UpdateExpression: aws.String("REMOVE gsi1pk, gsi1sk"),
			Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "NODE#n1#SCHED#" + id}, "sk": &types.AttributeValueMemberS{Value: "SCHED"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	listed := func() []string {
		t.Helper()
		list, _, err := env.Store.ListScheduled(ctx, "n1", "r1", 10, "")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sr := range list {
			ids = append(ids, sr.ID)
		}
		return ids
	}
	if ids := listed(); len(ids) != 0 {
		t.Fatalf("listed before the migration: %v", ids)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if rep, err := env.Store.Migrate(ctx, true, quiet); err != nil || rep.Scheduled != 2 || len(listed()) != 0 {
		t.Fatalf("dry run = %+v, %v", rep, err)
	}
	if rep, err := env.Store.Migrate(ctx, false, quiet); err != nil || rep.Scheduled != 2 {
		t.Fatalf("run = %+v, %v", rep, err)
	}
	if rep, err := env.Store.Migrate(ctx, false, quiet); err != nil || rep.Scheduled != 0 {
		t.Errorf("re-run = %+v, %v: want nothing left", rep, err)
	}
	if ids := listed(); !reflect.DeepEqual(ids, []string{"srcl_b", "srcl_a"}) {
		t.Errorf("listed %v, want both in order of at", ids)
	}
	if sr, err := env.Store.GetScheduled(ctx, "n1", "srcl_a"); err != nil || sr.State != capacity.ScheduledPending || sr.Version != 0 {
		t.Errorf("after the migration: %+v, %v", sr, err)
	}
}
