package httpapi_test

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// burstLimiter admits each key's first burst calls, then refuses it for wait; it counts
// the calls it saw (the limiter's writes).
type burstLimiter struct {
	mu    sync.Mutex
	burst int
	wait  time.Duration
	seen  map[string]int
	calls int
}

func (l *burstLimiter) Admit(_ context.Context, p capacity.Principal) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.seen == nil {
		l.seen = map[string]int{}
	}
	if l.seen[p.KeyID]++; l.seen[p.KeyID] > l.burst {
		e := capacity.Errorf(capacity.CodeRateLimited, "over")
		e.RetryAfter = l.wait
		return e
	}
	return nil
}

// Begin leaves every answer to the write (Admit), as a limiter that knows nothing yet does.
func (l *burstLimiter) Begin(ctx context.Context, p capacity.Principal) (func() error, error) {
	return func() error { return l.Admit(ctx, p) }, nil
}

func (l *burstLimiter) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = nil
}

// A key over its rate limit is answered 429 rate_limited with Retry-After in whole seconds,
// on every authenticated route: a read is refused before its handler runs (the service is not
// called), a capacity call after the read run beside the limiter, which it discards (the real
// service writes nothing for it: TestRefusedCapacityCallWritesNothing). Another key's calls
// are answered as before. Unauthenticated calls and junk bearers never reach the limiter.
func TestRateLimitedKeyGets429(t *testing.T) {
	limiter := &burstLimiter{burst: 2, wait: 2500 * time.Millisecond}
	svc := &fakeService{capacity: &capacity.CapacityResult{}, res: &capacity.Reservation{ID: "r1", NodeID: "n1"}}
	h := (&httpapi.Handler{Service: svc, Logger: quiet, Limit: limiter,
		Auth: &auth.Authenticator{Keys: testKeys(), TTL: time.Minute, Now: func() time.Time { return now }}}).Mux()

	routes := []req{
		{method: http.MethodGet, path: reservationPath},
		{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"],"dryRun":true}`},
		{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
		{method: http.MethodGet, path: "/v1/keys", auth: ptr("Bearer " + secretPlatform)},
	}
	// The owner's burst of 2: two calls answered by the service.
	for i := range 2 {
		w := routes[0].do(t, h)
		if w.Code != http.StatusOK {
			t.Fatalf("call %d within the burst: %d %s", i+1, w.Code, w.Body.String())
		}
		// The limiter's time is a phase of its own in Server-Timing.
		if st := w.Header().Get("Server-Timing"); !strings.Contains(st, "limit;dur=") {
			t.Errorf("Server-Timing %q lacks the limit phase", st)
		}
	}
	called := len(svc.Calls())
	for _, rt := range routes[:3] {
		w := rt.do(t, h)
		problem(t, w, http.StatusTooManyRequests, capacity.CodeRateLimited)
		// Admitted again 2.5 s on: Retry-After is 3.
		if got := w.Header().Get("Retry-After"); got != "3" {
			t.Errorf("%s %s: Retry-After = %q, want \"3\" (2.5 s rounded up)", rt.method, rt.path, got)
		}
		if w.Header().Get("Server-Timing") != "" {
			t.Errorf("%s %s: a refusal carries Server-Timing", rt.method, rt.path)
		}
	}
	var reached []string
	for _, c := range svc.Calls()[called:] {
		reached = append(reached, c.Method)
	}
	if want := []string{"Reclaim", "Release"}; !slices.Equal(reached, want) {
		t.Errorf("refused calls reached the service as %v, want %v (the capacity calls' reads only)", reached, want)
	}
	// Another key is not limited by the owner's flood.
	if w := routes[3].do(t, h); w.Code != http.StatusOK {
		t.Errorf("another key: %d %s", w.Code, w.Body.String())
	}
	// Without a key, or with junk, the limiter is not reached: no write.
	seen := limiter.calls
	for _, a := range []string{"", "Bearer junk", "Bearer " + capacity.FixedKeySecret("nosuchkey")} {
		if w := (req{method: http.MethodGet, path: reservationPath, auth: ptr(a)}).do(t, h); w.Code != http.StatusUnauthorized {
			t.Errorf("auth %q: %d, want 401", a, w.Code)
		}
	}
	if w := (req{method: http.MethodGet, path: "/v1/openapi.json", auth: ptr("")}).do(t, h); w.Code != http.StatusOK {
		t.Errorf("openapi.json: %d", w.Code)
	}
	if limiter.calls != seen {
		t.Errorf("unauthenticated calls reached the limiter %d times, want 0", limiter.calls-seen)
	}
	// Admitted again, the owner is answered again.
	limiter.reset()
	if w := routes[0].do(t, h); w.Code != http.StatusOK {
		t.Errorf("after Retry-After: %d %s", w.Code, w.Body.String())
	}
}

// Retry-After is whole seconds, at least 1, whatever RetryAfter the refusal carries.
func TestRetryAfterHeader(t *testing.T) {
	for _, tt := range []struct {
		wait time.Duration
		want int
	}{{time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {61 * time.Second, 61}} {
		e := capacity.Errorf(capacity.CodeRateLimited, "over")
		e.RetryAfter = tt.wait
		w := (req{method: http.MethodGet, path: reservationPath}).do(t, newHandler(&fakeService{err: e}))
		problem(t, w, http.StatusTooManyRequests, capacity.CodeRateLimited)
		if got := w.Header().Get("Retry-After"); got != strconv.Itoa(tt.want) {
			t.Errorf("RetryAfter %v: Retry-After = %q, want %d", tt.wait, got, tt.want)
		}
	}
}
