package capacity_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// fakeAgent terminates VMs in memory, failing as told.
type fakeAgent struct {
	mu        sync.Mutex
	calls     map[string]int
	failFirst map[string]int  // VM -> number of calls that fail (retryable)
	permanent map[string]bool // VM -> always fails, not retryable
	gone      map[string]bool // VM -> the agent no longer knows it
}

type agentErr struct{ retryable bool }

func (e agentErr) Error() string   { return fmt.Sprintf("agent failed (retryable=%v)", e.retryable) }
func (e agentErr) Retryable() bool { return e.retryable }

func (a *fakeAgent) Terminate(_ context.Context, _ string, vmID string) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.calls == nil {
		a.calls = map[string]int{}
	}
	a.calls[vmID]++
	if a.permanent[vmID] {
		return false, agentErr{false}
	}
	if a.calls[vmID] <= a.failFirst[vmID] {
		return false, agentErr{true}
	}
	return a.gone[vmID], nil
}

func (a *fakeAgent) total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.calls {
		n += c
	}
	return n
}

// evicted reclaims u1 and u2 of the world after placing a second spot VM on u2, and returns
// the committed operation.
func evicted(t *testing.T) (*dynamotest.Env, *capacity.Service, *capacity.Operation) {
	t.Helper()
	env, svc := world(t)
	ctx := context.Background()
	if _, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	res, err := svc.Reclaim(ctx, owner, reclaim("u1", "u2"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
	if err != nil {
		t.Fatal(err)
	}
	if op.State != capacity.OpPendingStart || !slices.Equal(op.VMIDs, []string{"s1", "s2"}) {
		t.Fatalf("operation = %+v", op)
	}
	return env, svc, op
}

// runWorkflow plays the state machine: rounds until done or out of rounds.
func runWorkflow(t *testing.T, term *capacity.Terminator, op *capacity.Operation, maxRounds int) []*capacity.TerminationReport {
	t.Helper()
	task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: op.NodeID, VMIDs: op.VMIDs, ExecutionARN: "arn:exec:" + op.ID, MaxRounds: maxRounds}
	var reports []*capacity.TerminationReport
	for {
		r, err := term.Run(context.Background(), task)
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, r)
		if r.Done {
			return reports
		}
		task = r.Next
	}
}

func TestTerminationCompletes(t *testing.T) {
	env, svc, op := evicted(t)
	agent := &fakeAgent{failFirst: map[string]int{"s1": 2}, gone: map[string]bool{"s2": true}}
	term := &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}
	reports := runWorkflow(t, term, op, 5)
	if len(reports) != 3 {
		t.Fatalf("rounds = %d, want 3 (s1 fails twice)", len(reports))
	}
	ctx := context.Background()
	got, err := env.Store.GetOperation(ctx, "n1", op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != capacity.OpCompleted || got.ExecutionARN != "arn:exec:"+op.ID ||
		got.Outcomes["s1"].Outcome != capacity.OutcomeTerminated || got.Outcomes["s2"].Outcome != capacity.OutcomeAlreadyGone {
		t.Fatalf("operation = %+v", got)
	}
	if agent.calls["s1"] != 3 || agent.calls["s2"] != 1 {
		t.Errorf("agent calls = %v, want s1:3 s2:1", agent.calls)
	}
	// The units are free: a spot VM may land on a released unit again after a release.
	if _, err := svc.Release(ctx, owner, reclaim("u1"), capacity.RequestMeta{}); err != nil {
		t.Fatalf("release after termination: %v", err)
	}
	if _, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s3", OrgID: "b", Tier: capacity.TierSpot, UnitIDs: []string{"u1"}}, capacity.RequestMeta{}); err != nil {
		t.Fatalf("placement on a freed unit: %v", err)
	}
	// Running the finished workflow again calls nobody and writes nothing.
	before := env.Items(t, env.Store.Table)
	calls := agent.total()
	runWorkflow(t, term, op, 5)
	if agent.total() != calls {
		t.Error("a re-run called the agent again")
	}
	after := env.Items(t, env.Store.Table)
	if len(after) != len(before) {
		t.Error("a re-run wrote items")
	}
}

