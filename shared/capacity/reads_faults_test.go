package capacity_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
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

// A read that DynamoDB never answers (connection refused, or no answer in time, after the
// SDK's retries) answers `unavailable` (503, retry later): it changed nothing.
func TestUnansweredReadsAnswerUnavailable(t *testing.T) {
	for _, fault := range []awsfault.Fault{awsfault.ConnectionRefused, awsfault.AmbiguousTimeout} {
		t.Run(string(fault), func(t *testing.T) {
			_, svc, inj := faultyWorld(t, 5, awsfault.Rule{Operation: "Query", Fault: fault, Rate: 1})
			if _, err := svc.GetReservation(context.Background(), owner, "n1", "r1"); capacity.ErrorCode(err) != capacity.CodeUnavailable {
				t.Fatalf("got %v (code %s), want unavailable", err, capacity.ErrorCode(err))
			}
			if inj.Count(fault) < 2 {
				t.Fatalf("%d faults injected, want the SDK's retries", inj.Count(fault))
			}
		})
	}
}

// A reclaim whose write landed but whose answer was lost, and whose every read after it then
// gets no answer (the database went away), answers internal with the outcome unknown: never
// unavailable or throttled, which would tell the caller that nothing was applied.
func TestUnansweredChecksAfterALostWriteAreNotUnavailable(t *testing.T) {
	lost := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1, Max: 1})
	refused := awsfault.New(1, awsfault.Rule{Fault: awsfault.ConnectionRefused, Rate: 1})
	// Every call made after the lost answer meets the outage (a call's stack is built when it starts).
	outage := func(stack *middleware.Stack) error {
		if lost.Count(awsfault.AmbiguousTimeout) == 0 {
			return nil
		}
		return refused.APIOption(stack)
	}
	env := dynamotest.New(t, dynamotest.WithAPIOptions(lost.APIOption, outage))
	if err := env.Clean().Put(context.Background(), worldSeed()); err != nil {
		t.Fatal(err)
	}
	svc := &capacity.Service{Store: env.Store, Now: func() time.Time { return t0.Add(time.Hour) }, Logger: quiet}
	_, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{})
	if code := capacity.ErrorCode(err); code != capacity.CodeInternal || strings.Contains(capacity.ErrorMessage(err), "nothing") {
		t.Errorf("got %v (code %s, message %q), want internal, not a claim that nothing was applied", err, code, capacity.ErrorMessage(err))
	}
	if refused.Count(awsfault.ConnectionRefused) == 0 {
		t.Fatal("no read after the write was refused")
	}
	if n := auditsOf(t, env, capacity.ActionReclaim); n != 1 {
		t.Errorf("%d reclaim records, want 1: the write landed", n)
	}
}
