package stepfn_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/stepfn"
)

// The input is the first round's state: the node, the VMs still to terminate, round 0, and
// always terminateAfter, which the grace period's Wait state reads: a zero one (no grace
// recorded) waits for nothing.
func TestInputIsTheFirstRound(t *testing.T) {
	created := time.Date(2026, 12, 1, 10, 0, 0, 500, time.FixedZone("x", 3600))
	tests := []struct {
		name  string
		after time.Time
		want  string
	}{
		{"grace", created.Add(2 * time.Minute), "2026-12-01T09:02:00Z"},
		{"no grace recorded", time.Time{}, "2026-12-01T09:00:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op := capacity.Operation{ID: "rcl_1", NodeID: "n1", VMIDs: []string{"a", "b"}, CreatedAt: created, TerminateAfter: tt.after,
				Outcomes: map[string]capacity.VMOutcome{"a": {Outcome: capacity.OutcomeTerminated, Attempt: 1}}}
			b, err := json.Marshal(stepfn.InputOf(op))
			if err != nil {
				t.Fatal(err)
			}
			var in map[string]any
			if err := json.Unmarshal(b, &in); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{"reclaimId": "rcl_1", "nodeId": "n1", "attempt": float64(1), "vmIds": []any{"b"},
				"round": float64(0), "terminateAfter": tt.want}
			if !reflect.DeepEqual(in, want) {
				t.Fatalf("input %s, want %v", b, want)
			}
		})
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
