package capacity_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

const sec = int64(time.Second / time.Microsecond)

// GCRA on one stored TAT: what a call at t is answered, from a given state.
func TestRateLimitAdmit(t *testing.T) {
	const t0 = int64(1_800_000_000) * sec
	tenPerSecond := capacity.RateLimit{PerSecond: 10, Burst: 3} // interval 100 ms, tolerance 200 ms
	tests := []struct {
		name  string
		limit capacity.RateLimit
		tat   int64
		ok    bool
		next  int64         // when admitted
		retry time.Duration // when refused
	}{
		{"no state: a full bucket", tenPerSecond, 0, true, t0 + sec/10, 0},
		{"a TAT in the past is a full bucket, not banked time", tenPerSecond, t0 - 5*sec, true, t0 + sec/10, 0},
		{"TAT at now", tenPerSecond, t0, true, t0 + sec/10, 0},
		{"burst-1 intervals ahead: the last call of the burst", tenPerSecond, t0 + 2*sec/10, true, t0 + 3*sec/10, 0},
		{"a microsecond past the burst", tenPerSecond, t0 + 2*sec/10 + 1, false, 0, time.Microsecond},
		{"burst spent: one interval to wait", tenPerSecond, t0 + 3*sec/10, false, 0, 100 * time.Millisecond},
		{"burst 1: no call ahead of the rate", capacity.RateLimit{PerSecond: 0.5, Burst: 1}, t0 + 2*sec, false, 0, 2 * time.Second},
		{"burst 1, TAT reached", capacity.RateLimit{PerSecond: 0.5, Burst: 1}, t0, true, t0 + 2*sec, 0},
		{"high rate: interval of 1 µs at least", capacity.RateLimit{PerSecond: capacity.MaxRatePerSecond, Burst: 1}, 0, true, t0 + 100, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, retry, ok := tt.limit.Admit(tt.tat, t0)
			if ok != tt.ok {
				t.Fatalf("admitted = %v, want %v", ok, tt.ok)
			}
			if ok && next != tt.next {
				t.Errorf("next TAT = now%+d µs, want now%+d µs", next-t0, tt.next-t0)
			}
			if !ok && (retry != tt.retry || next != tt.tat) {
				t.Errorf("refused: retry after %v (TAT now%+d), want %v and the TAT unchanged", retry, next-t0, tt.retry)
			}
		})
	}
}

