package dynamo_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// legacyKeyed writes pending-start operations under the unsharded byState key, as the
// release before the shards wrote them.
func legacyKeyed(t *testing.T, env *dynamotest.Env, ops []capacity.Operation) {
	t.Helper()
	for _, op := range ops {
		if err := env.Store.PutOperation(context.Background(), op); err != nil {
			t.Fatal(err)
		}
		_, err := env.Plain.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
			TableName: aws.String(env.Store.Table), Key: dynamo.OperationKey(op.NodeID, op.ID),
			UpdateExpression:          aws.String("SET gsi1pk = :k"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":k": &types.AttributeValueMemberS{Value: dynamo.LegacyOpStatePK(op.State)}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// pendingOps are n pending-start operations created a second apart from t0 plus 100ms (ids
// in creation order), in a shuffled order. (The time sort key is RFC 3339 with its trailing
// zeros cut, so within one second a whole second sorts after its fractions: every time here
// has a fraction.)
func pendingOps(n int, prefix string, offset int) []capacity.Operation {
	ops := make([]capacity.Operation, n)
	for i := range ops {
		ops[i] = capacity.Operation{
			ID: fmt.Sprintf("%s%03d", prefix, i), NodeID: fmt.Sprintf("n%d", i%7), ReservationID: "r1",
			State: capacity.OpPendingStart, VMIDs: []string{"vm"}, Attempt: 1,
			CreatedAt: t0.Add(time.Duration(offset+i)*time.Second + 100*time.Millisecond),
		}
	}
	rand.New(rand.NewSource(1)).Shuffle(n, func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	return ops
}

// Operations of a state spread over many byState keys (no key takes a burst's every write),
// and a listing still returns them oldest first across every key, the unsharded key of
// operations written before the shards included, page after page by its cursor.
func TestOperationsInStateMergesEveryShard(t *testing.T) {
	defer dynamo.SetOperationsPage(3)()
	ctx := context.Background()
	env := dynamotest.New(t)
	sharded := pendingOps(90, "rcl_", 0)
	for _, op := range sharded {
		if err := env.Store.PutOperation(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	// Three from before the shards, interleaved in time with the others.
	old := []capacity.Operation{}
	for _, i := range []int{0, 44, 89} {
		op := pendingOps(1, fmt.Sprintf("old%d_", i), i)[0]
		op.CreatedAt = op.CreatedAt.Add(500 * time.Millisecond)
		old = append(old, op)
	}
	legacyKeyed(t, env, old)

	keys := map[string]int{}
	for _, op := range sharded {
		keys[dynamo.OpStatePK(op.State, op.ID)]++
	}
	if len(keys) < 20 || slices.Max(mapValues(keys)) > 10 {
		t.Fatalf("90 operations on %d keys, at most %d on one: %v", len(keys), slices.Max(mapValues(keys)), keys)
	}

	all := append(slices.Clone(sharded), old...)
	slices.SortFunc(all, func(a, b capacity.Operation) int { return a.CreatedAt.Compare(b.CreatedAt) })
	want := opIDs(all)

	got, next, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(time.Hour), "", 1000)
	if err != nil || next != "" || !slices.Equal(opIDs(got), want) {
		t.Fatalf("one listing: next %q, err %v\n got %v\nwant %v", next, err, opIDs(got), want)
	}
	for _, limit := range []int{7, 40} {
		var paged []capacity.Operation
		after := ""
		for range 200 {
			page, next, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(time.Hour), after, limit)
			if err != nil || len(page) > limit {
				t.Fatalf("limit %d: %d operations, err %v", limit, len(page), err)
			}
			paged = append(paged, page...)
			if next == "" {
				break
			}
			after = next
		}
		if !slices.Equal(opIDs(paged), want) {
			t.Fatalf("limit %d, page by page:\n got %v\nwant %v", limit, opIDs(paged), want)
		}
	}
	// Only those that entered the state before the time, with or without a cursor (a time
	// with a fraction: see pendingOps).
	young, next, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(30*time.Second+50*time.Millisecond), "", 10)
	if err != nil || !slices.Equal(opIDs(young), want[:10]) || next == "" {
		t.Fatalf("before 30s, first 10: %v, next %q, err %v", opIDs(young), next, err)
	}
	rest, next, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(30*time.Second+50*time.Millisecond), next, 1000)
	if err != nil || next != "" || !slices.Equal(opIDs(rest), want[10:31]) {
		t.Fatalf("before 30s, the rest: %v, next %q, err %v", opIDs(rest), next, err)
	}
	// Between two times, page by page: from the whole second of since (the keys' fractions
	// sort within it), so nothing at or after since is missed. want[21] is rcl_020 (old0_
	// sorts second).
	var between []capacity.Operation
	for after := ""; ; {
		page, next, err := env.Store.OperationsInStateBetween(ctx, capacity.OpPendingStart, t0.Add(20*time.Second+500*time.Millisecond),
			t0.Add(30*time.Second+50*time.Millisecond), after, 4)
		if err != nil || len(page) > 4 {
			t.Fatalf("between: %d operations, err %v", len(page), err)
		}
		between = append(between, page...)
		if next == "" {
			break
		}
		after = next
	}
	if !slices.Equal(opIDs(between), want[21:31]) {
		t.Fatalf("between 20s and 30s:\n got %v\nwant %v", opIDs(between), want[21:31])
	}
}

// capacity-migrate moves the operations written before the shards to their shard, and a
// listing finds them there as before; a re-run has nothing left to move.
func TestMigrateShardsTheByStateKeys(t *testing.T) {
	ctx := context.Background()
	env := dynamotest.New(t)
	sharded := pendingOps(5, "rcl_", 0)
	for _, op := range sharded {
		if err := env.Store.PutOperation(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	old := pendingOps(4, "old_", 10)
	old[3].State = capacity.OpFailed
	legacyKeyed(t, env, old)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep, err := env.Store.Migrate(ctx, true, quiet)
	if err != nil || rep.ShardedOperations != 4 {
		t.Fatalf("dry run = %+v, %v: want 4 to shard", rep, err)
	}
	if got, _, _ := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(time.Hour), "", 100); len(got) != 8 {
		t.Fatalf("before: %d pending-start listed, want 8", len(got))
	}
	if rep, err = env.Store.Migrate(ctx, false, quiet); err != nil || rep.ShardedOperations != 4 {
		t.Fatalf("run = %+v, %v: want 4 sharded", rep, err)
	}
	for _, op := range append(slices.Clone(sharded), old...) {
		out, err := env.Plain.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(env.Store.Table), Key: dynamo.OperationKey(op.NodeID, op.ID)})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := out.Item["gsi1pk"].(*types.AttributeValueMemberS).Value, dynamo.OpStatePK(op.State, op.ID); got != want {
			t.Errorf("%s keyed %s, want %s", op.ID, got, want)
		}
	}
	got, _, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(time.Hour), "", 100)
	if err != nil || len(got) != 8 {
		t.Fatalf("after: %v listed pending-start (%v), want 8", opIDs(got), err)
	}
	if failed, _, _ := env.Store.OperationsInState(ctx, capacity.OpFailed, t0.Add(time.Hour), "", 100); !slices.Equal(opIDs(failed), []string{old[3].ID}) {
		t.Fatalf("failed listed: %v", opIDs(failed))
	}
	if rep, err = env.Store.Migrate(ctx, false, quiet); err != nil || rep.ShardedOperations != 0 {
		t.Fatalf("re-run = %+v, %v: want nothing to shard", rep, err)
	}
}

func opIDs(ops []capacity.Operation) []string {
	out := []string{}
	for _, op := range ops {
		out = append(out, op.ID)
	}
	return out
}

func mapValues(m map[string]int) []int {
	out := []int{}
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
