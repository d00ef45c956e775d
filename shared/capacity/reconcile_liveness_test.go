package capacity_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// committed is when world's service commits a reclaim.
var committed = t0.Add(time.Hour)

// livenessReconciler is a reconciler with the service's bounds (START_AFTER 30 s, a 10 min
// attempt bound, STUCK_AFTER 15 min) at the clock's time.
func livenessReconciler(env *dynamotest.Env, wf capacity.WorkflowInspector, now time.Time) *capacity.Reconciler {
	return &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 30 * time.Second, StuckAfter: 15 * time.Minute,
		AttemptBound: capacity.DefaultAttemptBound, ThrottleBackoff: time.Millisecond, Logger: quiet,
		Now: func() time.Time { return now }}
}

// begun is evicted's operation (VMs s1, s2) begun by its first round at the time, its outcomes
// as given (VM -> when recorded; terminated).
func begun(t *testing.T, at time.Time, outcomes map[string]time.Time) (*dynamotest.Env, *capacity.Operation) {
	t.Helper()
	env, _, op := evicted(t)
	ctx := context.Background()
	if err := env.Store.BeginTermination(ctx, *op, "arn:exec:"+op.ID, at); err != nil {
		t.Fatal(err)
	}
	for vm, when := range outcomes {
		if err := env.Store.MarkTerminated(ctx, *op, vm, when); err != nil {
			t.Fatal(err)
		}
		if err := env.Store.RecordOutcome(ctx, *op, vm, capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: when, Attempt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	return env, op
}

// A terminating operation is restarted as its next attempt only once no run has changed it
// (its begin, its newest outcome) for longer than a whole attempt takes alive: never while
// its rounds go on, however slow (5 rounds of agents timing out at 60 s, each round writing
// nothing); an alive one past STUCK_AFTER is reported instead.
func TestReconcilerRestartsATerminatingOperationOnlyWhenIdle(t *testing.T) {
	tests := []struct {
		name     string
		outcomes map[string]time.Time // terminated VMs, and when recorded
		at       time.Duration        // the reconciler's run, after the first round began it
		restart  bool
		stuck    bool
	}{
		{name: "alive in its 5th round (4 rounds of 60 s timeouts and 10 s waits, nothing written)", at: 5*time.Minute + 50*time.Second},
		{name: "a round just wrote an outcome", outcomes: map[string]time.Time{"s1": committed.Add(8 * time.Minute)}, at: 12 * time.Minute},
		{name: "alive but slow past STUCK_AFTER", outcomes: map[string]time.Time{"s1": committed.Add(14 * time.Minute)}, at: 16 * time.Minute, stuck: true},
		{name: "its scheduled round lost: no change for the attempt bound", at: 10 * time.Minute, restart: true},
		{name: "its last outcome long ago, the other VM's holder died", outcomes: map[string]time.Time{"s1": committed.Add(time.Minute)}, at: 11 * time.Minute, restart: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, op := begun(t, committed, tt.outcomes)
			ctx := context.Background()
			wf := &capacitytest.Workflow{Express: true}
			report, err := livenessReconciler(env, wf, committed.Add(tt.at)).Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got, err := env.Store.GetOperation(ctx, "n1", op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.restart {
				if len(report.Restarted)+len(report.Started) != 0 || got.State != capacity.OpTerminating || got.CurrentAttempt() != 1 {
					t.Fatalf("report %+v, operation %s at attempt %d: want it left to its rounds", report, got.State, got.CurrentAttempt())
				}
				if stuck := len(report.Stuck) == 1; stuck != tt.stuck {
					t.Fatalf("stuck %v, want %v", report.Stuck, tt.stuck)
				}
				return
			}
			if !slices.Equal(report.Restarted, []string{op.ID}) || len(report.Stuck) != 0 {
				t.Fatalf("report %+v: want %s restarted", report, op.ID)
			}
			if got.State != capacity.OpPendingStart || got.CurrentAttempt() != 2 || got.Restarts != 1 {
				t.Errorf("operation %s attempt %d restarts %d, want pending-start at attempt 2 after 1 restart", got.State, got.CurrentAttempt(), got.Restarts)
			}
			if !slices.Equal(wf.Started(), []string{op.ID + "-2"}) || !slices.Equal(wf.Inputs(op.ID+"-2"), got.Unfinished()) {
				t.Errorf("started %v with %v, want %s-2 for the VMs without an outcome", wf.Started(), wf.Inputs(op.ID+"-2"), op.ID)
			}
		})
	}
}

// A pending-start operation is left alone within its grace and START_AFTER past it (its
// first step's run, or the round scheduled after its grace, may still begin it); past that
// its first step was lost or its start throttled, and it is started again under the same
// attempt, no restart counted (a second run is a duplicate delivery). Still not begun a whole
// attempt's time past that, it is restarted as the next attempt.
func TestReconcilerStartsAPendingOperationAgainThenRestartsIt(t *testing.T) {
	const grace = 120 * time.Second
	tests := []struct {
		name    string
		at      time.Duration // the reconciler's run, after the commit
		again   bool          // the same attempt started again
		restart bool
	}{
		{name: "in its grace", at: grace - time.Second},
		{name: "within START_AFTER past its grace", at: grace + 29*time.Second},
		{name: "the round after its grace lost", at: grace + 31*time.Second, again: true},
		{name: "still not begun just within the attempt bound", at: grace + 30*time.Second + 10*time.Minute - time.Second, again: true},
		{name: "not begun a whole attempt past due", at: grace + 30*time.Second + 10*time.Minute, restart: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			wf := &capacitytest.Workflow{Express: true}
			svc.Workflow = wf
			req := reclaim("u1")
			req.GraceSeconds = int(grace / time.Second)
			res, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			id := res.ReclaimID
			report, err := livenessReconciler(env, wf, committed.Add(tt.at)).Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			op, err := env.Store.GetOperation(ctx, "n1", id)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			switch {
			case tt.again:
				want = []string{id, id}
				if !slices.Equal(report.Started, []string{id}) || len(report.Restarted) != 0 || op.CurrentAttempt() != 1 || op.Restarts != 0 {
					t.Errorf("report %+v, operation attempt %d restarts %d: want the attempt started again, no restart", report, op.CurrentAttempt(), op.Restarts)
				}
			case tt.restart:
				want = []string{id, id + "-2"}
				if !slices.Equal(report.Restarted, []string{id}) || op.CurrentAttempt() != 2 || op.Restarts != 1 || op.State != capacity.OpPendingStart {
					t.Errorf("report %+v, operation %s attempt %d restarts %d: want it restarted", report, op.State, op.CurrentAttempt(), op.Restarts)
				}
			default:
				want = []string{id}
				if len(report.Started)+len(report.Restarted)+len(report.StartFailed) != 0 {
					t.Errorf("report %+v: want nothing done", report)
				}
			}
			if got := wf.Started(); !slices.Equal(got, want) {
				t.Errorf("runs %v, want %v", got, want)
			}
		})
	}
}

// A burst's throttled starts are made good by the drain at the rate allowed, without counting
// a restart: the operation stays at its attempt, and the run started it once it was let.
func TestReconcilerRetriesAThrottledStartWithoutARestart(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	wf := &capacitytest.Workflow{Express: true, FailStarts: 1}
	svc.Workflow = wf // the API's start is throttled
	res, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	wf.FailStarts = 3 // and the reconciler's first three
	report, err := livenessReconciler(env, wf, committed.Add(time.Minute)).Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(report.Started, []string{res.ReclaimID}) || len(report.Restarted)+len(report.StartFailed) != 0 {
		t.Fatalf("report %+v: want it started, no restart, no failure", report)
	}
	if !slices.Equal(wf.Started(), []string{res.ReclaimID}) || wf.Calls(res.ReclaimID) != 5 {
		t.Fatalf("runs %v after %d calls, want one run after the API's and three throttled starts", wf.Started(), wf.Calls(res.ReclaimID))
	}
	op, _ := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
	if op.State != capacity.OpPendingStart || op.CurrentAttempt() != 1 || op.Restarts != 0 {
		t.Fatalf("operation %+v", op)
	}
}

// An operation whose attempts keep making no progress is restarted MaxRestarts times, then
// failed with a reason that says so (and its report published first).
func TestReconcilerFailsAnIdleOperationOnceItsRestartsAreSpent(t *testing.T) {
	env, op := begun(t, committed, nil)
	ctx := context.Background()
	wf := &capacitytest.Workflow{Express: true}
	pub := &capacitytest.Publisher{}
	clock := committed.Add(10 * time.Minute)
	rec := livenessReconciler(env, wf, clock)
	rec.MaxRestarts, rec.Publisher, rec.Claims = 1, pub, env.Store
	rec.Now = func() time.Time { return clock }
	if report, err := rec.Run(ctx); err != nil || !slices.Equal(report.Restarted, []string{op.ID}) {
		t.Fatalf("first run: %+v, %v", report, err)
	}
	// The restarted attempt's runs never begin it either.
	clock = clock.Add(30*time.Second + 10*time.Minute)
	report, err := rec.Run(ctx)
	if err != nil || len(report.Exhausted) != 1 || len(report.Started) != 0 {
		t.Fatalf("second run: %+v, %v", report, err)
	}
	got, _ := env.Store.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpFailed || !strings.Contains(got.Reason, "no progress 2 times") {
		t.Fatalf("operation %s, reason %q: want failed, saying why", got.State, got.Reason)
	}
	if ids := ids(pub.Published()); !slices.Equal(ids, []string{"Reclaim Operation Failed " + op.ID + "/end/2"}) {
		t.Fatalf("published %v", ids)
	}
	// Its report went out under the claim: no later check publishes it again.
	clock = clock.Add(time.Minute)
	if report, err := rec.Run(ctx); err != nil || len(report.Reported)+len(report.Exhausted) != 0 || len(pub.Published()) != 1 {
		t.Fatalf("later run: %+v, %v, published %d", report, err, len(pub.Published()))
	}
}

// cutOffBeforeReport is evicted's operation whose rounds terminated every VM at committed,
// its run cut off before its Report step: terminating, every VM final.
func cutOffBeforeReport(t *testing.T) (*dynamotest.Env, *capacity.Operation) {
	t.Helper()
	env, _, op := evicted(t)
	term := &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Logger: quiet, Now: func() time.Time { return committed }}
	rounds(t, term, op, 5)
	got, err := env.Store.GetOperation(context.Background(), "n1", op.ID)
	if err != nil || got.State != capacity.OpTerminating || !got.Ended() {
		t.Fatalf("operation %+v, %v: want terminating, every VM final", got, err)
	}
	return env, got
}