// From a full bucket, Burst calls at one instant are admitted and the next is refused for
// one interval; then the rate holds.
func TestRateLimitBurstThenRate(t *testing.T) {
	lim := capacity.RateLimit{PerSecond: 4, Burst: 5} // 250 ms per call
	now := int64(1000) * sec
	var tat int64
	for i := range 5 {
		next, _, ok := lim.Admit(tat, now)
		if !ok {
			t.Fatalf("call %d of the burst refused", i+1)
		}
		tat = next
	}
	if _, retry, ok := lim.Admit(tat, now); ok || retry != 250*time.Millisecond {
		t.Fatalf("call 6 at once: admitted %v, retry %v; want refused for 250ms", ok, retry)
	}
	// Over the next 10 s at 8 calls a second, 4 a second (plus nothing: the burst is spent).
	admitted := 0
	for ms := int64(125); ms <= 10_000; ms += 125 {
		if next, _, ok := lim.Admit(tat, now+ms*1000); ok {
			tat = next
			admitted++
		}
	}
	if admitted != 40 {
		t.Errorf("admitted %d calls in 10 s at 8/s, want 40 (4/s)", admitted)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int
	}{{0, 1}, {-time.Hour, 1}, {time.Microsecond, 1}, {time.Second, 1}, {time.Second + time.Millisecond, 2}, {2 * time.Second, 2}, {90 * time.Second, 90},
		{capacity.MaxRetryAfter, 1000}, {capacity.MaxRetryAfter + time.Second, 1000}, {time.Duration(math.MaxInt64), 1000}} {
		if got := capacity.RetryAfterSeconds(tt.d); got != tt.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestRateLimitValidate(t *testing.T) {
	for _, tt := range []struct {
		l  capacity.RateLimit
		ok bool
	}{
		{capacity.RateLimit{PerSecond: 50, Burst: 100}, true},
		{capacity.RateLimit{PerSecond: 0.1, Burst: 1}, true},
		{capacity.RateLimit{PerSecond: capacity.MinRatePerSecond, Burst: 1}, true},
		{capacity.RateLimit{PerSecond: capacity.MaxRatePerSecond, Burst: capacity.MaxRateBurst}, true},
		{capacity.RateLimit{PerSecond: 0.000999, Burst: 1}, false},
		{capacity.RateLimit{PerSecond: 1e-10, Burst: 1}, false},
		{capacity.RateLimit{PerSecond: 1e-13, Burst: 1}, false},
		{capacity.RateLimit{PerSecond: 0, Burst: 1}, false},
		{capacity.RateLimit{PerSecond: -1, Burst: 1}, false},
		{capacity.RateLimit{PerSecond: math.NaN(), Burst: 1}, false},
		{capacity.RateLimit{PerSecond: math.Inf(1), Burst: 1}, false},
		{capacity.RateLimit{PerSecond: capacity.MaxRatePerSecond + 0.5, Burst: 1}, false},
		{capacity.RateLimit{PerSecond: 1, Burst: 0}, false},
		{capacity.RateLimit{PerSecond: 1, Burst: capacity.MaxRateBurst + 1}, false},
	} {
		if err := tt.l.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v: Validate() = %v, want ok %v", tt.l, err, tt.ok)
		}
	}
}

// A limit at or past its bounds, as one stored before the bounds were may be (Validate keeps
// new ones inside): a call after a burst is refused for at least 1 s and at most
// MaxRetryAfter, never admitted as if there were no limit (an interval overflowing to 1 µs)
// and never with a wait that overflows to nothing (a 429 without Retry-After).
func TestRateLimitEdges(t *testing.T) {
	const t0 = int64(1_800_000_000) * sec
	tests := []struct {
		name  string
		limit capacity.RateLimit
		retry time.Duration // the wait of the call after the burst, at the burst's instant
	}{
		{"the lowest rate", capacity.RateLimit{PerSecond: capacity.MinRatePerSecond, Burst: 1}, capacity.MaxRetryAfter},
		{"the lowest rate, the largest burst", capacity.RateLimit{PerSecond: capacity.MinRatePerSecond, Burst: capacity.MaxRateBurst}, capacity.MaxRetryAfter},
		{"1e-10/s: kept as the lowest", capacity.RateLimit{PerSecond: 1e-10, Burst: 1}, capacity.MaxRetryAfter},
		{"1e-13/s: kept as the lowest", capacity.RateLimit{PerSecond: 1e-13, Burst: 2}, capacity.MaxRetryAfter},
		{"1e-300/s: kept as the lowest", capacity.RateLimit{PerSecond: 1e-300, Burst: 1}, capacity.MaxRetryAfter},
		{"zero: kept as the lowest", capacity.RateLimit{PerSecond: 0, Burst: 1}, capacity.MaxRetryAfter},
		{"NaN: kept as the lowest", capacity.RateLimit{PerSecond: math.NaN(), Burst: 1}, capacity.MaxRetryAfter},
		{"the highest rate", capacity.RateLimit{PerSecond: capacity.MaxRatePerSecond, Burst: 1}, 100 * time.Microsecond},
		{"above the highest: kept as the highest", capacity.RateLimit{PerSecond: 1e300, Burst: 1}, 100 * time.Microsecond},
		{"a burst above the largest: kept as the largest", capacity.RateLimit{PerSecond: 1, Burst: 1 << 40}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			burst := min(max(tt.limit.Burst, 1), capacity.MaxRateBurst)
			var tat int64
			for i := range burst {
				next, _, ok := tt.limit.Admit(tat, t0)
				if !ok {
					t.Fatalf("call %d of the burst refused", i+1)
				}
				tat = next
			}
			_, retry, ok := tt.limit.Admit(tat, t0)
			if ok || retry != tt.retry {
				t.Fatalf("the call after the burst: admitted %v, retry after %v; want refused for %v", ok, retry, tt.retry)
			}
			if s := capacity.RetryAfterSeconds(retry); s < 1 || s > 1000 {
				t.Errorf("Retry-After %d s, want 1..1000", s)
			}
			// A second later, a limit of less than a call a second still refuses.
			if _, _, ok := tt.limit.Admit(tat, t0+sec); ok && tt.retry > time.Second {
				t.Errorf("admitted a second after the burst at %v calls a second", tt.limit.PerSecond)
			}
		})
	}
}

