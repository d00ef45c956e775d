package capacity_test

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// TestServiceRecordsCallStats: a reclaim through the service reports its rounds and the time
// of each phase it went through in the context's CallStats.
func TestServiceRecordsCallStats(t *testing.T) {
	tests := []struct {
		name       string
		rules      []awsfault.Rule
		dryRun     bool
		wantRounds int
		wantPhases []string
		noPhases   []string
	}{
		{"one round", nil, false, 1, []string{capacity.PhaseRead, capacity.PhaseDecide, capacity.PhaseCommit, capacity.PhaseStart}, nil},
		// The first commit's answer is lost: a second round reads and finds it landed.
		{"a commit of unknown outcome takes a second round", []awsfault.Rule{ambiguous}, false, 2,
			[]string{capacity.PhaseRead, capacity.PhaseDecide, capacity.PhaseCommit, capacity.PhaseStart}, nil},
		// The audit record is a dry run's only write; no workflow starts.
		{"dry run", nil, true, 1, []string{capacity.PhaseRead, capacity.PhaseDecide, capacity.PhaseCommit}, []string{capacity.PhaseStart}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, svc, _ := faultyWorld(t, 1, tt.rules...)
			svc.Workflow = &capacitytest.Workflow{}
			ctx, stats := capacity.WithCallStats(context.Background())
			req := reclaim("u1", "u2")
			req.DryRun = tt.dryRun
			res, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
			if err != nil {
				t.Fatalf("reclaim: %v", err)
			}
			if len(res.Terminated) != 1 {
				t.Fatalf("terminated %v, want [s1]", res.Terminated)
			}
			got := stats.Snapshot()
			if got.Rounds != tt.wantRounds {
				t.Errorf("rounds = %d, want %d", got.Rounds, tt.wantRounds)
			}
			for _, ph := range tt.wantPhases {
				if got.Phases[ph] <= 0 {
					t.Errorf("phase %s = %v, want > 0 (phases %v)", ph, got.Phases[ph], got.Phases)
				}
			}
			for _, ph := range tt.noPhases {
				if d, ok := got.Phases[ph]; ok {
					t.Errorf("phase %s = %v, want none", ph, d)
				}
			}
		})
	}
}

// Outside a request there are no stats to fill, and the service must not need them.
func TestServiceWithoutCallStats(t *testing.T) {
	_, svc := world(t)
	if _, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
}
