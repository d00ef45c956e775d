package capacity_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// failedOp evicts s1 and s2 and runs the workflow with s2 refused for good: the operation
// ends failed, s1 terminated, s2 still terminating.
func failedOp(t *testing.T) (*dynamotest.Env, *capacity.Service, *capacity.Operation, *capacitytest.Workflow) {
	t.Helper()
	env, svc, op := evicted(t)
	agent := &capacitytest.Agent{Permanent: map[string]bool{"s2": true}}
	runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}, op, 3)
	got, err := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if err != nil || got.State != capacity.OpFailed {
		t.Fatalf("operation = %+v, %v", got, err)
	}
	wf := &capacitytest.Workflow{}
	svc.Workflow = wf
	return env, svc, got, wf
}

func auditActions(t *testing.T, env *dynamotest.Env, action string) []map[string]types.AttributeValue {
	t.Helper()
	var out []map[string]types.AttributeValue
	for _, it := range env.Items(t, env.Store.AuditTable) {
		if a, ok := it["Action"].(*types.AttributeValueMemberS); ok && a.Value == action {
			out = append(out, it)
		}
	}
	return out
}

// A re-drive runs the failed VM again as a new attempt, leaves the terminated one alone, and
// the operation then completes.
func TestRedriveRerunsWhatFailed(t *testing.T) {
	env, svc, op, wf := failedOp(t)
	ctx := context.Background()
	res, err := svc.Redrive(ctx, owner, "n1", "r1", op.ID, capacity.RequestMeta{RequestID: "req-r"})
	if err != nil {
		t.Fatal(err)
	}
	next := op.ID + "-2"
	if !slices.Equal(res.Retried, []string{"s2"}) || res.Operation.State != capacity.OpPendingStart || res.Operation.CurrentAttempt() != 2 {
		t.Fatalf("result = %+v", res)
	}
	if !slices.Equal(wf.Started(), []string{next}) || !slices.Equal(wf.Inputs(next), []string{"s2"}) {
		t.Fatalf("started %v with %v, want %s for s2", wf.Started(), wf.Inputs(next), next)
	}
	stored, _ := env.Store.GetOperation(ctx, "n1", op.ID)
	if stored.State != capacity.OpPendingStart || stored.CurrentAttempt() != 2 || !slices.Equal(stored.Unfinished(), []string{"s2"}) {
		t.Fatalf("stored operation = %+v", stored)
	}
	audits := auditActions(t, env, capacity.ActionRetry)
	if len(audits) != 1 || audits[0]["RequestID"].(*types.AttributeValueMemberS).Value != "req-r" ||
		audits[0]["ReclaimID"].(*types.AttributeValueMemberS).Value != op.ID {
		t.Fatalf("retry audit records = %v", audits)
	}

	// The new attempt's execution, with the agent working again.
	agent := &capacitytest.Agent{}
	term := &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}
	task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: wf.Inputs(next), ExecutionARN: "arn:" + next, Attempt: 2, MaxRounds: 3}
	if r, err := term.Run(ctx, task); err != nil || !r.Done {
		t.Fatalf("round = %+v, %v", r, err)
	}
	reportStep(t, env.Store, op, 2)
	got, _ := env.Store.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpCompleted || got.Outcomes["s2"].Outcome != capacity.OutcomeTerminated ||
		!reflect.DeepEqual(got.Outcomes["s1"], op.Outcomes["s1"]) {
		t.Fatalf("operation = %+v", got)
	}
	if agent.Calls("s1") != 0 || agent.Calls("s2") != 1 {
		t.Errorf("agent calls = %v, want s2 only", agent.AllCalls())
	}
	if st, _ := env.Store.LoadNode(ctx, "n1", ""); slices.ContainsFunc(st.VMs, func(v capacity.VM) bool { return v.ID == "s2" }) {
		t.Error("s2 still holds its units")
	}

	// Nothing left to retry: a repeat answers the operation as it is and starts nothing.
	res, err = svc.Redrive(ctx, owner, "n1", "r1", op.ID, capacity.RequestMeta{})
	if err != nil || len(res.Retried) != 0 || res.Operation.State != capacity.OpCompleted {
		t.Fatalf("repeat: %+v, %v", res, err)
	}
	if len(wf.Started()) != 1 {
		t.Errorf("a repeat started %v", wf.Started())
	}
}

