package capacity_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// Exactly-once termination when a step is delivered twice at once (SQS and Express run at
// least once; a Standard task retried after a lost answer too): see "Express redesign" in
// docs/termination.md.

// gate holds the side effects of two runs until both have got as far as a test needs: each
// counter opens it on reaching its count. So the runs overlap for certain, and a run that no
// longer claims (which the test must catch) opens it by reaching the side effect twice over,
// rather than hang.
type gate struct {
	open chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) count(c *atomic.Int64, at int64) {
	if c.Add(1) == at {
		g.once.Do(func() { close(g.open) })
	}
}

// claimCounter opens the gate once both runs have asked for every VM's claim.
type claimCounter struct {
	capacity.TerminationStore
	gate   *gate
	claims atomic.Int64
	want   int64
}

func (s *claimCounter) ClaimTermination(ctx context.Context, op capacity.Operation, vmID, holder string, now, until time.Time) (capacity.TerminateClaim, error) {
	claim, err := s.TerminationStore.ClaimTermination(ctx, op, vmID, holder, now, until)
	s.gate.count(&s.claims, s.want)
	return claim, err
}

// heldAgent answers only once the gate is open (or every call of both runs has arrived).
type heldAgent struct {
	*capacitytest.Agent
	gate    *gate
	entered *atomic.Int64
	all     int64
}

func (a heldAgent) Terminate(ctx context.Context, node capacity.Node, vmID string) (bool, error) {
	a.gate.count(a.entered, a.all)
	<-a.gate.open
	return a.Agent.Terminate(ctx, node, vmID)
}

// endCounter counts the operations ended.
type endCounter struct{ ended atomic.Int64 }

func (m *endCounter) Call(context.Context, capacity.CallOutcome) {}
func (m *endCounter) OperationEnded(context.Context, capacity.Operation, time.Time) {
	m.ended.Add(1)
}

