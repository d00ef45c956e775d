package httpapi_test

import (
	"context"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// limiterFunc is a Limiter whose write is one function.
type limiterFunc func(ctx context.Context, p capacity.Principal) error

func (f limiterFunc) Begin(ctx context.Context, p capacity.Principal) (func() error, error) {
	return func() error { return f(ctx, p) }, nil
}

// knownOver is a Limiter that knows, without a write, that every key is over its limit.
type knownOver struct{ refusal error }

func (k knownOver) Begin(context.Context, capacity.Principal) (func() error, error) {
	return nil, k.refusal
}

// hookedStore is memStore counting its node reads, with a hook run at the start of each.
type hookedStore struct {
	*memStore
	reads  atomic.Int32
	onRead func()
}

func (s *hookedStore) LoadNode(ctx context.Context, nodeID, scope string) (*capacity.NodeState, error) {
	s.reads.Add(1)
	if s.onRead != nil {
		s.onRead()
	}
	return s.memStore.LoadNode(ctx, nodeID, scope)
}

// countingWorkflow counts the termination workflows started.
type countingWorkflow struct{ starts atomic.Int32 }

func (w *countingWorkflow) Start(context.Context, capacity.Operation) error {
	w.starts.Add(1)
	return nil
}

// limitedRealHandler serves the real service of newRealService behind limit, over a
// hookedStore, with a counting workflow.
func limitedRealHandler(limit httpapi.Limiter) (http.Handler, *hookedStore, *countingWorkflow) {
	svc, mem := newRealService()
	store := &hookedStore{memStore: mem}
	wf := &countingWorkflow{}
	svc.Store, svc.Workflow = store, wf
	h := &httpapi.Handler{Service: svc, Limit: limit, Logger: quiet,
		Auth: &auth.Authenticator{Keys: testKeys(), TTL: time.Minute, Now: func() time.Time { return now }}}
	return h.Mux(), store, wf
}

// A capacity call the limiter refuses is answered 429 with Retry-After and writes nothing to
// the node, though its read ran beside the limiter: no node, reservation or VM change, no
// audit record, no Idempotency-Key record, no workflow. The same call admitted writes (so the
// refused one had something to write).
func TestRefusedCapacityCallWritesNothing(t *testing.T) {
	refusal := capacity.Errorf(capacity.CodeRateLimited, "over")
	refusal.RetryAfter = 1500 * time.Millisecond
	idem := map[string]string{"Idempotency-Key": "k-1"}
	tests := []struct {
		name   string
		q      req
		status int // admitted
	}{
		{"reclaim evicting two spot VMs", req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u2","u3"]}`, header: idem}, http.StatusOK},
		{"reclaim dry run", req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u2"],"dryRun":true}`}, http.StatusOK},
		{"release", req{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`, header: idem}, http.StatusOK},
		{"placement", req{method: http.MethodPost, path: vmsPath, auth: ptr("Bearer " + secretOperator),
			body: `{"vmId":"vm-new","orgId":"x","tier":"spot","unitIds":["u4"]}`, header: idem}, http.StatusCreated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, store, wf := limitedRealHandler(limiterFunc(func(context.Context, capacity.Principal) error { return refusal }))
			before := clone(store.nodes)
			w := tt.q.do(t, h)
			problem(t, w, http.StatusTooManyRequests, capacity.CodeRateLimited)
			if got := w.Header().Get("Retry-After"); got != "2" {
				t.Errorf("Retry-After = %q, want \"2\" (1.5 s rounded up)", got)
			}
			if store.reads.Load() == 0 {
				t.Errorf("the node was not read: the read no longer runs beside the limiter")
			}
			if !reflect.DeepEqual(store.nodes, before) || len(store.audits) != 0 || len(store.idem) != 0 || wf.starts.Load() != 0 {
				t.Errorf("a refused call wrote: node changed %v, audit records %d, idempotency records %d, workflows %d",
					!reflect.DeepEqual(store.nodes, before), len(store.audits), len(store.idem), wf.starts.Load())
			}

			h, store, _ = limitedRealHandler(limiterFunc(func(context.Context, capacity.Principal) error { return nil }))
			if w := tt.q.do(t, h); w.Code != tt.status || len(store.audits) == 0 {
				t.Errorf("admitted: %d with %d audit records, want %d and a write: %s", w.Code, len(store.audits), tt.status, w.Body.String())
			}
		})
	}
}

// A capacity call the limiter refuses without a write (its instance has seen the key over its
// limit: a flood) is refused before the read starts: a flood of one key reads no node.
func TestKnownOverLimitReadsNothing(t *testing.T) {
	refusal := capacity.Errorf(capacity.CodeRateLimited, "over")
	refusal.RetryAfter = time.Second
	h, store, _ := limitedRealHandler(knownOver{refusal})
	for _, q := range []req{
		{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u2","u3"]}`},
		{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
	} {
		w := q.do(t, h)
		problem(t, w, http.StatusTooManyRequests, capacity.CodeRateLimited)
		if got := w.Header().Get("Retry-After"); got != "1" {
			t.Errorf("%s: Retry-After = %q, want \"1\"", q.path, got)
		}
	}
	if n := store.reads.Load(); n != 0 {
		t.Errorf("the node was read %d times for calls known to be over the limit, want 0", n)
	}
}

// The limiter and the capacity call's read run at once: each waits, before it answers, for
// the other to have started, which one after the other could not do. The wait is bounded
// only so that a serial run fails rather than hangs; no duration is asserted.
func TestLimiterRunsBesideTheRead(t *testing.T) {
	limiterStarted, readStarted := make(chan struct{}), make(chan struct{})
	awaitOther := func(other <-chan struct{}) bool {
		select {
		case <-other:
			return true
		case <-time.After(10 * time.Second):
			return false
		}
	}
	var limiterSawRead, readSawLimiter bool
	h, store, wf := limitedRealHandler(limiterFunc(func(context.Context, capacity.Principal) error {
		close(limiterStarted)
		limiterSawRead = awaitOther(readStarted)
		return nil
	}))
	var once sync.Once
	store.onRead = func() {
		once.Do(func() {
			close(readStarted)
			readSawLimiter = awaitOther(limiterStarted)
		})
	}
	w := req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u2","u3"]}`}.do(t, h)
	if w.Code != http.StatusOK || wf.starts.Load() != 1 {
		t.Fatalf("reclaim: %d, %d workflows started: %s", w.Code, wf.starts.Load(), w.Body.String())
	}
	if !limiterSawRead || !readSawLimiter {
		t.Errorf("the limiter saw the read start: %v; the read saw the limiter start: %v; want both (run at once)", limiterSawRead, readSawLimiter)
	}
}
