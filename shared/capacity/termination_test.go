package capacity_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

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

// runWorkflow plays the state machine: rounds until done or out of rounds, then the Report
// step (no bus), which ends the operation once every VM is final.
func runWorkflow(t *testing.T, term *capacity.Terminator, op *capacity.Operation, maxRounds int) []*capacity.TerminationReport {
	t.Helper()
	reports := rounds(t, term, op, maxRounds)
	report := &capacity.Announcer{Store: term.Store, Logger: quiet}
	if _, err := report.Report(context.Background(), op.NodeID, op.ID, reports[len(reports)-1].Next.Attempt); err != nil {
		t.Fatal(err)
	}
	return reports
}

// rounds plays the state machine's rounds until done or out of rounds, without its Report.
func rounds(t *testing.T, term *capacity.Terminator, op *capacity.Operation, maxRounds int) []*capacity.TerminationReport {
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
	agent := &capacitytest.Agent{FailFirst: map[string]int{"s1": 2}, Gone: map[string]bool{"s2": true}}
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
	if agent.Calls("s1") != 3 || agent.Calls("s2") != 1 {
		t.Errorf("agent calls = %v, want s1:3 s2:1", agent.AllCalls())
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
	calls := agent.Total()
	runWorkflow(t, term, op, 5)
	if agent.Total() != calls {
		t.Error("a re-run called the agent again")
	}
	after := env.Items(t, env.Store.Table)
	if len(after) != len(before) {
		t.Error("a re-run wrote items")
	}
}

func TestTerminationFailsAfterLastRound(t *testing.T) {
	env, _, op := evicted(t)
	agent := &capacitytest.Agent{FailFirst: map[string]int{"s1": 100}}
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
	agent := &capacitytest.Agent{Permanent: map[string]bool{"s2": true}}
	reports := runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}, op, 5)
	if len(reports) != 1 || agent.Calls("s2") != 1 {
		t.Fatalf("rounds = %d, calls = %v: a permanent failure must not be retried", len(reports), agent.AllCalls())
	}
	got, _ := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if got.State != capacity.OpFailed {
		t.Fatalf("operation = %+v", got)
	}
}

// Two branches of one operation running at once (as a Map over nodes would, or a retried
// task) terminate each VM once; the Report step after them ends it.
func TestConcurrentBranchesEndTheOperationOnce(t *testing.T) {
	env, _, op := evicted(t)
	agent := &capacitytest.Agent{}
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
	reportStep(t, env.Store, op, 1)
	got, _ := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if got.State != capacity.OpCompleted || len(got.Outcomes) != 2 {
		t.Fatalf("operation = %+v", got)
	}
	if agent.Calls("s1") != 1 || agent.Calls("s2") != 1 {
		t.Errorf("agent calls = %v", agent.AllCalls())
	}
}

// reclaimUnderWorkflow gives svc a workflow in memory and reclaims u1 (evicting s1) through it.
func reclaimUnderWorkflow(t *testing.T, svc *capacity.Service) (*capacitytest.Workflow, *capacity.CapacityResult) {
	t.Helper()
	wf := &capacitytest.Workflow{}
	svc.Workflow = wf
	res, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	return wf, res
}