func TestTerminationFailsAfterLastRound(t *testing.T) {
	env, _, op := evicted(t)
	agent := &fakeAgent{failFirst: map[string]int{"s1": 100}}
	term := &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}
	reports := runWorkflow(t, term, op, 3)
	if len(reports) != 3 {
		t.Fatalf("rounds = %d, want 3", len(reports))
	}
	last := reports[len(reports)-1]
	if len(last.Failed) != 1 || last.Failed[0].VMID != "s1" || !last.Failed[0].Final {
		t.Fatalf("last round = %+v", last)
	}
	got, _ := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if got.State != capacity.OpFailed || got.Outcomes["s1"].Outcome != capacity.OutcomeFailed || got.Outcomes["s1"].Error == "" ||
		got.Outcomes["s2"].Outcome != capacity.OutcomeTerminated {
		t.Fatalf("operation = %+v", got)
	}
	st, _ := env.Store.LoadNode(context.Background(), "n1", "")
	for _, vm := range st.VMs {
		if vm.ID == "s1" && vm.State != capacity.VMTerminating {
			t.Errorf("s1 is %s: a VM that may still run must keep its units", vm.State)
		}
	}
}

func TestPermanentAgentErrorIsFinalAtOnce(t *testing.T) {
	env, _, op := evicted(t)
	agent := &fakeAgent{permanent: map[string]bool{"s2": true}}
	reports := runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}, op, 5)
	if len(reports) != 1 || agent.calls["s2"] != 1 {
		t.Fatalf("rounds = %d, calls = %v: a permanent failure must not be retried", len(reports), agent.calls)
	}
	got, _ := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if got.State != capacity.OpFailed {
		t.Fatalf("operation = %+v", got)
	}
}

// Two branches of one operation running at once (as a Map over nodes would, or a retried
// task) end it exactly once and terminate each VM once.
func TestConcurrentBranchesEndTheOperationOnce(t *testing.T) {
	env, _, op := evicted(t)
	agent := &fakeAgent{}
	term := &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, vm := range op.VMIDs {
		wg.Go(func() {
			_, err := term.Run(context.Background(), capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: []string{vm}, ExecutionARN: "arn:x", MaxRounds: 3})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, _ := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if got.State != capacity.OpCompleted || len(got.Outcomes) != 2 {
		t.Fatalf("operation = %+v", got)
	}
	if agent.calls["s1"] != 1 || agent.calls["s2"] != 1 {
		t.Errorf("agent calls = %v", agent.calls)
	}
}

// failingWorkflow fails its first starts, as an outage of Step Functions would.
type failingWorkflow struct {
	mu      sync.Mutex
	fail    int
	started []string
}

func (w *failingWorkflow) Start(_ context.Context, op capacity.Operation) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail > 0 {
		w.fail--
		return errors.New("throttled")
	}
	w.started = append(w.started, op.ID)
	return nil
}

func TestReconcilerStartsWhatTheAPICouldNot(t *testing.T) {
	env, svc := world(t)
	wf := &failingWorkflow{fail: 1}
	svc.Workflow = wf
	res, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("a failed start must not fail the committed reclaim: %v", err)
	}
	rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, Logger: quiet,
		Now: func() time.Time { return t0.Add(time.Hour + 30*time.Second) }}
	report, err := rec.Run(context.Background())
	if err != nil || len(report.Started) != 0 {
		t.Fatalf("too young to start: %+v %v", report, err)
	}
	rec.Now = func() time.Time { return t0.Add(time.Hour + 2*time.Minute) }
	report, err = rec.Run(context.Background())
	if err != nil || !slices.Equal(report.Started, []string{res.ReclaimID}) || !slices.Equal(wf.started, []string{res.ReclaimID}) {
		t.Fatalf("report = %+v, started = %v, err = %v", report, wf.started, err)
	}
	// Once a branch began it, it is no longer pending-start; past the deadline it is stuck.
	op, _ := env.Store.GetOperation(context.Background(), "n1", res.ReclaimID)
	if err := env.Store.BeginTermination(context.Background(), *op, "arn:exec", t0); err != nil {
		t.Fatal(err)
	}
	rec.Now = func() time.Time { return t0.Add(3 * time.Hour) }
	report, err = rec.Run(context.Background())
	if err != nil || len(report.Started) != 0 || len(report.Stuck) != 1 || report.Stuck[0].ID != res.ReclaimID {
		t.Fatalf("report = %+v, err = %v", report, err)
	}
}
