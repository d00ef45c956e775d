package capacity_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// recordedMetrics is a capacity.Metrics that keeps what it is told.
type recordedMetrics struct {
	mu    sync.Mutex
	calls []capacity.CallOutcome
	ended []time.Duration // endedAt - op.CreatedAt, per OperationEnded
}

func (m *recordedMetrics) Call(_ context.Context, c capacity.CallOutcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, c)
}

func (m *recordedMetrics) OperationEnded(_ context.Context, op capacity.Operation, endedAt time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended = append(m.ended, endedAt.Sub(op.CreatedAt))
}

// loadFails is a store whose node reads fail with err.
type loadFails struct {
	capacity.Store
	err error
}

func (s loadFails) LoadNode(context.Context, string, string) (*capacity.NodeState, error) {
	return nil, s.err
}

func TestServiceRecordsEachCallOnce(t *testing.T) {
	ctx := context.Background()
	meta := capacity.RequestMeta{RequestID: "req-1"}
	place := capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}
	keyed := reclaim("u1")
	keyed.IdempotencyKey = "k1"
	dry := reclaim("u1")
	dry.DryRun = true
	tests := []struct {
		name string
		run  func(svc *capacity.Service) // its last call is the one checked
		want capacity.CallOutcome
	}{
		{"reclaim counts its victims", func(svc *capacity.Service) { svc.Reclaim(ctx, owner, reclaim("u1", "u2"), meta) },
			capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1", Applied: true, Victims: 1}},
		{"dry run counts a dry run", func(svc *capacity.Service) { svc.Reclaim(ctx, owner, dry, meta) },
			capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1", DryRun: true}},
		{"replay counts nothing new", func(svc *capacity.Service) {
			svc.Reclaim(ctx, owner, keyed, meta)
			svc.Reclaim(ctx, owner, keyed, meta)
		}, capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1", Replayed: true}},
		{"refusal counts its code", func(svc *capacity.Service) { svc.Reclaim(ctx, audi, reclaim("u1"), meta) },
			capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1", Refusal: capacity.CodeForbidden}},
		{"invalid request is a refusal", func(svc *capacity.Service) { svc.Release(ctx, owner, reclaim("u9"), meta) },
			capacity.CallOutcome{Action: capacity.ActionRelease, RequestID: "req-1", Refusal: capacity.CodeUnitsNotReserved}},
		{"not found is a refusal", func(svc *capacity.Service) {
			svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: "n9", ReservationID: "r1", UnitIDs: []string{"u1"}}, meta)
		}, capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1", Refusal: capacity.CodeNotFound}},
		{"internal is not a refusal", func(svc *capacity.Service) {
			svc.Store = loadFails{svc.Store, errors.New("boom")}
			svc.Reclaim(ctx, owner, reclaim("u1"), meta)
		}, capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1"}},
		{"throttled is not a refusal", func(svc *capacity.Service) {
			svc.Store = loadFails{svc.Store, fmt.Errorf("load: %w", capacity.ErrThrottled)}
			svc.Reclaim(ctx, owner, reclaim("u1"), meta)
		}, capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1"}},
		{"release refused: units in use", func(svc *capacity.Service) { svc.Release(ctx, owner, reclaim("u0"), meta) },
			capacity.CallOutcome{Action: capacity.ActionRelease, RequestID: "req-1", Refusal: capacity.CodeUnitsInUse}},
		{"placement", func(svc *capacity.Service) { svc.Place(ctx, sched, place, meta) },
			capacity.CallOutcome{Action: capacity.ActionPlace, RequestID: "req-1", Applied: true}},
		{"placement refused", func(svc *capacity.Service) {
			svc.Place(ctx, sched, place, meta)
			svc.Place(ctx, sched, place, meta)
		}, capacity.CallOutcome{Action: capacity.ActionPlace, RequestID: "req-1", Refusal: capacity.CodeVMExists}},
		{"retry of a running operation is refused", func(svc *capacity.Service) {
			res, _ := svc.Reclaim(ctx, owner, reclaim("u1"), meta)
			svc.Redrive(ctx, owner, "n1", "r1", res.ReclaimID, meta)
		}, capacity.CallOutcome{Action: capacity.ActionRetry, RequestID: "req-1", Refusal: capacity.CodeOperationRunning}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, svc := world(t)
			m := &recordedMetrics{}
			svc.Metrics = m
			tt.run(svc)
			if len(m.calls) == 0 {
				t.Fatal("nothing recorded")
			}
			if got := m.calls[len(m.calls)-1]; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("recorded %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestApplyingARetryIsRecorded(t *testing.T) {
	_, svc, op, _ := failedOp(t)
	m := &recordedMetrics{}
	svc.Metrics = m
	if _, err := svc.Redrive(context.Background(), owner, "n1", "r1", op.ID, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	want := []capacity.CallOutcome{{Action: capacity.ActionRetry, Applied: true}}
	if !reflect.DeepEqual(m.calls, want) {
		t.Errorf("recorded %+v, want %+v", m.calls, want)
	}
}

// Every writer that may end an operation tries at once (two rounds of its workflow and the
// reconciler): the one whose end write succeeds reports its duration, once.
func TestEndingAnOperationReportsItsDurationOnce(t *testing.T) {
	for _, tt := range []struct {
		name       string
		reports    int  // concurrent Report steps
		reconciler bool // and a reconciler run
	}{
		{"a report", 1, false},
		{"two racing reports", 2, false},
		{"two reports and the reconciler", 2, true},
		{"the reconciler", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env, _, op := evicted(t)
			ctx := context.Background()
			at := op.CreatedAt.Add(time.Minute)
			if err := env.Store.BeginTermination(ctx, *op, "arn:x", at); err != nil {
				t.Fatal(err)
			}
			for _, vm := range op.VMIDs { // every outcome in, the end write still to come
				if err := env.Store.MarkTerminated(ctx, *op, vm, at); err != nil {
					t.Fatal(err)
				}
				if err := env.Store.RecordOutcome(ctx, *op, vm, capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: at, Attempt: 1}); err != nil {
					t.Fatal(err)
				}
			}
			m := &recordedMetrics{}
			endAt := func() time.Time { return op.CreatedAt.Add(90 * time.Second) }
			report := &capacity.Announcer{Store: env.Store, Claims: env.Store, Logger: quiet, Metrics: m, Now: endAt}
			wf := &capacitytest.Workflow{}
			_ = wf.Start(ctx, *op)
			rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 0, StuckAfter: time.Hour, ReportAfter: 10 * time.Second,
				Claims: env.Store, Logger: quiet, Metrics: m, Now: endAt}
			var wg sync.WaitGroup
			for range tt.reports {
				wg.Go(func() {
					if _, err := report.Report(ctx, "n1", op.ID, 1); err != nil {
						t.Error(err)
					}
				})
			}
			if tt.reconciler {
				wg.Go(func() {
					if _, err := rec.Run(ctx); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if want := []time.Duration{90 * time.Second}; !reflect.DeepEqual(m.ended, want) {
				t.Errorf("reported %v, want %v", m.ended, want)
			}
		})
	}
}

func TestTheReportStepReportsTheEndOnce(t *testing.T) {
	env, _, op := evicted(t)
	m := &recordedMetrics{}
	endAt := func() time.Time { return op.CreatedAt.Add(2 * time.Second) }
	term := &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{FailFirst: map[string]int{"s1": 1}}, Logger: quiet, Now: endAt}
	report := &capacity.Announcer{Store: env.Store, Claims: env.Store, Logger: quiet, Metrics: m, Now: endAt}
	for range 2 { // a re-run of the finished workflow ends nothing
		rounds(t, term, op, 5)
		if _, err := report.Report(context.Background(), "n1", op.ID, 1); err != nil {
			t.Fatal(err)
		}
	}
	if want := []time.Duration{2 * time.Second}; !reflect.DeepEqual(m.ended, want) {
		t.Errorf("reported %v, want %v", m.ended, want)
	}
}
