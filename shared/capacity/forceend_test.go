package capacity_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

func forceEnd(opID, vmID, reason, key string) capacity.ForceEndRequest {
	return capacity.ForceEndRequest{NodeID: "n1", ReservationID: "r1", ReclaimID: opID, VMID: vmID, Reason: reason, IdempotencyKey: key}
}

// placeOnU2 places a reserved VM on u2, the unit the failed VM s2 holds.
func placeOnU2(svc *capacity.Service, vmID string) error {
	_, err := svc.Place(context.Background(), sched, capacity.PlacementRequest{NodeID: "n1", VMID: vmID, OrgID: "aud", Tier: capacity.TierReserved, UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
	return err
}

// A VM whose agent never confirms its termination keeps its units, its operation failed,
// until an operator force-ends it: then the VM is terminated, its outcome says force-ended
// with the reason, the operation completes, the units take a placement, and the call is
// audited. A retry under the Idempotency-Key replays; a repeat without one changes nothing.
func TestForceEndFreesTheUnitsAndCompletesTheOperation(t *testing.T) {
	env, svc, failed, _ := failedOp(t)
	ctx := context.Background()
	if err := placeOnU2(svc, "v-before"); code(err) != capacity.CodeUnitsInUse {
		t.Fatalf("placement on the failed VM's unit before the force-end: %v, want units_in_use", err)
	}
	req := forceEnd(failed.ID, "s2", "node wiped, ticket OPS-7", "fe-1")
	res, err := svc.ForceEnd(ctx, op, req, capacity.RequestMeta{RequestID: "req-fe"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != capacity.OutcomeForceEnded || !res.Ended || res.Operation.State != capacity.OpCompleted {
		t.Fatalf("result = %+v", res)
	}
	stored, err := env.Store.GetOperation(ctx, "n1", failed.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := stored.Outcomes["s2"]
	if stored.State != capacity.OpCompleted || got.Outcome != capacity.OutcomeForceEnded || got.Reason != req.Reason ||
		stored.Outcomes["s1"].Outcome != capacity.OutcomeTerminated {
		t.Fatalf("stored operation = %+v", stored)
	}
	if vm := liveVM(t, env.Store, "s2"); vm != nil {
		t.Fatalf("s2 is still live: %+v", vm)
	}
	// Completed, the operation and all its outcomes expire in time again.
	for _, it := range env.Items(t, env.Store.Table) {
		if attrString(it["pk"]) == "NODE#n1#OP#"+failed.ID && it["expiresAt"] == nil {
			t.Errorf("%s of the completed operation has no expiry", attrString(it["sk"]))
		}
	}
	audits := auditActions(t, env, capacity.ActionForceEnd)
	if len(audits) != 1 || attrString(audits[0]["VMID"]) != "s2" || attrString(audits[0]["ReclaimID"]) != failed.ID ||
		attrString(audits[0]["Reason"]) != req.Reason || attrString(audits[0]["ActorKeyID"]) != op.KeyID || attrString(audits[0]["Outcome"]) != "ok" {
		t.Fatalf("force-end audit records = %v", audits)
	}

	again, err := svc.ForceEnd(ctx, op, req, capacity.RequestMeta{})
	if err != nil || !again.Replayed || !reflect.DeepEqual(again.Operation.Outcomes, res.Operation.Outcomes) {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	req.IdempotencyKey = ""
	repeat, err := svc.ForceEnd(ctx, op, req, capacity.RequestMeta{})
	if err != nil || repeat.Outcome != capacity.OutcomeForceEnded || repeat.Ended {
		t.Fatalf("repeat = %+v, %v", repeat, err)
	}
	if after, _ := env.Store.GetOperation(ctx, "n1", failed.ID); !reflect.DeepEqual(after, stored) {
		t.Errorf("a repeat changed the operation: %+v, was %+v", after, stored)
	}
	if err := placeOnU2(svc, "v-after"); err != nil {
		t.Fatalf("placement on the freed unit: %v", err)
	}
	checkInvariants(t, env, "n1", t0)
}

func liveVM(t *testing.T, env interface {
	LoadNode(context.Context, string, string) (*capacity.NodeState, error)
}, id string) *capacity.VM {
	t.Helper()
	st, err := env.LoadNode(context.Background(), "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range st.VMs {
		if vm.ID == id {
			return &vm
		}
	}
	return nil
}

// Refusals change nothing: not the VM, not the operation, not the units.
func TestForceEndRefusals(t *testing.T) {
	tests := []struct {
		name    string
		p       capacity.Principal
		req     func(opID string) capacity.ForceEndRequest
		running bool // the operation's workflow has not run yet (pending-start)
		want    capacity.Code
	}{
		{"not an operator", owner, func(id string) capacity.ForceEndRequest { return forceEnd(id, "s2", "wiped", "") }, false, capacity.CodeNotFound},
		{"no reason", op, func(id string) capacity.ForceEndRequest { return forceEnd(id, "s2", " ", "") }, false, capacity.CodeInvalidRequest},
		{"unknown operation", op, func(string) capacity.ForceEndRequest { return forceEnd("rcl-none", "s2", "wiped", "") }, false, capacity.CodeNotFound},
		{"another reservation", op, func(id string) capacity.ForceEndRequest {
			r := forceEnd(id, "s2", "wiped", "")
			r.ReservationID = "r2"
			return r
		}, false, capacity.CodeNotFound},
		{"a VM the operation did not evict", op, func(id string) capacity.ForceEndRequest { return forceEnd(id, "v0", "wiped", "") }, false, capacity.CodeNotFound},
		{"operation still running", op, func(id string) capacity.ForceEndRequest { return forceEnd(id, "s2", "wiped", "") }, true, capacity.CodeOperationRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var env *dynamotest.Env
			var svc *capacity.Service
			var o *capacity.Operation
			if tt.running {
				env, svc, o = evicted(t)
			} else {
				env, svc, o, _ = failedOp(t)
			}
			before := stateItems(t, env)
			_, err := svc.ForceEnd(context.Background(), tt.p, tt.req(o.ID), capacity.RequestMeta{})
			if code(err) != tt.want {
				t.Fatalf("got %v, want %s", err, tt.want)
			}
			if after := stateItems(t, env); !reflect.DeepEqual(after, before) {
				t.Errorf("a refused force-end changed the state table")
			}
			if vm := liveVM(t, env.Store, "s2"); vm == nil || vm.State != capacity.VMTerminating {
				t.Errorf("s2 = %+v, want still terminating", vm)
			}
		})
	}
}

// The force-end's writes condition on what its decision read: an operation re-driven, or a
// VM changed, after the read makes the commit fail as a whole (the service then reads again
// and decides anew).
func TestForceEndCommitConditionsOnTheRead(t *testing.T) {
	tests := []struct {
		name  string
		after func(t *testing.T, svc *capacity.Service, env *dynamotest.Env, o *capacity.Operation)
	}{
		{"operation re-driven", func(t *testing.T, svc *capacity.Service, _ *dynamotest.Env, o *capacity.Operation) {
			if _, err := svc.Redrive(context.Background(), owner, "n1", "r1", o.ID, capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"VM marked terminated", func(t *testing.T, _ *capacity.Service, env *dynamotest.Env, o *capacity.Operation) {
			if err := env.Store.MarkTerminated(context.Background(), *o, "s2", t0); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc, o, _ := failedOp(t)
			ctx := context.Background()
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			c, _, err := capacity.DecideForceEnd(st, o, forceEnd(o.ID, "s2", "wiped", ""), t0)
			if err != nil || c.ForceEnd == nil || c.ForceEnd.VM == nil {
				t.Fatalf("decision = %+v, %v", c, err)
			}
			c.Audit = capacity.AuditRecord{ID: "a-fe", Time: t0, NodeID: "n1", Action: capacity.ActionForceEnd, Outcome: "ok"}
			tt.after(t, svc, env, o)
			before := stateItems(t, env)
			if _, err := env.Store.CommitOperator(ctx, *c); !errors.Is(err, capacity.ErrConflict) {
				t.Fatalf("commit on a stale read: %v, want ErrConflict", err)
			}
			if after := stateItems(t, env); !reflect.DeepEqual(after, before) {
				t.Errorf("a failed commit changed the state table")
			}
		})
	}
}

// A failed operation whose VMs stay terminating is reported by the reconciler once it has held
// them HeldAfter, every run, until they are let go; a young one, or one re-driven or
// force-ended, is not.
func TestReconcilerReportsFailedOperationsThatHoldVMs(t *testing.T) {
	env, svc, failed, wf := failedOp(t)
	ctx := context.Background()
	failedAt := failed.UpdatedAt
	run := func(after time.Duration) []capacity.Operation {
		t.Helper()
		r := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, HeldAfter: time.Hour,
			Logger: quiet, Now: func() time.Time { return failedAt.Add(after) }}
		report, err := r.Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return report.Held
	}
	if held := run(59 * time.Minute); len(held) != 0 {
		t.Fatalf("held after 59 minutes: %+v", held)
	}
	for _, after := range []time.Duration{time.Hour + time.Second, 30 * 24 * time.Hour} {
		held := run(after)
		if len(held) != 1 || held[0].ID != failed.ID || !slices.Equal(held[0].VMIDs, []string{"s2"}) {
			t.Fatalf("held after %s: %+v, want %s holding s2", after, held, failed.ID)
		}
	}
	if _, err := svc.ForceEnd(ctx, op, forceEnd(failed.ID, "s2", "node wiped", ""), capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	if held := run(2 * time.Hour); len(held) != 0 {
		t.Fatalf("held after the force-end: %+v", held)
	}
}

// A failed operation ended before failed operations were kept still carries an expiry, as do
// its failure outcomes: the reconciler, finding it holding VMs, removes them.
func TestReconcilerKeepsAHeldOperationThatWouldExpire(t *testing.T) {
	env, _, failed, wf := failedOp(t)
	ctx := context.Background()
	expiring := failed.UpdatedAt.Add(90 * 24 * time.Hour).Unix()
	for _, sk := range []string{"OP", "VM#s2"} {
		_, err := env.Plain.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(env.Store.Table),
			Key: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: "NODE#n1#OP#" + failed.ID}, "sk": &types.AttributeValueMemberS{Value: sk}},
			UpdateExpression:          aws.String("SET expiresAt = :e"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":e": &types.AttributeValueMemberN{Value: strconv.FormatInt(expiring, 10)}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	r := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, HeldAfter: time.Hour,
		Logger: quiet, Now: func() time.Time { return failed.UpdatedAt.Add(2 * time.Hour) }}
	report, err := r.Run(ctx)
	if err != nil || len(report.Held) != 1 {
		t.Fatalf("report = %+v, %v", report, err)
	}
	for _, it := range env.Items(t, env.Store.Table) {
		// A terminate claim may lapse and expire: the operation's record is the rest.
		if attrString(it["pk"]) == "NODE#n1#OP#"+failed.ID && attrString(it["sk"]) != "VM#s1" && attrString(it["type"]) != "claim" && it["expiresAt"] != nil {
			t.Errorf("%s of the held operation still expires", attrString(it["sk"]))
		}
	}
}

// A VM whose record left the live state without its outcome (marked terminated, the outcome
// never recorded) holds no units; its force-end records already-gone with the reason, which
// lets the operation complete, and writes no VM.
func TestForceEndOfAVMNoLongerLiveRecordsAlreadyGone(t *testing.T) {
	env, svc, failed, _ := failedOp(t)
	ctx := context.Background()
	if err := env.Store.MarkTerminated(ctx, *failed, "s2", t0); err != nil {
		t.Fatal(err)
	}
	res, err := svc.ForceEnd(ctx, op, forceEnd(failed.ID, "s2", "terminated, outcome lost", ""), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := env.Store.GetOperation(ctx, "n1", failed.ID)
	if res.Outcome != capacity.OutcomeAlreadyGone || stored.State != capacity.OpCompleted ||
		stored.Outcomes["s2"].Outcome != capacity.OutcomeAlreadyGone || stored.Outcomes["s2"].Reason != "terminated, outcome lost" {
		t.Fatalf("result %+v, stored %+v", res, stored)
	}
}

// failedOnBoth is failedOp with both VMs' agents failing for good: the operation failed on s1
// and s2.
func failedOnBoth(t *testing.T) (*dynamotest.Env, *capacity.Service, *capacity.Operation) {
	t.Helper()
	env, svc, o := evicted(t)
	agent := &capacitytest.Agent{Permanent: map[string]bool{"s1": true, "s2": true}}
	runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}, o, 3)
	got, err := env.Store.GetOperation(context.Background(), "n1", o.ID)
	if err != nil || got.State != capacity.OpFailed || got.Outcomes["s1"].Outcome != capacity.OutcomeFailed || got.Outcomes["s2"].Outcome != capacity.OutcomeFailed {
		t.Fatalf("operation = %+v, %v", got, err)
	}
	svc.Workflow = &capacitytest.Workflow{}
	return env, svc, got
}

// An operation completes only with its last VM: ending one VM while another's termination has
// failed leaves the operation failed (still holding the other VM and its units); ending the
// other then completes it.
func TestForceEndCompletesOnlyWithTheLastVM(t *testing.T) {
	env, svc, failed := failedOnBoth(t)
	ctx := context.Background()
	first, err := svc.ForceEnd(ctx, op, forceEnd(failed.ID, "s1", "node wiped", ""), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := env.Store.GetOperation(ctx, "n1", failed.ID)
	if first.Ended || first.Operation.State != capacity.OpFailed || stored.State != capacity.OpFailed || stored.Outcomes["s2"].Outcome != capacity.OutcomeFailed {
		t.Fatalf("after ending s1 while s2 has failed: answer %+v, stored %+v; want the operation still failed", first, stored)
	}
	if vm := liveVM(t, env.Store, "s2"); vm == nil || vm.State != capacity.VMTerminating {
		t.Fatalf("s2 = %+v, want still terminating", vm)
	}
	last, err := svc.ForceEnd(ctx, op, forceEnd(failed.ID, "s2", "node wiped", ""), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ = env.Store.GetOperation(ctx, "n1", failed.ID)
	if !last.Ended || stored.State != capacity.OpCompleted {
		t.Fatalf("after ending s2 too: answer %+v, stored %+v; want completed", last, stored)
	}
	checkInvariants(t, env, "n1", t0)
}

// beforeOperatorCommit runs once() before the first operator commit: a write that lands
// between the call's read and its commit.
type beforeOperatorCommit struct {
	*dynamo.Store
	once func()
	done atomic.Bool
}

func (b *beforeOperatorCommit) CommitOperator(ctx context.Context, c capacity.OperatorCommit) (capacity.AuditHead, error) {
	if !b.done.Swap(true) {
		b.once()
	}
	return b.Store.CommitOperator(ctx, c)
}

// Two force-ends at once, of the operation's two VMs, neither live any more (so neither
// moves the node's version): each decided on the other's failure, so neither alone would
// complete the operation. The one that commits second conditions on what it read, loses,
// reads again and completes it: the operation does not stay failed with every VM ended.
func TestConcurrentForceEndsCompleteTheOperation(t *testing.T) {
	env, svc, failed := failedOnBoth(t)
	ctx := context.Background()
	for _, vm := range []string{"s1", "s2"} {
		if err := env.Store.MarkTerminated(ctx, *failed, vm, t0); err != nil {
			t.Fatal(err)
		}
	}
	other := *svc
	var second *capacity.ForceEndResult
	svc.Store = &beforeOperatorCommit{Store: env.Store, once: func() {
		var err error
		if second, err = other.ForceEnd(ctx, op, forceEnd(failed.ID, "s2", "node wiped", ""), capacity.RequestMeta{}); err != nil {
			t.Errorf("the other force-end: %v", err)
		}
	}}
	first, err := svc.ForceEnd(ctx, op, forceEnd(failed.ID, "s1", "node wiped", ""), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := env.Store.GetOperation(ctx, "n1", failed.ID)
	if stored.State != capacity.OpCompleted || stored.Outcomes["s1"].Outcome != capacity.OutcomeAlreadyGone || stored.Outcomes["s2"].Outcome != capacity.OutcomeAlreadyGone {
		t.Fatalf("operation after both = %+v; want completed with both VMs already gone", stored)
	}
	if second == nil || second.Ended || !first.Ended {
		t.Errorf("answers: first %+v, second %+v; want the first, which lost and read again, to end it", first, second)
	}
}