// A late branch of the old execution (say a retried task) cannot act once a re-drive has
// moved the operation to a new attempt: it terminates nothing, records nothing and ends
// nothing.
func TestLateBranchOfAnOldAttemptDoesNothing(t *testing.T) {
	env, svc, op, wf := failedOp(t)
	ctx := context.Background()
	if _, err := svc.Redrive(ctx, owner, "n1", "r1", op.ID, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	// The new attempt's first round begins it; s2 fails once more (retryable).
	newAgent := &capacitytest.Agent{FailFirst: map[string]int{"s2": 1}}
	term := &capacity.Terminator{Store: env.Store, Agent: newAgent, Logger: quiet}
	r, err := term.Run(ctx, capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: []string{"s2"}, ExecutionARN: "arn:2", Attempt: 2, MaxRounds: 3})
	if err != nil || r.Done {
		t.Fatalf("round = %+v, %v", r, err)
	}
	// The old execution's last round for s2 now arrives, with the agent still refusing.
	before := env.StateItems(t)
	oldAgent := &capacitytest.Agent{Permanent: map[string]bool{"s2": true}}
	old := &capacity.Terminator{Store: env.Store, Agent: oldAgent, Logger: quiet}
	r, err = old.Run(ctx, capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: []string{"s2"}, ExecutionARN: "arn:1", Attempt: 1, Round: 2, MaxRounds: 3})
	if err != nil || !r.Done || oldAgent.Total() != 0 {
		t.Fatalf("old round = %+v, %v, agent calls %v", r, err, oldAgent.AllCalls())
	}
	if after := env.StateItems(t); !reflect.DeepEqual(after, before) {
		t.Fatal("a task of an older attempt wrote")
	}
	// Its store writes, had it made them, change nothing that counts either.
	stale := *op // attempt 1
	if err := env.Store.RecordOutcome(ctx, stale, "s2", capacity.VMOutcome{Outcome: capacity.OutcomeFailed, Error: "late", At: t0, Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	stale.State = capacity.OpTerminating
	if err := env.Store.EndOperation(ctx, stale, capacity.OpFailed, t0); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("end at the old attempt: %v, want ErrConflict", err)
	}
	// The new attempt finishes and completes the operation.
	if r, err := term.Run(ctx, r.Next); err != nil {
		t.Fatal(err)
	} else if r2, err := term.Run(ctx, capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: []string{"s2"}, ExecutionARN: "arn:2", Attempt: 2, Round: 1, MaxRounds: 3}); err != nil || !r2.Done {
		t.Fatalf("new attempt: %+v %+v %v", r, r2, err)
	}
	reportStep(t, env.Store, op, 2)
	got, _ := env.Store.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpCompleted || got.Outcomes["s2"].Outcome != capacity.OutcomeTerminated {
		t.Fatalf("operation = %+v", got)
	}
	if !slices.Equal(wf.Started(), []string{op.ID + "-2"}) {
		t.Errorf("started %v", wf.Started())
	}
}

