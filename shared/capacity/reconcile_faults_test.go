package capacity_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// The reconciler under AWS's conflicts and throttling: a run may fail part-way, but runs
// repeated until one restarts a closed execution restart it exactly once, under the next
// name, and never start the same attempt twice.
func TestReconcilerUnderAWSFaults(t *testing.T) {
	injected := 0
	for seed := range int64(10) {
		rules := []awsfault.Rule{
			{Operation: "UpdateItem", Fault: awsfault.TransactionConflict, Rate: 0.4},
			{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.4},
			{Fault: awsfault.Throttling, Rate: 0.3},
			{Fault: awsfault.ProvisionedThroughputExceeded, Rate: 0.1},
		}
		env, _, inj := faultyWorld(t, seed, rules...)
		ctx := context.Background()
		// The reclaim commits without faults; the reconciler's every call risks one.
		clean := cleanService(env)
		wf, res := reclaimUnderWorkflow(t, clean)
		wf.Close(res.ReclaimID)
		rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, Logger: quiet,
			Now: func() time.Time { return t0.Add(time.Hour + 2*time.Minute) }}
		restarted := false
		for run := 0; run < 30 && !restarted; run++ {
			report, _ := rec.Run(ctx) // a run may fail part-way
			// A listing that failed after the restart does not hide it.
			restarted = slices.Contains(report.Restarted, res.ReclaimID)
		}
		if !restarted {
			t.Fatalf("seed %d: no restart after 30 runs (faults %v)", seed, inj.Counts())
		}
		if got, want := wf.Started(), []string{res.ReclaimID, res.ReclaimID + "-2"}; !slices.Equal(got, want) {
			t.Fatalf("seed %d: started %v, want %v", seed, got, want)
		}
		for _, name := range wf.Started() {
			if n := wf.Calls(name); n != 1 {
				t.Errorf("seed %d: execution %s started %d times", seed, name, n)
			}
		}
		op, err := clean.Store.GetOperation(ctx, "n1", res.ReclaimID)
		if err != nil || op.CurrentAttempt() != 2 || op.State != capacity.OpPendingStart {
			t.Fatalf("seed %d: operation = %+v, err = %v", seed, op, err)
		}
		for _, n := range inj.Counts() {
			injected += n
		}
	}
	t.Logf("%d faults injected", injected)
	if injected < 10 {
		t.Errorf("%d faults injected over all seeds; the test proves little", injected)
	}
}

// A restart or a failure whose answer was lost (applied, then the SDK's retry fails the
// condition it already met) is still this run's: the restart's attempt is started, and the
// exhausted operation is reported, so its alarm fires.
func TestReconcilerWritesWhoseAnswerWasLost(t *testing.T) {
	lost := awsfault.Rule{Operation: "UpdateItem", Fault: awsfault.AmbiguousTimeout, Rate: 1}
	env, _, inj := faultyWorld(t, 1, lost)
	ctx := context.Background()
	wf, res := reclaimUnderWorkflow(t, cleanService(env))
	clock := t0.Add(time.Hour)
	rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, MaxRestarts: 1, Logger: quiet,
		Now: func() time.Time { return clock }}

	wf.Close(res.ReclaimID)
	clock = clock.Add(2 * time.Minute)
	report, err := rec.Run(ctx)
	if err != nil || !slices.Contains(report.Restarted, res.ReclaimID) || !slices.Equal(wf.Started(), []string{res.ReclaimID, res.ReclaimID + "-2"}) {
		t.Fatalf("restart: report %+v, started %v, err %v (faults %v)", report, wf.Started(), err, inj.Counts())
	}

	wf.Close(res.ReclaimID + "-2")
	clock = clock.Add(2 * time.Minute)
	report, err = rec.Run(ctx)
	if err != nil || len(report.Exhausted) != 1 || report.Exhausted[0].ID != res.ReclaimID {
		t.Fatalf("exhausted: report %+v, err %v (faults %v)", report, err, inj.Counts())
	}
	if inj.Count(awsfault.AmbiguousTimeout) < 2 {
		t.Errorf("%d answers lost, want both writes'", inj.Count(awsfault.AmbiguousTimeout))
	}
}

// cleanService is a service over env's tables through its client without faults.
func cleanService(env *dynamotest.Env) *capacity.Service {
	store := env.Clean()
	store.KeysTable = env.Store.KeysTable
	return &capacity.Service{Store: store, Now: func() time.Time { return t0.Add(time.Hour) }, Logger: quiet}
}
