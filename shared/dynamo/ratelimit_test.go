package dynamo_test

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// allOld makes the emulator answer a refused UpdateItem as DynamoDB does when asked for
// ReturnValuesOnConditionCheckFailure ALL_OLD: with the item as it was (the emulator returns
// nothing). The item is read right after the refusal, on the test's own, unraced client.
func allOld(plain **dynamodb.Client) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("allOld",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				var ccf *types.ConditionalCheckFailedException
				upd, ok := in.Parameters.(*dynamodb.UpdateItemInput)
				if ok && errors.As(err, &ccf) && upd.ReturnValuesOnConditionCheckFailure == types.ReturnValuesOnConditionCheckFailureAllOld {
					got, gerr := (*plain).GetItem(ctx, &dynamodb.GetItemInput{TableName: upd.TableName, Key: upd.Key, ConsistentRead: aws.Bool(true)})
					if gerr != nil {
						return out, md, gerr
					}
					ccf.Item = got.Item
				}
				return out, md, err
			}), middleware.After)
	}
}

// TakeRate's two conditional branches on the emulator, as the emulator answers a refusal
// (nothing) and as DynamoDB does (the stored item, ALL_OLD).
func TestTakeRate(t *testing.T) {
	const iv, tol = int64(100_000), int64(200_000) // 100 ms per call, 2 calls ahead
	now := time.Unix(1_800_000_000, 0).UnixMicro()
	later := now + 10*iv
	type want struct {
		applied, known bool
		tat            int64
	}
	steps := []struct {
		name string
		key  string
		busy bool
		now  int64
		want want
	}{
		{"full branch, no item: applied", "key-a", false, now, want{true, true, now + iv}},
		{"full branch again at once: refused", "key-a", false, now, want{false, true, now + iv}},
		{"busy branch within the tolerance: adds one interval", "key-a", true, now, want{true, true, now + 2*iv}},
		{"busy branch at the tolerance", "key-a", true, now, want{true, true, now + 3*iv}},
		{"busy branch past the tolerance: refused", "key-a", true, now, want{false, true, now + 3*iv}},
		{"busy branch once the TAT has passed: refused", "key-a", true, later, want{false, true, now + 3*iv}},
		{"full branch once the TAT has passed: from now", "key-a", false, later, want{true, true, later + iv}},
		{"busy branch, no item: refused, nothing known", "key-b", true, now, want{false, false, 0}},
	}
	for _, aws := range []bool{false, true} {
		name := "emulator"
		if aws {
			name = "ALL_OLD"
		}
		t.Run(name, func(t *testing.T) {
			var plain *dynamodb.Client
			var opts []dynamotest.Option
			if aws {
				opts = append(opts, dynamotest.WithAPIOptions(allOld(&plain)))
			}
			env := dynamotest.New(t, opts...)
			plain = env.Plain
			for _, st := range steps {
				expires := time.UnixMicro(st.now).Add(time.Hour)
				got, err := env.Store.TakeRate(context.Background(), st.key, capacity.RateStep{
					Now: st.now, Interval: iv, Tolerance: tol, Busy: st.busy, Expires: expires})
				if err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				w := st.want
				if !aws && !w.applied { // the emulator tells nothing of a refusal
					w.known, w.tat = false, 0
				}
				if g := (want{got.Applied, got.Known, got.TAT}); g != w {
					t.Errorf("%s: applied %v known %v TAT now%+d; want applied %v known %v TAT now%+d",
						st.name, g.applied, g.known, g.tat-now, w.applied, w.known, w.tat-now)
				}
			}
			items := env.Items(t, env.Store.LimitsTable)
			if len(items) != 1 {
				t.Fatalf("limits table holds %d items, want key-a's only: %v", len(items), items)
			}
			it := items[0]
			if pk := it["pk"].(*types.AttributeValueMemberS).Value; pk != "KEY#key-a" {
				t.Errorf("pk = %q, want KEY#key-a", pk)
			}
			exp, _ := strconv.ParseInt(it["expiresAt"].(*types.AttributeValueMemberN).Value, 10, 64)
			if want := time.UnixMicro(later).Add(time.Hour).Unix(); exp != want {
				t.Errorf("expiresAt = %d, want %d (the last applied step's)", exp, want)
			}
		})
	}
}

