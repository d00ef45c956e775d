package capacity_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
// VM's agent is called once, each VM gets one outcome item, the operation ends once, and the
// run that found a VM claimed neither calls nor fails it.
func TestDuplicateRoundsAtOnceTerminateEachVMOnce(t *testing.T) {
	env, op := eightVictims(t, nil)
	g := newGate()
	twice := 2 * int64(len(op.VMIDs))
	store := &claimCounter{TerminationStore: env.Store, gate: g, want: twice}
	agent := &capacitytest.Agent{}
	ended := &endCounter{}
	term := &capacity.Terminator{Store: store, Agent: heldAgent{Agent: agent, gate: g, entered: new(atomic.Int64), all: twice},
		Concurrency: 8, Logger: quiet, Metrics: ended}

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
	if got.State != capacity.OpCompleted || ended.ended.Load() != 1 {
		t.Errorf("operation %s, ended %d times; want completed once", got.State, ended.ended.Load())
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

// failEnd makes the run die after its outcomes are written, before it ends the operation: a
// run cut off at its time limit (Express stops the execution; the invocation it was in
// finishes its writes, then nothing follows).
type failEnd struct{ capacity.TerminationStore }

var errCutOff = errors.New("run cut off")

func (s failEnd) EndOperation(context.Context, capacity.Operation, capacity.OperationState, time.Time) error {
	return errCutOff
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

// A run cut off after its terminations is finished by the next delivery, or by the
// reconciler, without a second terminate call.
func TestRoundCutOffIsFinishedWithoutASecondTerminate(t *testing.T) {
	tests := []struct {
		name   string
		finish func(t *testing.T, env capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation)
	}{
		{"the next delivery of the step", func(t *testing.T, store capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation) {
			if _, err := term.Run(context.Background(), capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:exec:2", MaxRounds: 5}); err != nil {
				t.Fatal(err)
			}
		}},
		{"a delivery that read the operation before the cut-off run's outcomes, after its claims lapsed", func(t *testing.T, store capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation) {
			late := *term
			late.Store = &staleFirstRead{TerminationStore: store}
			late.ClaimFor = time.Minute
			late.Now = func() time.Time { return time.Now().Add(10 * time.Minute) } // every claim of the cut-off run has lapsed
			if _, err := late.Run(context.Background(), capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:exec:2", MaxRounds: 5}); err != nil {
				t.Fatal(err)
			}
		}},
		{"the reconciler", func(t *testing.T, store capacity.TerminationStore, term *capacity.Terminator, op *capacity.Operation) {
			r := &capacity.Reconciler{Store: store, Workflow: &capacitytest.Workflow{}, StartAfter: time.Nanosecond, StuckAfter: time.Hour, Logger: quiet}
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
			cut := &capacity.Terminator{Store: failEnd{env.Store}, Agent: agent, Logger: quiet}
			task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:exec:1", MaxRounds: 5}
			if _, err := cut.Run(context.Background(), task); !errors.Is(err, errCutOff) {
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

// The report of an ended operation delivered twice at once goes out once; one whose publish
// failed goes out on the retry; a later duplicate publishes nothing.
func TestDuplicateReportsPublishOnce(t *testing.T) {
	env, op := eightVictims(t, nil)
	ctx := context.Background()
	term := &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Logger: quiet}
	runWorkflow(t, term, op, 5)

	t.Run("at once", func(t *testing.T) {
		g := newGate()
		claims := &claimReports{ReportClaims: env.Store, gate: g}
		pub := &capacitytest.Publisher{}
		a := &capacity.Announcer{Store: env.Store, Publisher: heldPublisher{Publisher: pub, gate: g, entered: new(atomic.Int64)}, Claims: claims, Logger: quiet}
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
		// Each VM's outcome and the operation's end, once.
		if want := len(op.VMIDs) + 1; pub.Calls() != 1 || len(pub.Published()) != want || published[0]+published[1] != want {
			t.Fatalf("%d publish calls, %d events (runs say %v); want 1 call of %d", pub.Calls(), len(pub.Published()), published, want)
		}
		again := &capacitytest.Publisher{}
		b := &capacity.Announcer{Store: env.Store, Publisher: again, Claims: env.Store, Logger: quiet,
			Now: func() time.Time { return time.Now().Add(time.Hour) }} // long after the claim lapsed: done is done
		if n, err := b.Report(ctx, "n1", op.ID, 1); err != nil || n != 0 || again.Calls() != 0 {
			t.Fatalf("a later duplicate published %d events (%d calls), %v; want nothing", n, again.Calls(), err)
		}
	})
}

// A report whose publish failed releases its claim, so the task's retry publishes it.
func TestFailedReportIsPublishedOnRetry(t *testing.T) {
	env, op := eightVictims(t, nil)
	ctx := context.Background()
	runWorkflow(t, &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Logger: quiet}, op, 5)
	pub := &capacitytest.Publisher{FailFirst: 1}
	a := &capacity.Announcer{Store: env.Store, Publisher: pub, Claims: env.Store, Logger: quiet}
	if _, err := a.Report(ctx, "n1", op.ID, 1); !errors.Is(err, capacitytest.ErrPublish) {
		t.Fatalf("first try: %v, want the publisher's error", err)
	}
	if n, err := a.Report(ctx, "n1", op.ID, 1); err != nil || n != len(op.VMIDs)+1 || len(pub.Published()) != n {
		t.Fatalf("retry published %d (%d events), %v; want %d", n, len(pub.Published()), err, len(op.VMIDs)+1)
	}
}
