package capacity_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// backlog seeds n pending-start operations, one spot VM each, as a burst whose every
// StartExecution was throttled leaves them, created 100 ms apart from t0+1h (a burst) with
// the grace given. It returns their ids in creation order.
func backlog(t *testing.T, env *dynamotest.Env, n int, grace time.Duration) []string {
	t.Helper()
	return seedBacklog(t, env, n, grace)
}

func seedBacklog(t testing.TB, env *dynamotest.Env, n int, grace time.Duration) []string {
	t.Helper()
	var seed dynamo.Seed
	ids := make([]string, 0, n)
	for i := range n {
		at := t0.Add(time.Hour + time.Duration(i)*100*time.Millisecond)
		op := capacity.Operation{ID: fmt.Sprintf("rcl_%04d", i), NodeID: fmt.Sprintf("n%d", i/8), ReservationID: "r1",
			State: capacity.OpPendingStart, VMIDs: []string{fmt.Sprintf("s%d", i)}, UnitIDs: []string{fmt.Sprintf("u%d", i%8)},
			Attempt: 1, CreatedAt: at, UpdatedAt: at, TerminateAfter: at.Add(grace)}
		seed.Operations = append(seed.Operations, op)
		ids = append(ids, op.ID)
	}
	if err := env.Clean().Put(context.Background(), seed); err != nil {
		t.Fatal(err)
	}
	return ids
}

// A burst's backlog of 1,000 pending-start operations is drained in one run against a Step
// Functions that throttles StartExecution (half of all attempts, so the SDK's retryer gives
// up on some and its retry quota runs dry): every operation is started exactly once, in
// one run, none fails, and the run is not cut short.
func TestReconcilerDrainsAThrottledBacklogInOneRun(t *testing.T) {
	inj := awsfault.New(7, awsfault.Rule{Operation: "StartExecution", Fault: awsfault.StartThrottling, Rate: 0.5})
	env := dynamotest.New(t)
	seeded := time.Now()
	ids := backlog(t, env, 1000, 0)
	t.Logf("seeded in %s", time.Since(seeded))
	ran := time.Now()
	wf := env.Workflow(t, inj.APIOption)
	end := t0.Add(time.Hour + 100*time.Second)
	rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 30 * time.Second, StuckAfter: time.Hour, Logger: quiet,
		Now: func() time.Time { return end.Add(time.Minute) }, StartRate: 1e6, ThrottleBackoff: time.Millisecond, DrainFor: 10 * time.Minute}
	report, err := rec.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ran in %s", time.Since(ran))
	if report.DrainCut || len(report.StartFailed) != 0 || len(report.Restarted) != 0 {
		t.Fatalf("cut %v, %d start failures, %d restarts (faults %v)", report.DrainCut, len(report.StartFailed), len(report.Restarted), inj.Counts())
	}
	started := slices.Sorted(slices.Values(report.Started))
	if want := slices.Sorted(slices.Values(ids)); !slices.Equal(started, want) {
		t.Fatalf("started %d operations, want the 1,000 of the backlog once each", len(started))
	}
	if n := inj.Count(awsfault.StartThrottling); n < 400 {
		t.Errorf("%d starts throttled; the test proves little", n)
	}
	t.Logf("%d StartExecution attempts throttled; %d of %d starts throttled past the SDK's retries, then started",
		inj.Count(awsfault.StartThrottling), env.Calls.Snapshot()["StartExecution"]-1000, env.Calls.Snapshot()["StartExecution"])
}

// Operations still in their grace period are left alone and not even read (the index
// carries their grace: a burst with a grace must not cost a read each a minute); once past
// it they are all started; a run whose time is spent starts nothing and says so.
func TestReconcilerDrainLeavesThoseInGrace(t *testing.T) {
	env := dynamotest.New(t)
	backlog(t, env, 30, 10*time.Minute) // rcl_0000..rcl_0029, created t0+1h+i*100ms
	wf := &capacitytest.Workflow{}
	at := t0.Add(time.Hour + 5*time.Minute) // all in grace
	rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 30 * time.Second, StuckAfter: time.Hour, Logger: quiet,
		Now: func() time.Time { return at }, Batch: 4, StartRate: 1e6}
	// A run before any is due lists them (its queries are the listing's alone).
	listing := func() int64 {
		t.Helper()
		before := env.Calls.Snapshot()["Query"]
		if _, err := rec.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		return env.Calls.Snapshot()["Query"] - before
	}
	at = t0.Add(time.Hour)
	base := listing()
	at = t0.Add(time.Hour + 5*time.Minute)
	before := env.Calls.Snapshot()["Query"]
	report, err := rec.Run(context.Background())
	if err != nil || len(report.Started) != 0 || len(wf.Started()) != 0 {
		t.Fatalf("in grace: started %v (workflow %v), %v: want none", report.Started, wf.Started(), err)
	}
	if reads := env.Calls.Snapshot()["Query"] - before - base; reads > 0 {
		t.Errorf("%d queries more than the listing's %d for 30 operations in grace: they were read", reads, base)
	}
	at = t0.Add(time.Hour + 12*time.Minute) // all past their grace
	report, err = rec.Run(context.Background())
	if err != nil || len(report.Started) != 30 || len(wf.Started()) != 30 || len(report.Restarted) != 0 {
		t.Fatalf("past grace: started %d (workflow %d), restarted %d, %v: want all 30 started", len(report.Started), len(wf.Started()), len(report.Restarted), err)
	}
	rec.DrainFor = time.Nanosecond
	report, err = rec.Run(context.Background())
	if err != nil || !report.DrainCut || len(report.Started) != 0 {
		t.Fatalf("no time: cut %v, started %d, %v", report.DrainCut, len(report.Started), err)
	}
}

// BenchmarkReconcilerDrain measures one run's drain of a 1,000-operation backlog on the
// emulator, at the default start rate (paced) and unpaced (what the loop itself allows), as
// starts a second.
//
//	go test ./shared/capacity -run XXX -bench ReconcilerDrain -benchtime 1x
func BenchmarkReconcilerDrain(b *testing.B) {
	for _, bc := range []struct {
		name string
		rate float64
	}{{"paced", 0}, {"unpaced", 1e6}} {
		b.Run(bc.name, func(b *testing.B) {
			started := 0
			var took time.Duration
			for range b.N {
				b.StopTimer()
				env := dynamotest.New(b)
				seedBacklog(b, env, 1000, 0)
				wf := &capacitytest.Workflow{}
				rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 30 * time.Second, StuckAfter: time.Hour, Logger: quiet,
					Now: func() time.Time { return t0.Add(2 * time.Hour) }, StartRate: bc.rate}
				b.StartTimer()
				at := time.Now()
				report, err := rec.Run(context.Background())
				took += time.Since(at)
				if err != nil || report.DrainCut {
					b.Fatalf("cut %v, %v", report.DrainCut, err)
				}
				started += len(report.Started)
			}
			b.ReportMetric(float64(started)/took.Seconds(), "starts/s")
		})
	}
}