// The same round delivered twice at once, as two runs (two executions, so two holders): each
// VM's agent is called once, each VM gets one outcome item, and the run that found a VM
// claimed neither calls nor fails it. Neither ends the operation: its Report step does.
func TestDuplicateRoundsAtOnceTerminateEachVMOnce(t *testing.T) {
	env, op := eightVictims(t, nil)
	g := newGate()
	twice := 2 * int64(len(op.VMIDs))
	store := &claimCounter{TerminationStore: env.Store, gate: g, want: twice}
	agent := &capacitytest.Agent{}
	term := &capacity.Terminator{Store: store, Agent: heldAgent{Agent: agent, gate: g, entered: new(atomic.Int64), all: twice},
		Concurrency: 8, Logger: quiet}

	var wg sync.WaitGroup
	reports := make([]*capacity.TerminationReport, 2)
	for i, exec := range []string{"arn:exec:delivery-1", "arn:exec:delivery-2"} {
		wg.Go(func() {
			task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: exec, MaxRounds: 5}
			r, err := term.Run(context.Background(), task)
			if err != nil {
				t.Error(err)
				return
			}
			reports[i] = r
			for !r.Done { // the duplicate's next rounds find the outcomes and call nobody
				if r, err = term.Run(context.Background(), r.Next); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	for _, vm := range op.VMIDs {
		if n := agent.Calls(vm); n != 1 {
			t.Errorf("agent asked to terminate %s %d times, want once", vm, n)
		}
	}
	busy := len(reports[0].Busy) + len(reports[1].Busy)
	called := len(reports[0].Terminated) + len(reports[1].Terminated)
	if busy != len(op.VMIDs) || called != len(op.VMIDs) || len(reports[0].Failed)+len(reports[1].Failed) != 0 {
		t.Errorf("first rounds: %d busy, %d terminated, failed %v %v; want %d each, none failed",
			busy, called, reports[0].Failed, reports[1].Failed, len(op.VMIDs))
	}
	got, err := env.Clean().GetOperation(context.Background(), "n1", op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != capacity.OpTerminating || !got.Ended() || got.EndState() != capacity.OpCompleted {
		t.Errorf("operation %s, every VM final %v; want terminating with every VM terminated, left to its Report", got.State, got.Ended())
	}
	outcomes := 0
	for _, it := range env.Items(t, env.Store.Table) {
		if attrString(it["type"]) == "outcome" && attrString(it["ReclaimID"]) == op.ID {
			outcomes++
		}
	}
	if outcomes != len(op.VMIDs) {
		t.Errorf("%d outcome items, want %d", outcomes, len(op.VMIDs))
	}
}

// A VM whose claim another run holds on the last round is left to that run: not recorded as
// failed, not called.
func TestBusyVMOnTheLastRoundIsLeftToItsHolder(t *testing.T) {
	env, op := eightVictims(t, nil)
	ctx := context.Background()
	now := time.Now().UTC()
	if _, err := env.Store.ClaimTermination(ctx, *op, "s0", "another-run", now, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	agent := &capacitytest.Agent{}
	term := &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}
	r, err := term.Run(ctx, capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:x", Round: 4, MaxRounds: 5})
	if err != nil {
		t.Fatal(err)
	}
	if agent.Calls("s0") != 0 || len(r.Busy) != 1 || r.Busy[0] != "s0" || len(r.Failed) != 0 || len(r.Next.VMIDs) != 0 {
		t.Fatalf("report %+v, %d calls of s0; want s0 busy, not called, not failed, nothing to retry", r, agent.Calls("s0"))
	}
	got, _ := env.Clean().GetOperation(ctx, "n1", op.ID)
	if _, ok := got.Outcomes["s0"]; ok || got.State != capacity.OpTerminating {
		t.Fatalf("operation %s with s0's outcome %+v: want terminating, s0 without one (its holder records it)", got.State, got.Outcomes["s0"])
	}
}

// reportStep runs the workflow's Report step of the operation's attempt (no bus).
func reportStep(t *testing.T, store capacity.TerminationStore, op *capacity.Operation, attempt int) {
	t.Helper()
	a := &capacity.Announcer{Store: store, Claims: store.(capacity.ReportClaims), Logger: quiet}
	if _, err := a.Report(context.Background(), op.NodeID, op.ID, attempt); err != nil {
		t.Fatal(err)
	}
}

// staleFirstRead answers the first GetOperation without outcomes, as a run that read the
// operation before another run recorded them.
type staleFirstRead struct {
	capacity.TerminationStore
	reads atomic.Int64
}

func (s *staleFirstRead) GetOperation(ctx context.Context, nodeID, opID string) (*capacity.Operation, error) {
	op, err := s.TerminationStore.GetOperation(ctx, nodeID, opID)
	if err == nil && s.reads.Add(1) == 1 {
		op.Outcomes = map[string]capacity.VMOutcome{}
	}
	return op, err
}

// A run cut off after its terminations, before its Report step, is finished by the next
// delivery of the step and its Report, or by the reconciler, without a second terminate call.
func TestRoundCutOffIsFinishedWithoutASecondTerminate(t *testing.T) {
	tests := []struct {
		name   string
		finish func(t *testing.T, env capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation)
	}{
		{"the next delivery of the step", func(t *testing.T, store capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation) {
			if _, err := term.Run(context.Background(), capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:exec:2", MaxRounds: 5}); err != nil {
				t.Fatal(err)
			}
			reportStep(t, store, op, 1)
		}},
		{"a delivery that read the operation before the cut-off run's outcomes, after its claims lapsed", func(t *testing.T, store capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation) {
			late := *term
			late.Store = &staleFirstRead{TerminationStore: store}
			late.ClaimFor = time.Minute
			late.Now = func() time.Time { return time.Now().Add(10 * time.Minute) } // every claim of the cut-off run has lapsed
			if _, err := late.Run(context.Background(), capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:exec:2", MaxRounds: 5}); err != nil {
				t.Fatal(err)
			}
			reportStep(t, store, op, 1)
		}},
		{"the reconciler", func(t *testing.T, store capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation) {
			r := &capacity.Reconciler{Store: store, Workflow: &capacitytest.Workflow{}, StartAfter: time.Nanosecond, StuckAfter: time.Hour, Logger: quiet,
				Now: func() time.Time { return time.Now().Add(capacity.DefaultReportAfter) }} // the Report step never came
			report, err := r.Run(context.Background())
			if err != nil || len(report.Ended) != 1 {
				t.Fatalf("reconciler: %+v, %v; want the operation ended", report, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, op := eightVictims(t, nil)
			agent := &capacitytest.Agent{}
			cut := &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}
			task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:exec:1", MaxRounds: 5}
			if _, err := cut.Run(context.Background(), task); err != nil { // then cut off: no Report step
				t.Fatalf("cut-off run: %v", err)
			}
			tt.finish(t, env.Store, &capacity.Terminator{Store: env.Store, Agent: agent, Logger: quiet}, op)

			got, err := env.Clean().GetOperation(context.Background(), "n1", op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != capacity.OpCompleted || len(got.Outcomes) != len(op.VMIDs) {
				t.Fatalf("operation %s with %d outcomes, want completed with %d", got.State, len(got.Outcomes), len(op.VMIDs))
			}
			for _, vm := range op.VMIDs {
				if n := agent.Calls(vm); n != 1 {
					t.Errorf("agent asked to terminate %s %d times, want once", vm, n)
				}
				if o := got.Outcomes[vm].Outcome; o != capacity.OutcomeTerminated {
					t.Errorf("%s ended %q, want terminated", vm, o)
				}
			}
		})
	}
}

// claimReports opens the gate once both runs have asked for the report's claim.
type claimReports struct {
	capacity.ReportClaims
	gate   *gate
	claims atomic.Int64
}

func (s *claimReports) ClaimReport(ctx context.Context, op capacity.Operation, holder string, now, until time.Time) error {
	err := s.ReportClaims.ClaimReport(ctx, op, holder, now, until)
	s.gate.count(&s.claims, 2)
	return err
}

// heldPublisher publishes only once the gate is open (or both runs are publishing).
type heldPublisher struct {
	*capacitytest.Publisher
	gate    *gate
	entered *atomic.Int64
}

func (p heldPublisher) Publish(ctx context.Context, events []capacity.Event) error {
	p.gate.count(p.entered, 2)
	<-p.gate.open
	return p.Publisher.Publish(ctx, events)
}

// endWrites counts the end writes that landed.
type endWrites struct {
	capacity.TerminationStore
	landed atomic.Int64
}

func (s *endWrites) EndOperation(ctx context.Context, op capacity.Operation, state capacity.OperationState, now time.Time) error {
	err := s.TerminationStore.EndOperation(ctx, op, state, now)
	if err == nil {
		s.landed.Add(1)
	}
	return err
}

// The Report step of an operation whose VMs are all final, delivered twice at once: one
// publish of the report (each VM's outcome and the end), one end write, the operation
// completed, and its end reported once to the metrics; a later duplicate (long after the claim
// lapsed) reads it ended and publishes nothing.
func TestDuplicateReportsPublishAndEndOnce(t *testing.T) {
	env, op := eightVictims(t, nil)
	ctx := context.Background()
	term := &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Logger: quiet}
	rounds(t, term, op, 5)

	g := newGate()
	claims := &claimReports{ReportClaims: env.Store, gate: g}
	pub := &capacitytest.Publisher{}
	store := &endWrites{TerminationStore: env.Store}
	ended := &endCounter{}
	a := &capacity.Announcer{Store: store, Publisher: heldPublisher{Publisher: pub, gate: g, entered: new(atomic.Int64)},
		Claims: claims, Metrics: ended, Logger: quiet}
	var wg sync.WaitGroup
	published := make([]int, 2)
	for i := range 2 {
		wg.Go(func() {
			n, err := a.Report(ctx, "n1", op.ID, 1)
			if err != nil {
				t.Error(err)
			}
			published[i] = n
		})
	}
	wg.Wait()
	if want := len(op.VMIDs) + 1; pub.Calls() != 1 || len(pub.Published()) != want || published[0]+published[1] != want {
		t.Fatalf("%d publish calls, %d events (runs say %v); want 1 call of %d", pub.Calls(), len(pub.Published()), published, want)
	}
	if store.landed.Load() != 1 || ended.ended.Load() != 1 {
		t.Fatalf("%d end writes, %d ends reported; want 1 each", store.landed.Load(), ended.ended.Load())
	}
	got, err := env.Clean().GetOperation(ctx, "n1", op.ID)
	if err != nil || got.State != capacity.OpCompleted {
		t.Fatalf("operation %v, %v; want completed", got, err)
	}
	again := &capacitytest.Publisher{}
	b := &capacity.Announcer{Store: store, Publisher: again, Claims: env.Store, Logger: quiet,
		Now: func() time.Time { return time.Now().Add(time.Hour) }} // long after the claim lapsed: ended is reported
	if n, err := b.Report(ctx, "n1", op.ID, 1); err != nil || n != 0 || again.Calls() != 0 || store.landed.Load() != 1 {
		t.Fatalf("a later duplicate published %d events (%d calls), %v, %d end writes; want nothing", n, again.Calls(), err, store.landed.Load())
	}
}

// A Report cut off after its publish, before its end write (the write refused: the only
// UpdateItem of the report): the task fails, the operation stays terminating with every VM
// final, and the task's retry, or the reconciler 2 minutes later, publishes the same event ids
// and ends it. An end write whose answer was lost (it landed; the SDK's retry meets the
// condition it already changed) is the task's success.
func TestReportCutOffBeforeItsEndIsEndedByTheRetry(t *testing.T) {
	for _, tt := range []struct {
		name       string
		fault      awsfault.Fault
		failsFirst bool
		reconciler bool // the reconciler finishes it, not the task's retry
	}{
		{"end refused, the retry", awsfault.AccessDenied, true, false},
		{"end refused, the reconciler", awsfault.AccessDenied, true, true},
		{"end landed, its answer lost", awsfault.AmbiguousTimeout, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: "UpdateItem", Fault: tt.fault, Rate: 1, Max: 1})
			env, op := eightVictims(t, inj)
			ctx := context.Background()
			clean := env.Clean()
			rounds(t, &capacity.Terminator{Store: clean, Agent: &capacitytest.Agent{}, Logger: quiet}, op, 5)
			pub := &capacitytest.Publisher{}
			a := &capacity.Announcer{Store: env.Store, Publisher: pub, Claims: env.Store, Logger: quiet}
			_, err := a.Report(ctx, "n1", op.ID, 1)
			first := eventIDs(pub.Published())
			if len(first) != len(op.VMIDs)+1 {
				t.Fatalf("first report published %v; want every VM's outcome and the end", first)
			}
			if !tt.failsFirst {
				if got, gerr := clean.GetOperation(ctx, "n1", op.ID); err != nil || gerr != nil || got.State != capacity.OpCompleted {
					t.Fatalf("end write whose answer was lost: %v, then %v, %v; want success, completed", err, got, gerr)
				}
				return
			}
			if err == nil {
				t.Fatal("report whose end write failed succeeded; want the task to fail")
			}
			got, err := clean.GetOperation(ctx, "n1", op.ID)
			if err != nil || got.State != capacity.OpTerminating || !got.Ended() {
				t.Fatalf("after the cut-off report: %v, %v; want terminating with every VM final", got, err)
			}
			if tt.reconciler {
				r := &capacity.Reconciler{Store: env.Store, Workflow: &capacitytest.Workflow{}, Publisher: pub, Claims: env.Store,
					StartAfter: time.Nanosecond, StuckAfter: time.Hour, Logger: quiet,
					Now: func() time.Time { return time.Now().Add(capacity.DefaultReportAfter) }}
				if report, err := r.Run(ctx); err != nil || !slices.Equal(report.Ended, []string{op.ID}) {
					t.Fatalf("reconciler: %+v, %v; want it ended", report, err)
				}
			} else if n, err := a.Report(ctx, "n1", op.ID, 1); err != nil || n != len(first) {
				t.Fatalf("retry: %d events, %v; want %d", n, err, len(first))
			}
			if again := eventIDs(pub.Published()[len(first):]); !slices.Equal(again, first) {
				t.Errorf("then published %v, want the same ids %v", again, first)
			}
			if got, err := clean.GetOperation(ctx, "n1", op.ID); err != nil || got.State != capacity.OpCompleted {
				t.Fatalf("after: %v, %v; want completed", got, err)
			}
		})
	}
}

func eventIDs(events []capacity.Event) []string {
	ids := make([]string, 0, len(events))
	for _, e := range events {
		ids = append(ids, e.ID)
	}
	return ids
}

// A report whose publish failed releases its claim and writes no end, so the task's retry
// publishes it and ends the operation.
func TestFailedReportIsPublishedOnRetry(t *testing.T) {
	env, op := eightVictims(t, nil)
	ctx := context.Background()
	rounds(t, &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Logger: quiet}, op, 5)
	pub := &capacitytest.Publisher{FailFirst: 1}
	a := &capacity.Announcer{Store: env.Store, Publisher: pub, Claims: env.Store, Logger: quiet}
	if _, err := a.Report(ctx, "n1", op.ID, 1); !errors.Is(err, capacitytest.ErrPublish) {
		t.Fatalf("first try: %v, want the publisher's error", err)
	}
	if got, err := env.Clean().GetOperation(ctx, "n1", op.ID); err != nil || got.State != capacity.OpTerminating {
		t.Fatalf("after a failed publish: %v, %v; want still terminating", got, err)
	}
	if n, err := a.Report(ctx, "n1", op.ID, 1); err != nil || n != len(op.VMIDs)+1 || len(pub.Published()) != n {
		t.Fatalf("retry published %d (%d events), %v; want %d", n, len(pub.Published()), err, len(op.VMIDs)+1)
	}
}