func TestRedriveRefusals(t *testing.T) {
	ctx := context.Background()
	readonly := capacity.Principal{KeyID: "k-ro", OrgID: "owner", Permissions: []string{capacity.PermRead}}
	stranger := capacity.Principal{KeyID: "k-x", OrgID: "stranger", Permissions: []string{capacity.PermCapacity}}
	tests := []struct {
		name      string
		p         capacity.Principal
		res, op   string // "" = the operation's
		running   bool   // pending-start: its workflow not started yet
		begun     bool   // with running: terminating, its workflow under way
		want      capacity.Code
		wantAudit bool
	}{
		{name: "still running", p: owner, running: true, want: capacity.CodeOperationRunning, wantAudit: true},
		{name: "still terminating", p: owner, running: true, begun: true, want: capacity.CodeOperationRunning, wantAudit: true},
		{name: "audience", p: audi, want: capacity.CodeForbidden, wantAudit: true},
		{name: "no capacity permission", p: readonly, want: capacity.CodeNotFound},
		{name: "not the caller's", p: stranger, want: capacity.CodeNotFound},
		{name: "through another reservation", p: owner, res: "r2", want: capacity.CodeNotFound},
		{name: "unknown operation", p: owner, op: "rcl_none", want: capacity.CodeNotFound},
		{name: "malformed operation id", p: owner, op: "rcl/../x", want: capacity.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var env *dynamotest.Env
			var svc *capacity.Service
			var op *capacity.Operation
			wf := &capacitytest.Workflow{}
			if tt.running {
				env, svc, op = evicted(t)
				svc.Workflow = wf
				if tt.begun {
					if err := env.Store.BeginTermination(ctx, *op, "arn:exec", t0.Add(time.Hour)); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				env, svc, op, wf = failedOp(t)
			}
			addReservation(t, env, "r2")
			res, opID := "r1", op.ID
			if tt.res != "" {
				res = tt.res
			}
			if tt.op != "" {
				opID = tt.op
			}
			before := env.StateItems(t)
			_, err := svc.Redrive(ctx, tt.p, "n1", res, opID, capacity.RequestMeta{})
			if capacity.ErrorCode(err) != tt.want {
				t.Fatalf("err = %v, want %s", err, tt.want)
			}
			if !reflect.DeepEqual(env.StateItems(t), before) || len(wf.Started()) != 0 {
				t.Fatal("a refused re-drive changed something")
			}
			if n := len(auditActions(t, env, capacity.ActionRetry)); (n == 1) != tt.wantAudit || n > 1 {
				t.Errorf("%d retry audit records, want audited %v", n, tt.wantAudit)
			}
		})
	}
}

// addReservation adds reservation id on n1 (the owner's, reserving u3).
func addReservation(t *testing.T, env *dynamotest.Env, id string) {
	t.Helper()
	clean := env.Clean()
	err := clean.Put(context.Background(), dynamo.Seed{Reservations: []capacity.Reservation{{
		ID: id, NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u3"},
		StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, Version: 1,
	}}})
	if err != nil {
		t.Fatal(err)
	}
}

// An operation is read only through its own reservation: through another one on the same
// node, which the caller may see, it does not exist.
func TestGetOperationThroughAnotherReservationIsNotFound(t *testing.T) {
	env, svc, op := evicted(t)
	addReservation(t, env, "r2")
	ctx := context.Background()
	if _, err := svc.GetOperation(ctx, owner, "n1", "r2", op.ID); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Fatalf("through r2: err = %v, want not_found", err)
	}
	if _, err := svc.GetReservation(ctx, owner, "n1", "r2"); err != nil {
		t.Fatalf("the caller may see r2 (so the 404 is the operation's): %v", err)
	}
	if got, err := svc.GetOperation(ctx, owner, "n1", "r1", op.ID); err != nil || got.ID != op.ID {
		t.Fatalf("through r1: %+v, %v", got, err)
	}
}

// A re-drive whose transaction landed but whose answer was lost (the SDK's retry then fails
// the condition on the attempt it read) still answers with the new attempt and starts it,
// once, instead of 409 operation_running about itself.
func TestAmbiguousRedriveAnswersWithItsAttempt(t *testing.T) {
	env, svc, op, wf := failedOp(t)
	ctx := context.Background()
	inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1})
	faulty := dynamodb.New(env.Client.Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, inj.APIOption)
	})
	svc.Store = dynamo.New(faulty, env.Store.Table, env.Store.AuditTable)
	res, err := svc.Redrive(ctx, owner, "n1", "r1", op.ID, capacity.RequestMeta{RequestID: "req-a"})
	if err != nil {
		t.Fatalf("re-drive: %v (faults %v)", err, inj.Counts())
	}
	if inj.Count(awsfault.AmbiguousTimeout) == 0 {
		t.Fatal("no answer was lost; the test proves nothing")
	}
	if !slices.Equal(res.Retried, []string{"s2"}) || res.Operation.CurrentAttempt() != 2 {
		t.Fatalf("result = %+v", res)
	}
	if got := wf.Started(); !slices.Equal(got, []string{op.ID + "-2"}) {
		t.Fatalf("started %v", got)
	}
	if n := len(auditActions(t, env, capacity.ActionRetry)); n != 1 {
		t.Fatalf("%d retry audit records, want 1", n)
	}
}