// A terminating operation whose VMs are all final and whose Report step never came is
// reported and ended by the reconciler once it has not changed for about 2 minutes: by one of
// two reconcilers running at once, not again by a later run, nor by the run's Report step
// delivered late.
func TestReconcilerReportsAndEndsWhatACutOffRunLeftOutOnce(t *testing.T) {
	env, op := cutOffBeforeReport(t)
	ctx := context.Background()
	pub := &capacitytest.Publisher{}
	wf := &capacitytest.Workflow{Express: true}
	reconciler := func(at time.Time) *capacity.Reconciler {
		rec := livenessReconciler(env, wf, at)
		rec.Publisher, rec.Claims = pub, env.Store
		return rec
	}
	// Within 2 minutes of its last outcome its Report step may still run: left to it.
	if report, err := reconciler(committed.Add(time.Minute)).Run(ctx); err != nil || len(report.Reported)+len(report.Ended) != 0 || pub.Calls() != 0 {
		t.Fatalf("young: %+v, %v, %d publishes", report, err, pub.Calls())
	}
	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		reported, ended []string
	)
	for range 2 {
		rec := reconciler(committed.Add(2*time.Minute + 5*time.Second))
		wg.Go(func() {
			report, err := rec.Run(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			reported, ended = append(reported, report.Reported...), append(ended, report.Ended...)
			mu.Unlock()
		})
	}
	wg.Wait()
	want := []string{"Spot VM Terminated " + op.ID + "/vm/s1/1", "Spot VM Terminated " + op.ID + "/vm/s2/1", "Reclaim Operation Completed " + op.ID + "/end/1"}
	if !slices.Equal(reported, []string{op.ID}) || !slices.Equal(ended, []string{op.ID}) || !slices.Equal(ids(pub.Published()), want) {
		t.Fatalf("reported by %v, ended by %v, published %v: want once, %v", reported, ended, ids(pub.Published()), want)
	}
	if got, err := env.Store.GetOperation(ctx, "n1", op.ID); err != nil || got.State != capacity.OpCompleted {
		t.Fatalf("operation %+v, %v: want completed", got, err)
	}
	// Later runs, and the Report step delivered late, publish nothing more.
	if report, err := reconciler(committed.Add(5 * time.Minute)).Run(ctx); err != nil || len(report.Reported) != 0 {
		t.Fatalf("later run: %+v, %v", report, err)
	}
	late := &capacity.Announcer{Store: env.Store, Publisher: pub, Claims: env.Store, Logger: quiet, Now: func() time.Time { return committed.Add(time.Hour) }}
	if n, err := late.Report(ctx, "n1", op.ID, 1); err != nil || n != 0 {
		t.Fatalf("late report step published %d, %v", n, err)
	}
	if n := len(pub.Published()); n != len(want) {
		t.Fatalf("%d events published, want %d", n, len(want))
	}
}