// memRates is a RateStore with DynamoDB's conditions. tellsOld: a refused write returns the
// stored TAT (DynamoDB's ALL_OLD); the local emulator does not.
type memRates struct {
	mu       sync.Mutex
	tat      map[string]int64
	tellsOld bool
	err      error
	block    bool // wait for the context instead of answering
	writes   map[string]int
}

func (m *memRates) TakeRate(ctx context.Context, keyID string, step capacity.RateStep) (capacity.RateTake, error) {
	if m.block {
		<-ctx.Done()
		return capacity.RateTake{}, ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.writes == nil {
		m.writes, m.tat = map[string]int{}, map[string]int64{}
	}
	m.writes[keyID]++
	if m.err != nil {
		return capacity.RateTake{}, m.err
	}
	tat, ok := m.tat[keyID]
	switch {
	case !step.Busy && (!ok || tat <= step.Now):
		m.tat[keyID] = step.Now + step.Interval
	case step.Busy && ok && tat > step.Now && tat <= step.Now+step.Tolerance:
		m.tat[keyID] = tat + step.Interval
	default:
		if m.tellsOld && ok {
			return capacity.RateTake{TAT: tat, Known: true}, nil
		}
		return capacity.RateTake{}, nil
	}
	return capacity.RateTake{Applied: true, TAT: m.tat[keyID], Known: true}, nil
}

type rateCounts struct {
	mu                 sync.Mutex
	limited, unchecked map[string]int
}

func (c *rateCounts) RateLimited(_ context.Context, keyID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.limited == nil {
		c.limited = map[string]int{}
	}
	c.limited[keyID]++
}

func (c *rateCounts) RateUnchecked(_ context.Context, keyID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unchecked == nil {
		c.unchecked = map[string]int{}
	}
	c.unchecked[keyID]++
}

// A key over its limit is refused with rate_limited and a RetryAfter, whether the store tells
// the stored TAT of a refused write (AWS) or not (the emulator): by the instance that admitted
// its burst without a write (it knows the TAT), and by another instance in at most two writes;
// another key's calls are admitted as before, its bucket untouched.
func TestRateLimiterAdmit(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name     string
		tellsOld bool
		own      *capacity.RateLimit
		admitted int           // calls of key A admitted at one instant
		retry    time.Duration // the refusal's RetryAfter
		// writes of another instance's refusal: with ALL_OLD it is known from the first.
		otherWrites int
	}{
		{"AWS: the refused write tells the TAT", true, nil, 3, time.Second, 1},
		{"emulator: two refused writes", false, nil, 3, time.Second, 2},
		{"the key's own lower limit", true, &capacity.RateLimit{PerSecond: 0.5, Burst: 1}, 1, 2 * time.Second, 1},
		{"the key's own lower limit, emulator", false, &capacity.RateLimit{PerSecond: 0.5, Burst: 1}, 1, 2 * time.Second, 2},
		{"a key's own higher limit is narrowed to the environment's", true, &capacity.RateLimit{PerSecond: 100, Burst: 100}, 3, time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := &memRates{tellsOld: tt.tellsOld}
			counts := &rateCounts{}
			clock := now
			limiter := func() *capacity.RateLimiter {
				return &capacity.RateLimiter{Store: store, Limit: capacity.RateLimit{PerSecond: 1, Burst: 3},
					Now: func() time.Time { return clock }, Metrics: counts}
			}
			l, other := limiter(), limiter()
			a := capacity.Principal{KeyID: "key-a", RateLimit: tt.own}
			b := capacity.Principal{KeyID: "key-b"}
			ctx := context.Background()
			for i := range tt.admitted {
				before := store.writes["key-a"]
				if err := l.Admit(ctx, a); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
				if w := store.writes["key-a"] - before; w != 1 {
					t.Errorf("admitted call %d took %d writes, want 1", i+1, w)
				}
			}
			tatA := store.tat["key-a"]
			for _, c := range []struct {
				who    string
				l      *capacity.RateLimiter
				writes int
			}{{"the same instance", l, 0}, {"another instance", other, tt.otherWrites}} {
				before := store.writes["key-a"]
				err := c.l.Admit(ctx, a)
				var e *capacity.Error
				if !errors.As(err, &e) || e.Code != capacity.CodeRateLimited {
					t.Fatalf("%s, call %d: %v, want rate_limited", c.who, tt.admitted+1, err)
				}
				if e.RetryAfter != tt.retry {
					t.Errorf("%s: RetryAfter = %v, want %v", c.who, e.RetryAfter, tt.retry)
				}
				if w := store.writes["key-a"] - before; w != c.writes {
					t.Errorf("%s: the refusal took %d writes, want %d", c.who, w, c.writes)
				}
			}
			if store.tat["key-a"] != tatA {
				t.Errorf("a refused call moved the bucket")
			}
			for i := range 3 {
				if err := l.Admit(ctx, b); err != nil {
					t.Fatalf("key B call %d while A is limited: %v", i+1, err)
				}
			}
			if counts.limited["key-b"] != 0 || counts.limited["key-a"] != 2 {
				t.Errorf("RateLimited metrics = %v, want 2 for key-a only", counts.limited)
			}
			// After RetryAfter, A is admitted again, by either instance.
			clock = clock.Add(tt.retry)
			if err := other.Admit(ctx, a); err != nil {
				t.Errorf("after %v: %v", tt.retry, err)
			}
		})
	}
}