func TestReconcilerStartsWhatTheAPICouldNot(t *testing.T) {
	env, svc := world(t)
	wf := &capacitytest.Workflow{FailStarts: 1}
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
	if err != nil || !slices.Equal(report.Started, []string{res.ReclaimID}) || !slices.Equal(wf.Started(), []string{res.ReclaimID}) {
		t.Fatalf("report = %+v, started = %v, err = %v", report, wf.Started(), err)
	}
	// Once a round began it, it is no longer pending-start; past StuckAfter, its rounds still
	// within a whole attempt's time, it is stuck (not restarted).
	op, _ := env.Store.GetOperation(context.Background(), "n1", res.ReclaimID)
	if err := env.Store.BeginTermination(context.Background(), *op, "arn:exec", t0.Add(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	rec.StuckAfter = 5 * time.Minute
	rec.Now = func() time.Time { return t0.Add(3*time.Hour + 6*time.Minute) }
	report, err = rec.Run(context.Background())
	if err != nil || len(report.Started) != 0 || len(report.Stuck) != 1 || report.Stuck[0].ID != res.ReclaimID {
		t.Fatalf("report = %+v, err = %v", report, err)
	}
}

// eightVictims seeds node n1 with units u0..u7 all released by r1, a spot VM on each, and
// commits a reclaim of all eight through a store without faults. It returns the environment,
// whose store injects inj's faults (nil: none), and the operation.
func eightVictims(t *testing.T, inj *awsfault.Injector) (*dynamotest.Env, *capacity.Operation) {
	t.Helper()
	env := dynamotest.New(t, dynamotest.Faults(inj)...)
	clean := env.Clean()
	units := []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}
	seed := dynamo.Seed{
		Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: units, Version: 1}},
		Reservations: []capacity.Reservation{{
			ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: units, ReleasedUnitIDs: units,
			StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, Version: 1,
		}},
	}
	for i, u := range units {
		seed.VMs = append(seed.VMs, capacity.VM{ID: fmt.Sprintf("s%d", i), NodeID: "n1", OrgID: "buyer", Tier: capacity.TierSpot,
			UnitIDs: []string{u}, State: capacity.VMRunning, Version: 1})
	}
	ctx := context.Background()
	if err := clean.Put(ctx, seed); err != nil {
		t.Fatal(err)
	}
	svc := &capacity.Service{Store: clean, Now: func() time.Time { return t0.Add(time.Hour) }, Logger: quiet}
	res, err := svc.Reclaim(ctx, owner, reclaim(units...), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := clean.GetOperation(ctx, "n1", res.ReclaimID)
	if err != nil || len(op.VMIDs) != 8 {
		t.Fatalf("operation = %+v, %v", op, err)
	}
	return env, op
}

// runRetrying plays the state machine on AWS: a round that returns an error is run again
// (the task's Retry on States.TaskFailed), up to retries times per round.
func runRetrying(t *testing.T, term *capacity.Terminator, task capacity.TerminationTask, retries int) {
	t.Helper()
	for {
		var r *capacity.TerminationReport
		var err error
		for range retries + 1 {
			if r, err = term.Run(context.Background(), task); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("round %d failed %d times: %v", task.Round, retries+1, err)
		}
		if r.Done {
			return
		}
		task = r.Next
	}
}

// AWS cancels or refuses writes that meet another transaction on the same item, and
// throttles; eight terminations in flight at once on one operation meet both. No outcome may
// be lost, and the operation must end. (Before outcomes were items of their own, a
// conflicting outcome transaction was taken as "recorded before": its outcome and its count
// were lost and the operation stayed terminating for good.)
func TestNoOutcomeIsLostUnderConflictsAndThrottling(t *testing.T) {
	for seed := range int64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			inj := awsfault.New(seed,
				awsfault.Rule{Fault: awsfault.TransactionConflict, Rate: 0.3},
				awsfault.Rule{Fault: awsfault.Throttling, Rate: 0.1},
				awsfault.Rule{Fault: awsfault.ProvisionedThroughputExceeded, Rate: 0.1})
			env, op := eightVictims(t, inj)
			agent := &capacitytest.Agent{}
			term := &capacity.Terminator{Store: env.Store, Agent: agent, Concurrency: 8, Logger: quiet}
			runRetrying(t, term, capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:x", MaxRounds: 5}, 3)

			clean := env.Clean()
			reportStep(t, clean, op, 1)
			got, err := clean.GetOperation(context.Background(), "n1", op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != capacity.OpCompleted || len(got.Outcomes) != 8 {
				t.Fatalf("operation %s with %d outcomes, want completed with 8: %+v", got.State, len(got.Outcomes), got.Outcomes)
			}
			st, _ := clean.LoadNode(context.Background(), "n1", "")
			if len(st.VMs) != 0 {
				t.Errorf("VMs still live: %+v", st.VMs)
			}
			if inj.Count(awsfault.TransactionConflict) == 0 {
				t.Error("no conflict was injected: the test proves nothing")
			}
		})
	}
}

