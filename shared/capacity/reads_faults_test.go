package capacity_test

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
)

// A read the database keeps throttling (after the SDK's retries) answers `throttled` (503,
// retry later), as a throttled write does, not an internal error (500).
func TestThrottledReadsAnswerThrottled(t *testing.T) {
	_, svc, inj := faultyWorld(t, 5, awsfault.Rule{Operation: "Query", Fault: awsfault.Throttling, Rate: 1})
	ctx := context.Background()
	tests := []struct {
		name string
		read func() error
	}{
		{"get reservation", func() error { _, err := svc.GetReservation(ctx, owner, "n1", "r1"); return err }},
		{"get operation", func() error { _, err := svc.GetOperation(ctx, owner, "n1", "r1", "rcl_x"); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := inj.Count(awsfault.Throttling)
			if err := tc.read(); capacity.ErrorCode(err) != capacity.CodeThrottled {
				t.Fatalf("got %v (code %s), want throttled", err, capacity.ErrorCode(err))
			}
			if inj.Count(awsfault.Throttling) == before {
				t.Fatal("nothing injected")
			}
		})
	}
}