// untilDeadline is a timeout that ends no sooner than the test binary does (its -timeout;
// a day without one).
func untilDeadline(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return time.Until(d) + time.Minute
	}
	return 24 * time.Hour
}

type rateMetrics struct {
	mu                 sync.Mutex
	limited, unchecked int
}

func (m *rateMetrics) RateLimited(context.Context, string) {
	m.mu.Lock()
	m.limited++
	m.mu.Unlock()
}

func (m *rateMetrics) RateUnchecked(context.Context, string) {
	m.mu.Lock()
	m.unchecked++
	m.mu.Unlock()
}

// The limiter on the store: a key over its limit is refused with a RetryAfter, and writes
// nothing but its own item in the limits table; another key is admitted; neither touches the
// state, audit or keys tables. Concurrent calls of one key (its own flood) are admitted up to
// its burst and refused beyond it, never erring.
func TestRateLimiterOnStore(t *testing.T) {
	env := dynamotest.New(t)
	before := tables(t, env)
	now := time.Unix(1_800_000_000, 0)
	metrics := &rateMetrics{}
	// The limiter's own timeout would let a write slower than it through unchecked (fail
	// open, TestRateLimiterFailsOpen): a flood of 20 on a loaded machine then admitted more
	// than the burst. Here no write may time out before the test itself would: the answers
	// depend on the writes, not on how fast the machine gives them.
	l := &capacity.RateLimiter{Store: env.Store, Limit: capacity.RateLimit{PerSecond: 1, Burst: 5},
		Now: func() time.Time { return now }, Metrics: metrics, Timeout: untilDeadline(t)}
	ctx := context.Background()
	a := capacity.Principal{KeyID: "key-a", RateLimit: &capacity.RateLimit{PerSecond: 0.5, Burst: 2}}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- l.Admit(ctx, a)
		}()
	}
	wg.Wait()
	close(errs)
	admitted, refused := 0, 0
	for err := range errs {
		switch capacity.ErrorCode(err) {
		case capacity.CodeRateLimited:
			refused++
		default:
			if err != nil {
				t.Fatalf("a flood call: %v", err)
			}
			admitted++
		}
	}
	// Racing calls may refuse one that a serial run would admit, never admit more.
	if admitted < 1 || admitted > 2 || refused != 20-admitted {
		t.Errorf("flood of 20 at once: %d admitted, %d refused; want at most the burst (2) admitted, the rest refused", admitted, refused)
	}
	err := l.Admit(ctx, a)
	var e *capacity.Error
	if !errors.As(err, &e) || e.Code != capacity.CodeRateLimited || capacity.RetryAfterSeconds(e.RetryAfter) != 2 {
		t.Fatalf("key A after its burst: %v (retry after %v), want rate_limited, Retry-After 2 s", err, e)
	}
	for i := range 5 {
		if err := l.Admit(ctx, capacity.Principal{KeyID: "key-b"}); err != nil {
			t.Fatalf("key B call %d: %v", i+1, err)
		}
	}
	if metrics.unchecked != 0 || metrics.limited != refused+1 {
		t.Errorf("metrics: %d limited, %d unchecked; want %d and 0", metrics.limited, metrics.unchecked, refused+1)
	}
	if after := tables(t, env); !reflect.DeepEqual(before, after) {
		t.Errorf("the limiter wrote to the state, audit or keys table")
	}
	if n := len(env.Items(t, env.Store.LimitsTable)); n != 2 {
		t.Errorf("limits table holds %d items, want one per key (2)", n)
	}
}

