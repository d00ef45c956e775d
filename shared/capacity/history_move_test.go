package capacity_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// A VM's move to its history is two writes, not a transaction: the history item, then the
// live item's conditional delete. A run cut off between them (here: its delete refused) leaves
// both; meanwhile the VM reads as terminating where it is decided on (its units stay taken),
// and its history says terminated by this operation only. What comes next finishes the move:
// the next round's mark, or an operator's force-end; either way one history item, this
// operation's.
func TestAVMMoveCutOffBetweenItsWritesIsFinishedByTheNext(t *testing.T) {
	for _, next := range []string{"next round", "force-end"} {
		t.Run(next, func(t *testing.T) {
			env, svc, failed, _ := failedOp(t)
			ctx := context.Background()
			inj := awsfault.New(1, awsfault.Rule{Operation: "DeleteItem", Fault: awsfault.AccessDenied, Rate: 1})
			o := dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(env.URL),
				Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
			for _, opt := range dynamotest.Faults(inj) {
				opt(&o)
			}
			cut := dynamo.New(dynamodb.New(o), env.Store.Table, env.Store.AuditTable)
			if err := cut.MarkTerminated(ctx, *failed, "s2", t0); err == nil {
				t.Fatal("a move whose delete fails: no error")
			}
			if vm := liveVM(t, env.Store, "s2"); vm == nil || vm.State != capacity.VMTerminating || vm.ReclaimID != failed.ID {
				t.Fatalf("s2 after the cut-off move: %+v, want still terminating for %s", vm, failed.ID)
			}
			if err := placeOnU2(svc, "v-between"); code(err) != capacity.CodeUnitsInUse {
				t.Fatalf("placement on s2's unit between the writes: %v, want units_in_use", err)
			}
			if h := historyOf(t, env, "s2"); len(h) != 1 || h[0] != "terminated by "+failed.ID {
				t.Fatalf("history of s2 between the writes: %v", h)
			}
			switch next {
			case "next round":
				if err := env.Store.MarkTerminated(ctx, *failed, "s2", t0); err != nil {
					t.Fatal(err)
				}
			case "force-end":
				res, err := svc.ForceEnd(ctx, op, forceEnd(failed.ID, "s2", "node wiped", ""), capacity.RequestMeta{})
				if err != nil || res.Outcome != capacity.OutcomeForceEnded {
					t.Fatalf("force-end: %+v, %v", res, err)
				}
			}
			if vm := liveVM(t, env.Store, "s2"); vm != nil {
				t.Fatalf("s2 still live after the %s: %+v", next, vm)
			}
			if h := historyOf(t, env, "s2"); len(h) != 1 || h[0] != "terminated by "+failed.ID {
				t.Fatalf("history of s2 after the %s: %v", next, h)
			}
		})
	}
}

// The move is no transaction: a put and a conditional delete (half the write units).
func TestMarkTerminatedWritesNoTransaction(t *testing.T) {
	env, _, failed, _ := failedOp(t)
	env.Calls.Reset()
	if err := env.Store.MarkTerminated(context.Background(), *failed, "s2", t0); err != nil {
		t.Fatal(err)
	}
	calls := env.Calls.Snapshot()
	if calls["TransactWriteItems"] != 0 || calls["PutItem"] != 1 || calls["DeleteItem"] != 1 {
		t.Errorf("calls %v, want one PutItem and one DeleteItem, no transaction", calls)
	}
}

// historyOf lists the VM's history items as "<state> by <reclaim>".
func historyOf(t *testing.T, env *dynamotest.Env, vmID string) []string {
	t.Helper()
	var out []string
	for _, it := range env.Items(t, env.Store.Table) {
		if attrString(it["pk"]) == "NODE#n1#HIST" && attrString(it["sk"]) == "VM#"+vmID {
			out = append(out, attrString(it["State"])+" by "+attrString(it["ReclaimID"]))
		}
	}
	return out
}