// An instance's guess is stale (another instance moved the key's TAT past now since): the
// "full" branch is refused and the "busy" one admits the call; two writes, never a wrong
// answer.
func TestRateLimiterStaleGuess(t *testing.T) {
	for _, tellsOld := range []bool{true, false} {
		store := &memRates{tellsOld: tellsOld}
		t0 := time.Unix(1_800_000_000, 0)
		now := t0
		clock := func() time.Time { return now }
		lim := capacity.RateLimit{PerSecond: 10, Burst: 2} // 100 ms per call, one ahead
		first := &capacity.RateLimiter{Store: store, Limit: lim, Now: clock}
		second := &capacity.RateLimiter{Store: store, Limit: lim, Now: clock}
		p := capacity.Principal{KeyID: "key-a"}
		ctx := context.Background()
		if err := first.Admit(ctx, p); err != nil { // TAT t0+100ms
			t.Fatal(err)
		}
		now = t0.Add(150 * time.Millisecond)
		if err := second.Admit(ctx, p); err != nil { // TAT t0+250ms
			t.Fatal(err)
		}
		now = t0.Add(200 * time.Millisecond) // first still guesses a full bucket
		before := store.writes["key-a"]
		if err := first.Admit(ctx, p); err != nil {
			t.Fatalf("tellsOld %v: %v", tellsOld, err)
		}
		if w := store.writes["key-a"] - before; w != 2 {
			t.Errorf("tellsOld %v: %d writes, want 2 (the stale branch, then the right one)", tellsOld, w)
		}
		if got, want := store.tat["key-a"], t0.Add(350*time.Millisecond).UnixMicro(); got != want {
			t.Errorf("tellsOld %v: TAT = t0%+d µs, want t0+350ms", tellsOld, got-t0.UnixMicro())
		}
	}
}

// When the limiter's write fails or times out, the call goes on unchecked, with a warning and
// a metric: the limiter never turns its own table's trouble into refusals.
func TestRateLimiterFailsOpen(t *testing.T) {
	tests := []struct {
		name  string
		store *memRates
	}{
		{"throttled", &memRates{err: capacity.ErrThrottled}},
		{"any failure", &memRates{err: errors.New("connection reset")}},
		{"timeout", &memRates{block: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			counts := &rateCounts{}
			l := &capacity.RateLimiter{Store: tt.store, Limit: capacity.RateLimit{PerSecond: 1, Burst: 1},
				Timeout: 20 * time.Millisecond, Metrics: counts, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
			start := time.Now()
			for range 3 { // over the limit, were it checked
				if err := l.Admit(context.Background(), capacity.Principal{KeyID: "key-a"}); err != nil {
					t.Fatalf("Admit = %v, want the call let through", err)
				}
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("three unchecked calls took %v: the limiter's timeout does not bound them", took)
			}
			if counts.unchecked["key-a"] != 3 {
				t.Errorf("RateUnchecked = %d, want 3", counts.unchecked["key-a"])
			}
			if n := strings.Count(logs.String(), `"level":"WARN","msg":"rate limit not checked`); n != 3 {
				t.Errorf("%d warnings logged, want 3:\n%s", n, logs.String())
			}
		})
	}
}
