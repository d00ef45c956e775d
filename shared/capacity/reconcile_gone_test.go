package capacity_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// A terminating operation whose execution closed, or no longer exists at all (Step Functions
// forgets closed executions after 90 days; a local stack restarted), is restarted as its next
// attempt by the reconciler, not only reported as stuck: nothing else would ever end it and
// free its VMs' units. One whose execution still runs is reported as stuck.
func TestReconcilerRestartsATerminatingOperationWithoutAnExecution(t *testing.T) {
	tests := []struct {
		status  capacity.ExecutionStatus // of the operation's execution when the reconciler looks
		restart bool
	}{
		{capacity.ExecNotFound, true},
		{capacity.ExecFailed, true},
		{capacity.ExecTimedOut, true},
		{capacity.ExecAborted, true},
		{capacity.ExecRunning, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.status), func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			wf, res := reclaimUnderWorkflow(t, svc)
			id := res.ReclaimID
			op, err := env.Store.GetOperation(ctx, "n1", id)
			if err != nil {
				t.Fatal(err)
			}
			if err := env.Store.BeginTermination(ctx, *op, "arn:exec:"+id, t0.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			if tt.status == capacity.ExecNotFound {
				wf.SetStatus(id, "") // forgotten
			} else {
				wf.SetStatus(id, tt.status)
			}
			rec := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: time.Minute, StuckAfter: time.Hour, Logger: quiet,
				Now: func() time.Time { return t0.Add(3 * time.Hour) }}
			report, err := rec.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got, err := env.Store.GetOperation(ctx, "n1", id)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.restart {
				if len(report.Stuck) != 1 || report.Stuck[0].ID != id || len(report.Restarted) != 0 || got.State != capacity.OpTerminating {
					t.Fatalf("report %+v, operation %s: want it reported stuck, left terminating", report, got.State)
				}
				return
			}
			if !slices.Equal(report.Restarted, []string{id}) || len(report.Stuck) != 0 {
				t.Fatalf("report %+v: want %s restarted, not reported stuck", report, id)
			}
			if got.State != capacity.OpPendingStart || got.CurrentAttempt() != 2 || got.Restarts != 1 {
				t.Errorf("operation %s attempt %d restarts %d, want pending-start at attempt 2 after 1 restart", got.State, got.CurrentAttempt(), got.Restarts)
			}
			if names := wf.Started(); !slices.Equal(names, []string{id, id + "-2"}) {
				t.Errorf("started %v, want %s then %s-2", names, id, id)
			}
		})
	}
}
