package stepfn_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/stepfn"
)

// The input is the first step's state: the node, the VMs still to terminate, round 0, and
// when the first round may run: terminateAfter in whole seconds and the grace left at start,
// both rounded up (a fraction of a second of grace is a whole second more, never one less:
// no VM is terminated before its grace ends), and dueAt exactly. A zero terminateAfter (no
// grace recorded) waits for nothing.
func TestInputIsTheFirstStep(t *testing.T) {
	created := time.Date(2026, 12, 1, 10, 0, 0, 500, time.FixedZone("x", 3600))
	tests := []struct {
		name               string
		after, now         time.Time
		wantAfter, wantDue string
		wantDelay          float64
	}{
		{"grace, at commit", created.Add(2 * time.Minute), created,
			"2026-12-01T09:02:01Z", "2026-12-01T09:02:00.0000005Z", 120},
		{"grace of whole seconds", created.Add(2*time.Minute - 500), created.Add(30*time.Second - 500),
			"2026-12-01T09:02:00Z", "2026-12-01T09:02:00Z", 90},
		{"grace left 0.3 s", created.Add(2 * time.Minute), created.Add(2*time.Minute - 300*time.Millisecond),
			"2026-12-01T09:02:01Z", "2026-12-01T09:02:00.0000005Z", 1},
		{"grace over: a reconciler's late start", created.Add(2 * time.Minute), created.Add(5 * time.Minute),
			"2026-12-01T09:02:01Z", "2026-12-01T09:02:00.0000005Z", 0},
		{"no grace recorded", time.Time{}, created, "2026-12-01T09:00:01Z", "2026-12-01T09:00:00.0000005Z", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op := capacity.Operation{ID: "rcl_1", NodeID: "n1", VMIDs: []string{"a", "b"}, CreatedAt: created, TerminateAfter: tt.after,
				Outcomes: map[string]capacity.VMOutcome{"a": {Outcome: capacity.OutcomeTerminated, Attempt: 1}}}
			b, err := json.Marshal(stepfn.InputOf(op, tt.now))
			if err != nil {
				t.Fatal(err)
			}
			var in map[string]any
			if err := json.Unmarshal(b, &in); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{"step": "first", "reclaimId": "rcl_1", "nodeId": "n1", "attempt": float64(1), "vmIds": []any{"b"},
				"round": float64(0), "terminateAfter": tt.wantAfter, "dueAt": tt.wantDue, "delaySeconds": tt.wantDelay}
			if !reflect.DeepEqual(in, want) {
				t.Fatalf("input %s, want %v", b, want)
			}
		})
	}
}

func TestDelaySeconds(t *testing.T) {
	for _, tt := range []struct {
		left time.Duration
		want int
	}{
		{-time.Second, 0}, {0, 0}, {time.Nanosecond, 1}, {time.Second, 1}, {time.Second + 1, 2},
		{120 * time.Second, 120}, {900 * time.Second, 900}, {time.Hour, 900},
	} {
		if got := stepfn.DelaySeconds(tt.left); got != tt.want {
			t.Errorf("DelaySeconds(%v) = %d, want %d", tt.left, got, tt.want)
		}
	}
}

// A round that leaves VMs to retry says when the next may run (its message's dueAt): its end
// plus the retry wait its task carried; a last round says nothing of a next.
func TestRoundResultSaysWhenTheNextRoundIsDue(t *testing.T) {
	end := time.Date(2026, 12, 1, 9, 0, 0, 250, time.UTC)
	in := stepfn.Task{ReclaimID: "rcl_1", NodeID: "n1", VMIDs: []string{"a"}, Attempt: 1, Round: 0, MaxRounds: 5, RetryWaitSeconds: 10}
	next := capacity.TerminationTask{ReclaimID: "rcl_1", NodeID: "n1", VMIDs: []string{"a"}, Attempt: 1, Round: 1, MaxRounds: 5}
	out := stepfn.RoundResult(in, &capacity.TerminationReport{Next: next}, end)
	if out.DueAt != "2026-12-01T09:00:10.00000025Z" || out.RetryWaitSeconds != 10 || out.Round != 1 {
		t.Errorf("retry: dueAt %q wait %d round %d, want 10 s after the round's end, round 1", out.DueAt, out.RetryWaitSeconds, out.Round)
	}
	if out := stepfn.RoundResult(in, &capacity.TerminationReport{Next: next, Done: true}, end); out.DueAt != "" {
		t.Errorf("done: dueAt %q, want none", out.DueAt)
	}
}

func TestEventsTaskJSON(t *testing.T) {
	var task stepfn.EventsTask
	if err := json.Unmarshal([]byte(`{"phase":"notice","reclaimId":"rcl_1","nodeId":"n1","attempt":2}`), &task); err != nil {
		t.Fatal(err)
	}
	if task != (stepfn.EventsTask{Phase: stepfn.PhaseNotice, ReclaimID: "rcl_1", NodeID: "n1", Attempt: 2}) {
		t.Fatalf("decoded %+v", task)
	}
}