// outcomesAllRecorded is evicted's operation begun, its every VM terminated with the outcome
// recorded, and not ended: its last writer crashed between the outcome and the end.
func outcomesAllRecorded(t *testing.T) (*dynamotest.Env, *capacity.Operation) {
	t.Helper()
	env, _, op := evicted(t)
	ctx := context.Background()
	if err := env.Store.BeginTermination(ctx, *op, "arn:x", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, vm := range op.VMIDs {
		if err := env.Store.MarkTerminated(ctx, *op, vm, t0.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := env.Store.RecordOutcome(ctx, *op, vm, capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: t0.Add(time.Hour), Attempt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	return env, op
}

// The reconciler ends a terminating operation whose outcomes are all recorded (its last
// writer crashed between the outcome and the end).
func TestReconcilerEndsAnOperationWhoseOutcomesAreAllRecorded(t *testing.T) {
	env, op := outcomesAllRecorded(t)
	ctx := context.Background()
	wf := &capacitytest.Workflow{}
	_ = wf.Start(ctx, *op)
	rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, Logger: quiet,
		Now: func() time.Time { return t0.Add(time.Hour + 2*time.Minute) }}
	report, err := rec.Run(ctx)
	if err != nil || !slices.Equal(report.Ended, []string{op.ID}) {
		t.Fatalf("report = %+v, err = %v", report, err)
	}
	got, _ := env.Store.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpCompleted {
		t.Fatalf("operation is %s, want completed", got.State)
	}
}

// An execution that closes before its first round (its task retries ran out) leaves the
// operation pending-start; a start of the same name only gets ExecutionAlreadyExists. The
// reconciler restarts it under a new name, a bounded number of times, then fails it with a
// reason.
func TestReconcilerRestartsClosedRunsThenFailsThem(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	wf, res := reclaimUnderWorkflow(t, svc)
	id := res.ReclaimID
	clock := t0.Add(time.Hour)
	rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, MaxRestarts: 2, Logger: quiet,
		Now: func() time.Time { return clock }}
	for i, want := range []string{id + "-2", id + "-3"} {
		wf.Close(wf.Started()[i])
		clock = clock.Add(2 * time.Minute)
		report, err := rec.Run(ctx)
		if err != nil || !slices.Equal(report.Restarted, []string{id}) || len(report.Exhausted) != 0 {
			t.Fatalf("run %d: report = %+v, err = %v", i, report, err)
		}
		if names := wf.Started(); names[len(names)-1] != want {
			t.Fatalf("run %d started %v, want %s last", i, names, want)
		}
		op, _ := env.Store.GetOperation(ctx, "n1", id)
		if op.State != capacity.OpPendingStart || op.CurrentAttempt() != i+2 || op.Restarts != i+1 {
			t.Fatalf("run %d: operation = %+v", i, op)
		}
		// Within the start's grace period nothing more happens.
		if report, _ := rec.Run(ctx); len(report.Started)+len(report.Restarted) != 0 {
			t.Fatalf("a young attempt was restarted again: %+v", report)
		}
	}
	wf.Close(id + "-3")
	clock = clock.Add(2 * time.Minute)
	report, err := rec.Run(ctx)
	if err != nil || len(report.Exhausted) != 1 || report.Exhausted[0].ID != id || len(report.Started) != 0 {
		t.Fatalf("report = %+v, err = %v", report, err)
	}
	op, _ := env.Store.GetOperation(ctx, "n1", id)
	if op.State != capacity.OpFailed || op.Reason == "" {
		t.Fatalf("operation = %+v, want failed with a reason", op)
	}
	if n := len(wf.Started()); n != 3 {
		t.Errorf("%d executions started, want 3 (first + 2 restarts)", n)
	}
	clock = clock.Add(2 * time.Minute)
	if report, _ := rec.Run(ctx); len(report.Started)+len(report.Exhausted) != 0 {
		t.Errorf("a failed operation was reconciled again: %+v", report)
	}
}

// firstExecutionFailed is a reclaim in world under a workflow in memory whose first execution
// failed.
func firstExecutionFailed(t *testing.T) (*dynamotest.Env, *capacitytest.Workflow, *capacity.CapacityResult) {
	t.Helper()
	env, svc := world(t)
	wf, res := reclaimUnderWorkflow(t, svc)
	wf.Close(res.ReclaimID)
	return env, wf, res
}

// Two reconcilers that see the same closed execution restart it once: the attempt moves on
// under a condition on the one they read.
func TestTwoReconcilersRestartOnce(t *testing.T) {
	env, wf, res := firstExecutionFailed(t)
	ctx := context.Background()
	now := func() time.Time { return t0.Add(time.Hour + 2*time.Minute) }
	var wg sync.WaitGroup
	for range 2 {
		rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, Logger: quiet, Now: now}
		wg.Go(func() {
			if _, err := rec.Run(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// One execution of the next attempt. The losing reconciler may ask to start it too (it
	// cannot tell the winner's write from its own whose answer was lost): under the same name
	// that starts nothing more.
	if !slices.Equal(wf.Started(), []string{res.ReclaimID, res.ReclaimID + "-2"}) || wf.Calls(res.ReclaimID+"-2") > 2 {
		t.Fatalf("started %v, calls of the second %d", wf.Started(), wf.Calls(res.ReclaimID+"-2"))
	}
	op, _ := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
	if op.CurrentAttempt() != 2 || op.Restarts != 1 {
		t.Fatalf("operation = %+v", op)
	}
}

// failingStarts is a workflow whose StartChecked fails with an error that is no throttle
// (an access or validation error) while fail is set.
type failingStarts struct {
	*capacitytest.Workflow
	fail bool
}

func (w *failingStarts) StartChecked(ctx context.Context, op capacity.Operation) error {
	if w.fail {
		return errors.New("AccessDeniedException")
	}
	return w.Workflow.StartChecked(ctx, op)
}

// A start that fails (not a throttle, which the drain paces) changes nothing: the operation is
// neither restarted nor failed, and the next run starts it.
func TestReconcilerLeavesAnOperationWhenItsStartFails(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	wf := &capacitytest.Workflow{FailStarts: 1}
	svc.Workflow = wf
	res, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	starts := &failingStarts{Workflow: wf, fail: true}
	rec := &capacity.Reconciler{Store: env.Store, Workflow: starts, StartAfter: time.Minute, StuckAfter: time.Hour, Logger: quiet,
		Now: func() time.Time { return t0.Add(time.Hour + 2*time.Minute) }}
	report, err := rec.Run(ctx)
	if err != nil || !slices.Equal(report.StartFailed, []string{res.ReclaimID}) || len(report.Restarted)+len(report.Started) != 0 {
		t.Fatalf("report = %+v, err = %v", report, err)
	}
	op, _ := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
	if op.State != capacity.OpPendingStart || op.CurrentAttempt() != 1 || op.Restarts != 0 {
		t.Fatalf("operation = %+v", op)
	}
	starts.fail = false
	if report, _ := rec.Run(ctx); !slices.Equal(report.Started, []string{res.ReclaimID}) || len(report.Restarted) != 0 {
		t.Fatalf("next run: %+v", report)
	}
}

// markConflict is a store whose record of one VM is in a state MarkTerminated refuses (as if
// something else had changed it).
type markConflict struct {
	capacity.TerminationStore
	vm string
}

func (s markConflict) MarkTerminated(ctx context.Context, op capacity.Operation, vmID string, now time.Time) error {
	if vmID == s.vm {
		return fmt.Errorf("VM %s is running, not terminating for %s: %w", vmID, op.ID, capacity.ErrConflict)
	}
	return s.TerminationStore.MarkTerminated(ctx, op, vmID, now)
}

// A VM whose record cannot be marked terminated fails alone, with an outcome that says why;
// it does not fail every round, retry and restart of the whole operation.
func TestVMWhoseRecordCannotBeMarkedFailsAlone(t *testing.T) {
	env, _, op := evicted(t)
	term := &capacity.Terminator{Store: markConflict{TerminationStore: env.Store, vm: "s2"}, Agent: &capacitytest.Agent{}, Logger: quiet}
	runWorkflow(t, term, op, 3)
	got, err := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != capacity.OpFailed || got.Outcomes["s1"].Outcome != capacity.OutcomeTerminated ||
		got.Outcomes["s2"].Outcome != capacity.OutcomeFailed || !strings.Contains(got.Outcomes["s2"].Error, "cannot be marked terminated") {
		t.Fatalf("operation = %+v", got)
	}
}

// forgeVMIDs rewrites the operation item's VM list, as a writer of the table who forged it
// would.
func forgeVMIDs(t *testing.T, env *dynamotest.Env, op *capacity.Operation, vmIDs []string) {
	t.Helper()
	for _, it := range env.Items(t, env.Store.Table) {
		if attrString(it["type"]) != "operation" || attrString(it["ID"]) != op.ID {
			continue
		}
		upd, err := expression.NewBuilder().WithUpdate(expression.Set(expression.Name("VMIDs"), expression.Value(vmIDs))).Build()
		if err != nil {
			t.Fatal(err)
		}
		_, err = env.Plain.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
			TableName: aws.String(env.Store.Table), Key: map[string]types.AttributeValue{"pk": it["pk"], "sk": it["sk"]},
			UpdateExpression: upd.Update(), ExpressionAttributeNames: upd.Names(), ExpressionAttributeValues: upd.Values(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no item of operation %s", op.ID)
}

// An operation item that lists VMs their own records do not make its own (a forged or stale
// item) sends no kill for them: only the VMs terminating for the operation are terminated,
// the others fail with an outcome that says why and keep running.
func TestTerminationKillsOnlyVMsTerminatingForTheOperation(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	if _, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	res, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := svc.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
	if err != nil {
		t.Fatal(err)
	}
	forgeVMIDs(t, env, op, []string{"s1", "s2", "v0", "ghost"})
	if op, err = env.Store.GetOperation(ctx, "n1", res.ReclaimID); err != nil {
		t.Fatal(err)
	}
	agent := &capacitytest.Agent{}
	runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}, op, 3)

	got, err := env.Store.GetOperation(ctx, "n1", op.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	state := map[string]capacity.VM{}
	for _, vm := range st.VMs {
		state[vm.ID] = vm
	}
	for _, tc := range []struct {
		name, vm  string
		calls     int
		outcome   capacity.Outcome
		liveState capacity.VMState // "" : not live any more
		reclaimID string
	}{
		{name: "terminating for this operation", vm: "s1", calls: 1, outcome: capacity.OutcomeTerminated},
		{name: "terminating for another operation", vm: "s2", outcome: capacity.OutcomeFailed, liveState: capacity.VMTerminating, reclaimID: other.ReclaimID},
		{name: "running", vm: "v0", outcome: capacity.OutcomeFailed, liveState: capacity.VMRunning},
		{name: "unknown", vm: "ghost", outcome: capacity.OutcomeFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n := agent.Calls(tc.vm); n != tc.calls {
				t.Errorf("agent calls for %s = %d, want %d", tc.vm, n, tc.calls)
			}
			if o := got.Outcomes[tc.vm]; o.Outcome != tc.outcome {
				t.Errorf("outcome of %s = %+v, want %s", tc.vm, o, tc.outcome)
			}
			if vm := state[tc.vm]; vm.State != tc.liveState || vm.ReclaimID != tc.reclaimID {
				t.Errorf("record of %s = %s for %q, want %s for %q", tc.vm, vm.State, vm.ReclaimID, tc.liveState, tc.reclaimID)
			}
		})
	}
}
