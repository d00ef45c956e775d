// Package emftest is test support for the metrics recorder: one record of every kind the
// functions write, so that a test reads what each metric is written with (its name, its
// dimensions) from the Recorder itself rather than from a copy.
package emftest

import (
	"context"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/emf"
)

// WriteEveryKind has r write one record of every kind: an applied reclaim, a dry run, a
// refusal, a rate-limited and an unchecked call, an ended operation and a reconciler run.
func WriteEveryKind(ctx context.Context, r *emf.Recorder) {
	for _, c := range []capacity.CallOutcome{
		{Action: capacity.ActionReclaim, Applied: true}, {Action: capacity.ActionReclaim, DryRun: true},
		{Action: capacity.ActionRelease, Refusal: capacity.CodeUnitsInUse},
	} {
		r.Call(ctx, c)
	}
	r.RateLimited(ctx, "key")
	r.RateUnchecked(ctx, "key")
	r.IntakeRecordRefused(ctx, "msg-1")
	now := time.Now()
	r.OperationEnded(ctx, capacity.Operation{ID: "rcl_1", CreatedAt: now}, now)
	r.Reconciled(ctx, &capacity.ReconcileReport{})
}
