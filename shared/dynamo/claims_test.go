package dynamo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// A VM's terminate claim: one holder at a time until it lapses; the holder may take it again
// (its own retry); a release by anyone but the holder changes nothing; the agent's answer
// marked by its holder is read by every later holder, and only the holder may mark it.
func TestTerminateClaims(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	op := capacity.Operation{ID: "rcl_1", NodeID: "n1"}
	type step struct {
		do           string // claim, release, answer (mark the agent's answer: terminated)
		holder       string
		at           time.Duration // since t0; a claim lasts a minute
		wantConflict bool
		wantTookOver bool
		wantAnswered capacity.Outcome
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first claim", []step{{do: "claim", holder: "a"}}},
		{"another holder while it is live", []step{{do: "claim", holder: "a"}, {do: "claim", holder: "b", at: 59 * time.Second, wantConflict: true}}},
		{"the holder again (its retry)", []step{{do: "claim", holder: "a"}, {do: "claim", holder: "a", at: 30 * time.Second}}},
		{"another holder once it lapsed", []step{{do: "claim", holder: "a"}, {do: "claim", holder: "b", at: 61 * time.Second, wantTookOver: true},
			{do: "claim", holder: "a", at: 62 * time.Second, wantConflict: true}}},
		{"released by its holder: free", []step{{do: "claim", holder: "a"}, {do: "release", holder: "a"}, {do: "claim", holder: "b", at: time.Second}}},
		{"the answer marked by the holder is read by the next holders", []step{{do: "claim", holder: "a"}, {do: "answer", holder: "a"},
			{do: "claim", holder: "a", at: time.Second, wantAnswered: capacity.OutcomeTerminated},
			{do: "claim", holder: "b", at: 62 * time.Second, wantTookOver: true, wantAnswered: capacity.OutcomeTerminated},
			{do: "claim", holder: "c", at: 123 * time.Second, wantTookOver: true, wantAnswered: capacity.OutcomeTerminated}}},
		{"an answer marked by another than the holder: refused", []step{{do: "claim", holder: "a"}, {do: "answer", holder: "b", wantConflict: true},
			{do: "claim", holder: "b", at: 61 * time.Second, wantTookOver: true}}},
		{"released by another: still held", []step{{do: "claim", holder: "a"}, {do: "release", holder: "b"}, {do: "claim", holder: "b", at: time.Second, wantConflict: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := dynamotest.New(t)
			ctx := context.Background()
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				switch s.do {
				case "claim":
					claim, err := env.Store.ClaimTermination(ctx, op, "vm-1", s.holder, now, now.Add(time.Minute))
					if errors.Is(err, capacity.ErrConflict) != s.wantConflict || (err != nil && !s.wantConflict) || claim.TookOver != s.wantTookOver || claim.Answered != s.wantAnswered {
						t.Fatalf("step %d (%s by %s): %+v, err %v; want conflict %v, took over %v, answered %q", i, s.do, s.holder, claim, err, s.wantConflict, s.wantTookOver, s.wantAnswered)
					}
				case "answer":
					err := env.Store.MarkClaimAnswered(ctx, op, "vm-1", s.holder, capacity.OutcomeTerminated)
					if errors.Is(err, capacity.ErrConflict) != s.wantConflict || (err != nil && !s.wantConflict) {
						t.Fatalf("step %d: answer by %s: %v; want conflict %v", i, s.holder, err, s.wantConflict)
					}
				case "release":
					if err := env.Store.ReleaseTermination(ctx, op, "vm-1", s.holder); err != nil {
						t.Fatalf("step %d: release by %s: %v", i, s.holder, err)
					}
				}
			}
		})
	}
}

// A claim whose answer was lost is retried by the SDK and meets itself: taken, not a conflict.
func TestTerminateClaimWhoseAnswerWasLost(t *testing.T) {
	inj := awsfault.New(1, awsfault.Rule{Operation: "UpdateItem", Fault: awsfault.AmbiguousTimeout, Rate: 1, Max: 1})
	env := dynamotest.New(t, dynamotest.Faults(inj)...)
	now := time.Now().UTC()
	op := capacity.Operation{ID: "rcl_1", NodeID: "n1"}
	if claim, err := env.Store.ClaimTermination(context.Background(), op, "vm-1", "a", now, now.Add(time.Minute)); err != nil || claim.TookOver {
		t.Fatalf("claim %+v, err %v; want the claim", claim, err)
	}
	if inj.Counts()[awsfault.AmbiguousTimeout] != 1 {
		t.Fatalf("faults %v: the answer was not lost, the test proves nothing", inj.Counts())
	}
}

// An attempt's report claim: one reporter; a lapsed claim not done may be taken again (its
// holder died before publishing); a done one never; released, free at once.
func TestReportClaims(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ctx := context.Background()
	env := dynamotest.New(t)
	op := capacity.Operation{ID: "rcl_1", NodeID: "n1", Attempt: 1}
	claim := func(holder string, at time.Duration) error {
		now := t0.Add(at)
		return env.Store.ClaimReport(ctx, op, holder, now, now.Add(time.Minute))
	}
	if err := claim("a", 0); err != nil {
		t.Fatal(err)
	}
	if err := claim("b", time.Second); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("second reporter while live: %v, want a conflict", err)
	}
	if err := claim("b", 2*time.Minute); err != nil {
		t.Fatalf("after a's claim lapsed, not done: %v", err)
	}
	if err := env.Store.ReleaseReport(ctx, op, "b"); err != nil {
		t.Fatal(err)
	}
	if err := claim("c", 2*time.Minute); err != nil {
		t.Fatalf("after b released it: %v", err)
	}
	if err := claim("d", 2*time.Minute+time.Second); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("while c's claim is live: %v, want a conflict", err)
	}
	op.Attempt = 2 // a re-drive's attempt reports for itself
	if err := claim("d", time.Hour); err != nil {
		t.Fatalf("the next attempt's report: %v", err)
	}
}

// The operation read says whether its current attempt's report claim was taken (the report
// of an operation ended with one was published by the run that ended it): taken and kept,
// yes, released (its publish failed), no; and not for an attempt after the claimed one (a
// re-drive's).
func TestOperationReadSaysWhetherItsAttemptsReportWasClaimed(t *testing.T) {
	ctx := context.Background()
	env := dynamotest.New(t)
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	op := capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpCompleted, VMIDs: []string{"vm"}, Attempt: 1, CreatedAt: now}
	if err := env.Store.PutOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	claimed := func() bool {
		t.Helper()
		got, err := env.Store.GetOperation(ctx, "n1", "rcl_1")
		if err != nil {
			t.Fatal(err)
		}
		return got.ReportClaimed
	}
	if claimed() {
		t.Fatal("claimed before any claim")
	}
	if err := env.Store.ClaimReport(ctx, op, "a", now, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.ReleaseReport(ctx, op, "a"); err != nil {
		t.Fatal(err)
	}
	if claimed() {
		t.Fatal("claimed after its claim was released")
	}
	if err := env.Store.ClaimReport(ctx, op, "b", now, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if !claimed() {
		t.Fatal("not claimed after its claim was taken")
	}
	op.Attempt = 2
	if err := env.Store.PutOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	if claimed() {
		t.Fatal("attempt 2 claimed by attempt 1's claim")
	}
}
