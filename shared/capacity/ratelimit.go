package capacity

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// RateLimit is how fast one API key may call: PerSecond on average, and up to Burst calls at
// once after a quiet moment (a bucket of Burst tokens refilled at PerSecond).
type RateLimit struct {
	PerSecond float64 `dynamodbav:"perSecond"` // as key and audit items store it
	Burst     int     `dynamodbav:"burst"`
}

// Bounds of a rate limit, wherever it is set (cdk.json, a key's own). The lowest rate keeps
// one call's interval (1000 s) and any wait well inside int64 microseconds and
// time.Duration: a rate near 0 would overflow them, into no limit or a negative wait.
const (
	MinRatePerSecond = 0.001
	MaxRatePerSecond = 10000
	MaxRateBurst     = 100000
	// MaxRetryAfter is the longest wait a refusal names: one interval at MinRatePerSecond.
	MaxRetryAfter = 1000 * time.Second
)

// Validate refuses a limit that could not be kept: a rate outside [MinRatePerSecond,
// MaxRatePerSecond], a burst outside 1..MaxRateBurst.
func (l RateLimit) Validate() error {
	if !(l.PerSecond >= MinRatePerSecond && l.PerSecond <= MaxRatePerSecond) { // NaN fails both
		return fmt.Errorf("perSecond %v: want a number from %g to %d", l.PerSecond, MinRatePerSecond, MaxRatePerSecond)
	}
	if l.Burst < 1 || l.Burst > MaxRateBurst {
		return fmt.Errorf("burst %d: want a whole number from 1 to %d", l.Burst, MaxRateBurst)
	}
	return nil
}

// Narrow returns the lower of l and o in each of rate and burst (l when o is nil): a key's own
// limit can only narrow its environment's.
func (l RateLimit) Narrow(o *RateLimit) RateLimit {
	if o == nil {
		return l
	}
	return RateLimit{PerSecond: min(l.PerSecond, o.PerSecond), Burst: min(l.Burst, o.Burst)}
}

// Within reports whether l allows no more than o in either rate or burst.
func (l RateLimit) Within(o RateLimit) bool { return l.PerSecond <= o.PerSecond && l.Burst <= o.Burst }

// The limiter is GCRA (the generic cell rate algorithm): a key's whole state is one
// "theoretical arrival time" (TAT), when its bucket would be full again, in microseconds since
// the epoch. A call at now is admitted when TAT - now <= tolerance, and moves TAT to
// max(TAT, now) + interval; otherwise it is refused until TAT - tolerance.

// interval is the time one call uses up (the emission interval), in microseconds, from 1 to
// 1e9. The rate is clamped to its bounds first, so that a limit that escaped Validate (an
// item written before the bounds, NaN) is kept as the nearest valid one, never overflowing
// into a 1 µs interval: no limit at all.
func (l RateLimit) interval() int64 {
	r := l.PerSecond
	if !(r >= MinRatePerSecond) { // NaN too: the slowest, failing closed
		r = MinRatePerSecond
	}
	return max(1, int64(math.Round(1e6/min(r, MaxRatePerSecond))))
}

// tolerance is how far TAT may run ahead of now: Burst-1 intervals, so that Burst calls at
// once are admitted from a full bucket (Burst clamped to its bounds: at most 1e14 µs).
func (l RateLimit) tolerance() int64 {
	return int64(min(max(l.Burst, 1), MaxRateBurst)-1) * l.interval()
}

// Admit is GCRA on a stored TAT (0: none) at now: whether a call is admitted, the TAT it
// leaves, and otherwise how long until one would be.
func (l RateLimit) Admit(tat, now int64) (next int64, retryAfter time.Duration, ok bool) {
	t := max(tat, now)
	if t-now > l.tolerance() {
		// At most one interval, unless the stored TAT came from a slower limit than l.
		wait := min(t-l.tolerance()-now, MaxRetryAfter.Microseconds())
		return tat, time.Duration(wait) * time.Microsecond, false
	}
	return t + l.interval(), 0, true
}

// RetryAfterSeconds is d as HTTP's Retry-After says it: whole seconds, rounded up, from 1
// (RFC 9110 10.2.3: a non-negative integer; 0 would invite an immediate, refused retry) to
// MaxRetryAfter's.
func RetryAfterSeconds(d time.Duration) int {
	return min(max(1, int(math.Ceil(d.Seconds()))), int(MaxRetryAfter/time.Second))
}

// RateStore keeps each key's TAT, in an item of its own that no node decision reads and no
// commit conditions on. Implementation: shared/dynamo.Store.
type RateStore interface {
	// TakeRate spends one call of the key's bucket with one conditional write, on the branch
	// step names (see RateStep). Applied: it was spent, and TAT is the stored TAT after it.
	// Not applied: the branch's condition did not hold, and TAT is the stored TAT if the store
	// learned it from the refusal (Known), which DynamoDB tells (ReturnValuesOnConditionCheck
	// Failure ALL_OLD) and the local emulator does not. An error: nothing is known.
	TakeRate(ctx context.Context, keyID string, step RateStep) (RateTake, error)
}

// RateStep is one conditional write of a key's TAT at Now (microseconds):
//   - Busy false (the bucket is full): applies when no TAT is stored or it is <= Now, and sets
//     it to Now + Interval;
//   - Busy true: applies when the stored TAT is in (Now, Now + Tolerance], and adds Interval
//     to it. Adding, not setting, lets concurrent calls of one key all land.
//
// Expires is when the item may go (after its TAT, when it is as good as absent).
type RateStep struct {
	Now, Interval, Tolerance int64
	Busy                     bool
	Expires                  time.Time
}

// RateTake is what a TakeRate did.
type RateTake struct {
	Applied bool
	TAT     int64
	Known   bool
}

