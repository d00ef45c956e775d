package capacity_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// observingPublisher is a capacitytest.Publisher that also notes the operation's stored state at each
// publish, to show the report goes out before the end is written.
type observingPublisher struct {
	capacitytest.Publisher
	read   func() capacity.OperationState
	states []capacity.OperationState
}

func (p *observingPublisher) Publish(ctx context.Context, events []capacity.Event) error {
	p.states = append(p.states, p.read())
	return p.Publisher.Publish(ctx, events)
}

// The reconciler publishes the report of an operation it ends before writing the end (once
// written, nothing would report it); a failed publish leaves the operation for the next run.
func TestReconcilerReportsBeforeEnding(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(map[bool]string{false: "published", true: "publish fails"}[fail], func(t *testing.T) {
			env, op := outcomesAllRecorded(t)
			ctx := context.Background()
			state := func() capacity.OperationState {
				got, err := env.Store.GetOperation(ctx, "n1", op.ID)
				if err != nil {
					t.Fatal(err)
				}
				return got.State
			}
			pub := &observingPublisher{read: state}
			if fail {
				pub.Err = errors.New("PutEvents: FailedEntryCount 1")
			}
			wf := &capacitytest.Workflow{}
			_ = wf.Start(ctx, *op)
			rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, Logger: quiet,
				Publisher: pub, Now: func() time.Time { return t0.Add(time.Hour + 2*time.Minute) }}
			report, err := rec.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pub.states, []capacity.OperationState{capacity.OpTerminating}) {
				t.Fatalf("published with the operation %v, want once, still terminating", pub.states)
			}
			if fail {
				if len(report.Ended) != 0 || !slices.Equal(report.PublishFailed, []string{op.ID}) || state() != capacity.OpTerminating {
					t.Fatalf("report %+v, operation %s: want it left terminating for the next run", report, state())
				}
				pub.Err = nil // the next run publishes and ends it
				if report, err = rec.Run(ctx); err != nil || !slices.Equal(report.Ended, []string{op.ID}) {
					t.Fatalf("next run: %+v, %v", report, err)
				}
			} else if !slices.Equal(report.Ended, []string{op.ID}) {
				t.Fatalf("report %+v", report)
			}
			if state() != capacity.OpCompleted {
				t.Fatalf("operation %s, want completed", state())
			}
			want := []string{"Spot VM Terminated " + op.ID + "/vm/s1/1", "Spot VM Terminated " + op.ID + "/vm/s2/1", "Reclaim Operation Completed " + op.ID + "/end/1"}
			if got := ids(pub.Published()); !slices.Equal(got, want) {
				t.Errorf("published %v, want %v", got, want)
			}
			end := pub.Published()[2].Detail.(capacity.OperationEndDetail)
			if end.OwnerOrgID != "owner" || end.VMs[0].OrgID != "buyer" || end.EndedAt != "2026-11-01T01:02:00Z" {
				t.Errorf("end detail %+v", end)
			}
		})
	}
}

// An operation whose restarts are spent is failed with a reason: its Failed event goes out
// first, with the reason.
func TestReconcilerReportsAFailureBeforeWritingIt(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	wf, res := reclaimUnderWorkflow(t, svc)
	clock := t0.Add(time.Hour)
	pub := &capacitytest.Publisher{Err: errors.New("throttled")}
	rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, MaxRestarts: 1,
		Logger: quiet, Publisher: pub, Now: func() time.Time { return clock }}
	wf.Close(res.ReclaimID)
	clock = clock.Add(2 * time.Minute)
	if report, err := rec.Run(ctx); err != nil || !slices.Equal(report.Restarted, []string{res.ReclaimID}) || pub.Calls() != 0 {
		t.Fatalf("restart: %+v, %v, %d publishes (a restart reports nothing)", report, err, pub.Calls())
	}
	wf.Close(res.ReclaimID + "-2")
	clock = clock.Add(2 * time.Minute)
	report, err := rec.Run(ctx)
	if err != nil || len(report.Exhausted) != 0 || !slices.Equal(report.PublishFailed, []string{res.ReclaimID}) {
		t.Fatalf("report %+v, %v: want the failure held back", report, err)
	}
	if op, _ := env.Store.GetOperation(ctx, "n1", res.ReclaimID); op.State == capacity.OpFailed {
		t.Fatal("failed without its report")
	}
	pub.Err = nil
	if report, err = rec.Run(ctx); err != nil || len(report.Exhausted) != 1 {
		t.Fatalf("report %+v, %v", report, err)
	}
	if got := ids(pub.Published()); !slices.Equal(got, []string{"Reclaim Operation Failed " + res.ReclaimID + "/end/2"}) {
		t.Fatalf("published %v", got)
	}
	if d := pub.Published()[0].Detail.(capacity.OperationEndDetail); d.Reason == "" || d.Counts.Pending != 1 {
		t.Errorf("failed detail %+v, want the reason and the VM pending", d)
	}
}

// The audit record says how the call came (HTTP unless told otherwise) and which event
// carried it.
func TestAuditSaysHowTheCallCame(t *testing.T) {
	tests := []struct {
		name             string
		meta             capacity.RequestMeta
		wantVia, wantEvt string
	}{
		{"http by default", capacity.RequestMeta{RequestID: "q1"}, "http", ""},
		{"event", capacity.RequestMeta{RequestID: "q2", Via: capacity.ViaEvent, EventID: "ev-1"}, "event", "ev-1"},
		{"schedule", capacity.RequestMeta{RequestID: "q3", Via: capacity.ViaSchedule, EventID: "ev-2"}, "schedule", "ev-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			if _, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), tt.meta); err != nil {
				t.Fatal(err)
			}
			items := env.Items(t, env.Store.AuditTable)
			if len(items) != 1 {
				t.Fatalf("%d audit items", len(items))
			}
			var rec struct {
				Via     string `dynamodbav:"via"`
				EventID string `dynamodbav:"eventId"`
			}
			if err := attributevalue.UnmarshalMap(items[0], &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Via != tt.wantVia || rec.EventID != tt.wantEvt {
				t.Errorf("audit via %q eventId %q, want %q %q", rec.Via, rec.EventID, tt.wantVia, tt.wantEvt)
			}
		})
	}
}