// Which terminating operations with every VM final the reconciler reports and ends: only one
// its Report step left out (not one the step ended), once it has not changed for 2 minutes,
// however long the reconciler was down; never restarted (its VMs are final).
func TestReconcilerReportsOnlyWhatIsMissing(t *testing.T) {
	tests := []struct {
		name     string
		reported bool          // its Report step ran
		at       time.Duration // the reconciler's run after the last outcome
		want     bool
	}{
		{name: "reported by its run", reported: true, at: 3 * time.Minute},
		{name: "missing, young: left to its Report step", at: 90 * time.Second},
		{name: "missing, idle 2 minutes", at: 2*time.Minute + time.Second, want: true},
		{name: "missing, idle past the attempt bound (reconciler down)", at: 3 * time.Hour, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, op := cutOffBeforeReport(t)
			ctx := context.Background()
			pub := &capacitytest.Publisher{}
			if tt.reported {
				a := &capacity.Announcer{Store: env.Store, Publisher: &capacitytest.Publisher{}, Claims: env.Store, Logger: quiet,
					Now: func() time.Time { return committed }}
				if _, err := a.Report(ctx, "n1", op.ID, 1); err != nil {
					t.Fatal(err)
				}
			}
			rec := livenessReconciler(env, &capacitytest.Workflow{}, committed.Add(tt.at))
			rec.Publisher, rec.Claims = pub, env.Store
			report, err := rec.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(report.Restarted) != 0 {
				t.Fatalf("restarted %v", report.Restarted)
			}
			if got := slices.Equal(report.Reported, []string{op.ID}) && pub.Calls() == 1; got != tt.want || (!tt.want && pub.Calls() != 0) {
				t.Fatalf("report %+v, %d publishes: want published %v", report, pub.Calls(), tt.want)
			}
			got, err := env.Store.GetOperation(ctx, "n1", op.ID)
			if ended := err == nil && got.State == capacity.OpCompleted; ended != (tt.want || tt.reported) {
				t.Fatalf("operation %+v, %v: ended %v, want %v", got, err, ended, tt.want || tt.reported)
			}
		})
	}
}

// Two reconcilers that find the same idle operation at once restart it once: the attempt moves
// on under a condition on the state and attempt both read.
func TestTwoReconcilersRestartAnIdleOperationOnce(t *testing.T) {
	env, op := begun(t, committed, nil)
	ctx := context.Background()
	wf := &capacitytest.Workflow{Express: true}
	var wg sync.WaitGroup
	for range 2 {
		rec := livenessReconciler(env, wf, committed.Add(11*time.Minute))
		wg.Go(func() {
			if _, err := rec.Run(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, _ := env.Store.GetOperation(ctx, "n1", op.ID)
	if got.State != capacity.OpPendingStart || got.CurrentAttempt() != 2 || got.Restarts != 1 {
		t.Fatalf("operation %s attempt %d restarts %d: want one restart", got.State, got.CurrentAttempt(), got.Restarts)
	}
	// The loser may start the new attempt too (it cannot tell the winner's write from its own
	// whose answer was lost): a duplicate run of its first step, never a third attempt.
	for _, name := range wf.Started() {
		if name != op.ID+"-2" {
			t.Fatalf("runs %v, want only %s-2", wf.Started(), op.ID)
		}
	}
}
