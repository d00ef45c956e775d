package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// committed is a node with two spot VMs evicted by operation rcl_1 (terminating), plus a
// third VM "other" evicted by rcl_2. The env's store injects inj's faults (nil: none); the
// returned store has none.
func committed(t *testing.T, inj *awsfault.Injector) (*dynamotest.Env, *dynamo.Store, capacity.Operation) {
	t.Helper()
	env := dynamotest.New(t, dynamotest.Faults(inj)...)
	clean := env.Clean()
	s := seed(4, 3)
	s.VMs[2].State, s.VMs[2].ReclaimID = capacity.VMTerminating, "rcl_2"
	ctx := context.Background()
	if err := clean.Put(ctx, s); err != nil {
		t.Fatal(err)
	}
	st, err := clean.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	c := reclaimCommit(st, st.VMs[:2])
	if err := clean.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	return env, clean, *c.Operation
}

func vmOf(t *testing.T, s *dynamo.Store, id string) *capacity.VM {
	t.Helper()
	st, err := s.LoadNode(context.Background(), "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range st.VMs {
		if vm.ID == id {
			return &vm
		}
	}
	return nil // terminated (filtered out) or missing
}

func TestMarkTerminated(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(2 * time.Hour)
	tests := []struct {
		name    string
		prepare func(t *testing.T, s *dynamo.Store, op capacity.Operation)
		op      func(op capacity.Operation) capacity.Operation
		vm      string
		faults  []awsfault.Rule
		wantErr bool
		// wantLive: the VM is still live (terminating) afterwards; false: terminated.
		wantLive bool
	}{
		{name: "terminating for this operation", vm: "vm00"},
		{name: "re-run after it was marked", vm: "vm00", prepare: func(t *testing.T, s *dynamo.Store, op capacity.Operation) {
			if err := s.MarkTerminated(ctx, op, "vm00", now); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "terminating for another reclaim", vm: "vm02", wantErr: true, wantLive: true},
		{name: "terminated by another reclaim", vm: "vm00", wantErr: true,
			op: func(op capacity.Operation) capacity.Operation { op.ID = "rcl_9"; return op },
			prepare: func(t *testing.T, s *dynamo.Store, op capacity.Operation) {
				if err := s.MarkTerminated(ctx, op, "vm00", now); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "still running", vm: "vm03", wantErr: true, wantLive: true},
		{name: "no such VM", vm: "vm-none", wantErr: true},
		{name: "write keeps conflicting", vm: "vm00", wantErr: true, wantLive: true,
			faults: []awsfault.Rule{{Operation: "DeleteItem", Fault: awsfault.TransactionConflict, Rate: 1}}},
		{name: "write conflicts at times", vm: "vm00",
			faults: []awsfault.Rule{{Operation: "DeleteItem", Fault: awsfault.TransactionConflict, Rate: 0.5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var inj *awsfault.Injector
			if tt.faults != nil {
				inj = awsfault.New(1, tt.faults...)
			}
			env, clean, op := committed(t, inj)
			if tt.name == "still running" {
				s := seed(4, 4) // vm03 running on the released u3
				if err := clean.Put(ctx, dynamo.Seed{VMs: s.VMs[3:]}); err != nil {
					t.Fatal(err)
				}
			}
			if tt.prepare != nil {
				tt.prepare(t, clean, op)
			}
			if tt.op != nil {
				op = tt.op(op)
			}
			before := vmOf(t, clean, tt.vm)
			err := env.Store.MarkTerminated(ctx, op, tt.vm, now)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if errors.Is(err, capacity.ErrConflict) && tt.name == "write keeps conflicting" {
				t.Errorf("a transaction conflict is not a failed condition: %v", err)
			}
			after := vmOf(t, clean, tt.vm)
			if tt.wantLive != (after != nil) {
				t.Fatalf("VM after = %+v, want live %v", after, tt.wantLive)
			}
			if tt.wantErr && !reflect.DeepEqual(before, after) {
				t.Errorf("a refused mark changed the VM: %+v -> %+v", before, after)
			}
		})
	}
}

func TestRecordOutcome(t *testing.T) {
	ctx := context.Background()
	at := t0.Add(2 * time.Hour)
	out := func(o capacity.Outcome, attempt int) capacity.VMOutcome {
		e := ""
		if o == capacity.OutcomeFailed {
			e = fmt.Sprintf("agent refused (attempt %d)", attempt)
		}
		return capacity.VMOutcome{Outcome: o, Error: e, At: at, Attempt: attempt}
	}
	terminated, failed1, failed2 := out(capacity.OutcomeTerminated, 1), out(capacity.OutcomeFailed, 1), out(capacity.OutcomeFailed, 2)
	tests := []struct {
		name   string
		before *capacity.VMOutcome
		record capacity.VMOutcome
		faults []awsfault.Rule
		// want is the stored outcome afterwards (nil: none); wantErr: the call fails.
		want    *capacity.VMOutcome
		wantErr bool
	}{
		{name: "first outcome", record: terminated, want: &terminated},
		{name: "recorded before", before: &terminated, record: terminated, want: &terminated},
		{name: "failure never replaces a success", before: &terminated, record: failed2, want: &terminated},
		{name: "success replaces a failure", before: &failed2, record: terminated, want: &terminated},
		{name: "newer failure replaces an older one", before: &failed1, record: failed2, want: &failed2},
		{name: "older failure never replaces a newer one", before: &failed2, record: failed1, want: &failed2},
		{name: "conflicts every time: returned, not swallowed", record: terminated, wantErr: true,
			faults: []awsfault.Rule{{Operation: "PutItem", Fault: awsfault.TransactionConflict, Rate: 1}}},
		{name: "throttled every time: returned", record: terminated, wantErr: true,
			faults: []awsfault.Rule{{Operation: "PutItem", Fault: awsfault.ProvisionedThroughputExceeded, Rate: 1}}},
		{name: "conflicts at times: retried", record: terminated, want: &terminated,
			faults: []awsfault.Rule{{Operation: "PutItem", Fault: awsfault.TransactionConflict, Rate: 0.5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var inj *awsfault.Injector
			if tt.faults != nil {
				inj = awsfault.New(2, tt.faults...) // seed 2: the "at times" case's first put conflicts
			}
			env, clean, op := committed(t, inj)
			if tt.before != nil {
				if err := clean.RecordOutcome(ctx, op, "vm00", *tt.before); err != nil {
					t.Fatal(err)
				}
			}
			err := env.Store.RecordOutcome(ctx, op, "vm00", tt.record)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if inj != nil && inj.Count(tt.faults[0].Fault) == 0 {
				t.Fatal("no fault was injected: the case proves nothing")
			}
			got, err := clean.GetOperation(ctx, "n1", op.ID)
			if err != nil {
				t.Fatal(err)
			}
			o, ok := got.Outcomes["vm00"]
			switch {
			case tt.want == nil && ok:
				t.Fatalf("outcome = %+v, want none", o)
			case tt.want != nil && (!ok || !reflect.DeepEqual(o, *tt.want)):
				t.Fatalf("outcome = %+v (%v), want %+v", o, ok, *tt.want)
			}
		})
	}
}

// Ending depends on the operation's state and attempt only: it ends once, never at an
// attempt it has moved past.
func TestEndOperationConditions(t *testing.T) {
	ctx := context.Background()
	_, clean, op := committed(t, nil)
	at := t0.Add(2 * time.Hour)
	if err := clean.EndOperation(ctx, op, capacity.OpCompleted, at); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("end of a pending-start operation: %v, want ErrConflict", err)
	}
	if err := clean.BeginTermination(ctx, op, "arn:x", at); err != nil {
		t.Fatal(err)
	}
	stale := op
	stale.Attempt = 2
	if err := clean.EndOperation(ctx, stale, capacity.OpCompleted, at); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("end at another attempt: %v, want ErrConflict", err)
	}
	if err := clean.EndOperation(ctx, op, capacity.OpFailed, at); err != nil {
		t.Fatal(err)
	}
	if err := clean.EndOperation(ctx, op, capacity.OpCompleted, at); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("second end: %v, want ErrConflict", err)
	}
	got, _ := clean.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpFailed {
		t.Fatalf("state = %s, want the first end's", got.State)
	}
}

// The reconciler's listing pages through the byState index, oldest first, up to its limit.
func TestOperationsInStatePagesOldestFirst(t *testing.T) {
	defer dynamo.SetOperationsPage(2)()
	ctx := context.Background()
	env := newEnv(t, seed(8, 8))
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	// Seven operations, created in a shuffled order, one VM each.
	var want []string
	for i, minute := range []int{5, 1, 6, 3, 0, 4, 2} {
		st, err = env.Store.LoadNode(ctx, "n1", "")
		if err != nil {
			t.Fatal(err)
		}
		c := reclaimCommit(st, st.VMs[:1])
		c.Reservation = nil
		c.Operation.ID = fmt.Sprintf("rcl_%d", i)
		c.Operation.CreatedAt = t0.Add(time.Duration(minute) * time.Minute)
		c.Audit.ID = fmt.Sprintf("a%d", i)
		if err := env.Store.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{4, 1, 6, 3, 5, 0, 2} { // by minute
		want = append(want, fmt.Sprintf("rcl_%d", i))
	}
	ids := func(ops []capacity.Operation) []string {
		var out []string
		for _, op := range ops {
			out = append(out, op.ID)
		}
		return out
	}
	all, _, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(time.Hour), "", 100)
	if err != nil || !slices.Equal(ids(all), want) {
		t.Fatalf("all = %v (%v), want %v", ids(all), err, want)
	}
	some, _, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(time.Hour), "", 5)
	if err != nil || !slices.Equal(ids(some), want[:5]) {
		t.Fatalf("limit 5 = %v (%v), want %v", ids(some), err, want[:5])
	}
	young, _, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(3*time.Minute), "", 100)
	if err != nil || !slices.Equal(ids(young), want[:3]) {
		t.Fatalf("before minute 3 = %v (%v), want %v", ids(young), err, want[:3])
	}
}