// When the limiter's UpdateItem is throttled past the SDK's retries, refused by IAM, or meets
// a transaction conflict (no transaction touches a bucket; only a fault could), the call goes
// on (fail open) with the RateUnchecked metric; the limiter never answers 429 or an error for
// its own table's trouble.
func TestRateLimiterFaults(t *testing.T) {
	for _, f := range []awsfault.Fault{awsfault.Throttling, awsfault.ProvisionedThroughputExceeded, awsfault.AccessDenied, awsfault.TransactionConflict} {
		t.Run(string(f), func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: "UpdateItem", Fault: f, Rate: 1})
			env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
			metrics := &rateMetrics{}
			l := &capacity.RateLimiter{Store: env.Store, Limit: capacity.RateLimit{PerSecond: 1, Burst: 1}, Metrics: metrics}
			for i := range 3 {
				if err := l.Admit(context.Background(), capacity.Principal{KeyID: "key-a"}); err != nil {
					t.Fatalf("call %d: %v, want it let through", i+1, err)
				}
			}
			if inj.Count(f) == 0 || metrics.unchecked != 3 || metrics.limited != 0 {
				t.Errorf("%d faults injected; metrics %d unchecked, %d limited; want faults, 3 and 0", inj.Count(f), metrics.unchecked, metrics.limited)
			}
		})
	}
}

// A write whose answer is lost after it applied is retried by the SDK and meets the state it
// left: the call may spend more than one token (counted, never lost), and when every answer is
// lost it goes on unchecked. Even then a key within its burst is not refused.
func TestRateLimiterAmbiguousTimeout(t *testing.T) {
	inj := awsfault.New(1, awsfault.Rule{Operation: "UpdateItem", Fault: awsfault.AmbiguousTimeout, Rate: 1})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	metrics := &rateMetrics{}
	now := time.Unix(1_800_000_000, 0)
	l := &capacity.RateLimiter{Store: env.Store, Limit: capacity.RateLimit{PerSecond: 1, Burst: 20},
		Now: func() time.Time { return now }, Metrics: metrics}
	for i := range 3 {
		if err := l.Admit(context.Background(), capacity.Principal{KeyID: "key-a"}); err != nil {
			t.Fatalf("call %d: %v, want it let through", i+1, err)
		}
	}
	if inj.Count(awsfault.AmbiguousTimeout) == 0 || metrics.limited != 0 || metrics.unchecked != 3 {
		t.Errorf("%d lost answers; metrics %d limited, %d unchecked; want some, 0 and 3", inj.Count(awsfault.AmbiguousTimeout), metrics.limited, metrics.unchecked)
	}
	// Every lost answer was a token spent: the bucket shows at least one per call.
	items := env.Items(t, env.Store.LimitsTable)
	if len(items) != 1 {
		t.Fatalf("limits table holds %d items, want 1", len(items))
	}
	tat, _ := strconv.ParseInt(items[0]["Tat"].(*types.AttributeValueMemberN).Value, 10, 64)
	if spent := time.Duration(tat-now.UnixMicro()) * time.Microsecond; spent < 3*time.Second {
		t.Errorf("the bucket is %v ahead of now, want at least 3 s (three calls at 1/s)", spent)
	}
}

// A key's own rate limit is stored with it and comes back with every lookup (the limiter
// reads it from the principal, with no read of its own); a key without one has none.
func TestKeyRateLimitStored(t *testing.T) {
	env := dynamotest.New(t)
	ctx := context.Background()
	limited := capacity.APIKey{KeyID: "key-slow", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("slow")), OrgID: "o",
		Permissions: []string{capacity.PermRead}, RateLimit: &capacity.RateLimit{PerSecond: 0.5, Burst: 3}}
	plain := capacity.APIKey{KeyID: "key-plain", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("plain")), OrgID: "o",
		Permissions: []string{capacity.PermRead}}
	if err := env.Store.Keys().Put(ctx, limited, plain); err != nil {
		t.Fatal(err)
	}
	for _, k := range []capacity.APIKey{limited, plain} {
		got, err := env.Store.Keys().LookupKey(ctx, k.Hash)
		if err != nil || got == nil {
			t.Fatalf("lookup %s: %v, %v", k.KeyID, got, err)
		}
		byID, err := env.Store.GetKey(ctx, k.KeyID)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range []*capacity.APIKey{got, byID} {
			if !reflect.DeepEqual(g.RateLimit, k.RateLimit) || !reflect.DeepEqual(g.Principal().RateLimit, k.RateLimit) {
				t.Errorf("%s: rate limit %+v, want %+v", k.KeyID, g.RateLimit, k.RateLimit)
			}
		}
	}
}