// RateMetrics counts the limiter's decisions (shared/emf). Implementations must not block.
type RateMetrics interface {
	// RateLimited: a call refused with 429.
	RateLimited(ctx context.Context, keyID string)
	// RateUnchecked: a call let through unchecked because the limiter's write failed.
	RateUnchecked(ctx context.Context, keyID string)
}

// DefaultRateTimeout bounds the limiter's writes for one call.
const DefaultRateTimeout = 500 * time.Millisecond

// RateLimiter limits each API key's calls to Limit (narrowed by the key's own limit), before
// they reach any node: at most two conditional writes to the key's own item per call, usually
// one, and none for a call this instance already knows to be over the limit.
//
// When its write fails (throttled, timed out, refused), the call goes on unchecked, with a
// warning and a RateUnchecked metric: the limiter protects other keys' latency, and the
// node's own protections (conditional writes, the retry budget, the stage's throttle) hold
// without it, while refusing every call whenever the limiter's table is unwell would turn its
// hiccup into an outage.
type RateLimiter struct {
	Store   RateStore
	Limit   RateLimit
	Now     func() time.Time
	Timeout time.Duration // default DefaultRateTimeout
	Logger  *slog.Logger
	Metrics RateMetrics

	mu sync.Mutex
	// seen is the TAT this instance last learned per key: a lower bound of the stored one,
	// and a guess of which branch to try first (a key calling often is busy), so a stale one
	// costs a second write, never a wrong answer.
	seen map[string]int64
}

// maxRateSeen bounds seen; past it the map starts again (a guess lost costs a write).
const maxRateSeen = 10000

// Admit spends one call of p's key, or refuses it with an *Error CodeRateLimited whose
// RetryAfter says when a call would be admitted.
func (l *RateLimiter) Admit(ctx context.Context, p Principal) error {
	take, err := l.Begin(ctx, p)
	if err != nil || take == nil {
		return err
	}
	return take()
}

// Begin is Admit in two parts. At once, without a write, it refuses a call this instance
// already knows to be over its key's limit (and admits a call with no key to limit: take
// nil). Otherwise take is the limiter's write, which answers the rest, and which the caller
// may run beside its own read (see Admission): a flood of one key then reads no node, as
// its calls are refused before anything is started.
func (l *RateLimiter) Begin(ctx context.Context, p Principal) (take func() error, err error) {
	if l == nil || l.Store == nil || p.KeyID == "" {
		return nil, nil
	}
	lim := l.Limit.Narrow(p.RateLimit)
	now := l.now().UnixMicro()
	step := RateStep{Now: now, Interval: lim.interval(), Tolerance: lim.tolerance()}
	// Past now + tolerance + interval no TAT can be, and a TAT in the past is a full bucket.
	step.Expires = time.UnixMicro(now + step.Tolerance + step.Interval).Add(time.Hour)
	seen := l.guess(p.KeyID)
	// The stored TAT is at least what this instance last learned (it only grows): past the
	// tolerance, the store would refuse too, so the call is refused without a write, and a
	// flood of one key costs its table nothing.
	if _, wait, ok := lim.Admit(seen, now); !ok {
		return nil, l.refuse(ctx, p.KeyID, wait)
	}
	step.Busy = seen > now
	return func() error { return l.take(ctx, p.KeyID, lim, step) }, nil
}

// take spends one call of the key's bucket with the limiter's writes, from the branch step
// guesses.
func (l *RateLimiter) take(ctx context.Context, keyID string, lim RateLimit, step RateStep) error {
	now := step.Now
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = DefaultRateTimeout
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for range 2 {
		take, err := l.Store.TakeRate(wctx, keyID, step)
		if err != nil {
			l.logger().WarnContext(ctx, "rate limit not checked: the limiter's write failed; the call goes on", "key_id", keyID, "err", err)
			if l.Metrics != nil {
				l.Metrics.RateUnchecked(ctx, keyID)
			}
			return nil
		}
		if take.Applied {
			l.remember(keyID, take.TAT)
			return nil
		}
		if !take.Known {
			// The other branch: a refused "full" write means TAT > now, a refused "busy" one
			// that it is not in (now, now+tolerance] (or, on AWS, that no item exists).
			step.Busy = !step.Busy
			continue
		}
		l.remember(keyID, take.TAT)
		if _, wait, ok := lim.Admit(take.TAT, now); !ok {
			return l.refuse(ctx, keyID, wait)
		}
		step.Busy = take.TAT > now
	}
	// Two writes, neither applied. A refused "full" write then a refused "busy" one: TAT was
	// past now, then past now + tolerance (it only grows), so the key is over its limit. The
	// other order, or a known TAT that moved in between: the key's own calls raced for its
	// bucket, which only a key calling at its limit does. Either way no TAT runs past
	// now + tolerance + interval, so a call is admitted again within one interval.
	return l.refuse(ctx, keyID, time.Duration(step.Interval)*time.Microsecond)
}

func (l *RateLimiter) refuse(ctx context.Context, keyID string, wait time.Duration) error {
	if l.Metrics != nil {
		l.Metrics.RateLimited(ctx, keyID)
	}
	e := Errorf(CodeRateLimited, "this API key is over its rate limit; retry after %d s", RetryAfterSeconds(wait))
	e.RetryAfter = wait
	return e
}

func (l *RateLimiter) guess(keyID string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen[keyID]
}

func (l *RateLimiter) remember(keyID string, tat int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil || len(l.seen) >= maxRateSeen {
		l.seen = make(map[string]int64)
	}
	l.seen[keyID] = tat
}

func (l *RateLimiter) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func (l *RateLimiter) logger() *slog.Logger {
	if l.Logger != nil {
		return l.Logger
	}
	return slog.Default()
}