// Restarting and failing an operation condition on the state and attempt read: of two
// reconcilers that read the same attempt, one moves it on and the other changes nothing.
func TestRestartAndFailConditionOnTheAttemptRead(t *testing.T) {
	ctx := context.Background()
	_, clean, op := committed(t, nil)
	at := t0.Add(2 * time.Hour)
	if err := clean.RestartOperation(ctx, op, at); err != nil {
		t.Fatal(err)
	}
	if err := clean.RestartOperation(ctx, op, at); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("second restart from the same read: %v, want ErrConflict", err)
	}
	if err := clean.FailOperation(ctx, op, "late", at); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("fail from a stale read: %v, want ErrConflict", err)
	}
	got, _ := clean.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpPendingStart || got.CurrentAttempt() != 2 || got.Restarts != 1 || got.Reason != "" {
		t.Fatalf("operation = %+v", got)
	}
	if err := clean.FailOperation(ctx, *got, "restarts exhausted", at); err != nil {
		t.Fatal(err)
	}
	got, _ = clean.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpFailed || got.Reason != "restarts exhausted" {
		t.Fatalf("operation = %+v", got)
	}
	if ops, _, _ := clean.OperationsInState(ctx, capacity.OpPendingStart, at.Add(time.Hour), "", 10); len(ops) != 0 {
		t.Fatalf("a failed operation is still listed pending-start: %+v", ops)
	}
}

