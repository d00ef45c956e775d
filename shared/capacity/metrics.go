package capacity

import (
	"context"
	"time"
)

// Metrics receives what the service, the Announcer and the Reconciler did, for an adapter to
// publish (shared/emf: CloudWatch metrics). The domain decides what happened, so the counts
// mean the same wherever they are published; the adapter only names and writes them. A nil
// Metrics records nothing (tests, the benchmark floor). Implementations are called
// concurrently and must not fail or block the call.
type Metrics interface {
	// Call is called once per capacity call (reclaim, release, place, retry), at its end.
	Call(ctx context.Context, c CallOutcome)
	// OperationEnded is called once per reclaim operation ended with every VM's outcome
	// recorded, by the writer whose end write succeeded (the Report step's Announcer, run by
	// the workflow or the Reconciler), with the time it ended: op.CreatedAt to endedAt is how long the
	// terminations of a committed reclaim took.
	OperationEnded(ctx context.Context, op Operation, endedAt time.Time)
}

// CallOutcome is what one capacity call came to.
type CallOutcome struct {
	Action    string // ActionReclaim, ActionRelease, ActionPlace or ActionRetry
	RequestID string
	// Applied: the call changed state (a commit of this call landed, or a re-drive started a
	// new attempt); not a dry run, a replay, a refusal or a failure.
	Applied bool
	DryRun  bool // a dry run answered
	// Replayed: the answer stored under the Idempotency-Key was returned; nothing new happened.
	Replayed bool
	// Victims is the number of VMs an applied reclaim evicted.
	Victims int
	// Refusal is the application code the call was refused with, "" when it was not refused.
	// Internal and throttled are failures, not refusals: they are never set here.
	Refusal Code
}

// refusalCode is the code of a refusal, or "" when err is none or a failure.
func refusalCode(err error) Code {
	if err == nil {
		return ""
	}
	switch code := ErrorCode(err); code {
	case CodeInternal, CodeThrottled:
		return ""
	default:
		return code
	}
}

func (s *Service) recordCall(ctx context.Context, c CallOutcome, err error) {
	// A call the rate limiter refused is the limiter's to count (RateMetrics.RateLimited): it
	// reached the service only for the read run beside the limiter (see Admission).
	if s.Metrics == nil || ErrorCode(err) == CodeRateLimited {
		return
	}
	c.Refusal = refusalCode(err)
	if err != nil {
		c.Applied, c.DryRun, c.Replayed, c.Victims = false, false, false, 0
	}
	s.Metrics.Call(ctx, c)
}

// recordCapacity records a reclaim or release.
func (s *Service) recordCapacity(ctx context.Context, action string, meta RequestMeta, res *CapacityResult, err error) {
	c := CallOutcome{Action: action, RequestID: meta.RequestID}
	if res != nil {
		c.DryRun, c.Replayed = res.DryRun, res.Replayed
		c.Applied = !res.DryRun && !res.Replayed
		if c.Applied && action == ActionReclaim {
			c.Victims = len(res.Terminated)
		}
	}
	s.recordCall(ctx, c, err)
}