// A completed operation leaves the byState index (its item loses gsi1pk/gsi1sk, so the index
// holds no copy of it for its retention, and no listing finds it); a failed one stays, under
// its end state's key, where the reconciler lists the failed operations that hold VMs.
func TestOnlyAFailedOperationStaysInTheByStateIndex(t *testing.T) {
	for _, state := range []capacity.OperationState{capacity.OpCompleted, capacity.OpFailed} {
		t.Run(string(state), func(t *testing.T) {
			ctx := context.Background()
			env, clean, op := committed(t, nil)
			at := t0.Add(2 * time.Hour)
			if err := clean.BeginTermination(ctx, op, "arn:x", at); err != nil {
				t.Fatal(err)
			}
			if err := clean.EndOperation(ctx, op, state, at); err != nil {
				t.Fatal(err)
			}
			indexed, found := false, false
			for _, it := range env.Items(t, clean.Table) {
				if ty, ok := it["type"].(*types.AttributeValueMemberS); ok && ty.Value == "operation" {
					_, pk := it["gsi1pk"]
					_, sk := it["gsi1sk"]
					indexed, found = pk || sk, true
				}
			}
			if !found {
				t.Fatal("no operation item")
			}
			listed, _, err := clean.OperationsInState(ctx, state, at.Add(time.Hour), "", 10)
			if err != nil {
				t.Fatal(err)
			}
			want := state == capacity.OpFailed
			if indexed != want || (len(listed) == 1) != want {
				t.Fatalf("ended %s: indexed %v, listed %d; want indexed and listed %v", state, indexed, len(listed), want)
			}
		})
	}
}
