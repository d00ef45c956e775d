package eventbus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/eventbus"
)

// answer is EventBridge's HTTP answer to one attempt.
type answer struct {
	status int
	body   any
}

// fakeBus stands in for EventBridge inside the SDK's middleware stack, below the retryer, so
// each attempt (the SDK's own retries included) gets the next scripted answer.
type fakeBus struct {
	mu       sync.Mutex
	script   func(attempt int, in *eventbridge.PutEventsInput) answer
	attempts int
	calls    []*eventbridge.PutEventsInput // every attempt's input
}

type paramsKey struct{}

func (f *fakeBus) client() *eventbridge.Client {
	return eventbridge.New(eventbridge.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String("http://127.0.0.1:1"), // never dialled: the fake answers
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		}),
		APIOptions: []func(*middleware.Stack) error{f.install},
	})
}

func (f *fakeBus) install(stack *middleware.Stack) error {
	if err := stack.Initialize.Add(middleware.InitializeMiddlewareFunc("fake.params",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			return next.HandleInitialize(middleware.WithStackValue(ctx, paramsKey{}, in.Parameters), in)
		}), middleware.After); err != nil {
		return err
	}
	return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("fake.bus",
		func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
			params, _ := middleware.GetStackValue(ctx, paramsKey{}).(*eventbridge.PutEventsInput)
			f.mu.Lock()
			f.attempts++
			n := f.attempts
			f.calls = append(f.calls, params)
			f.mu.Unlock()
			a := f.script(n, params)
			b, _ := json.Marshal(a.body)
			h := http.Header{}
			h.Set("Content-Type", "application/x-amz-json-1.1")
			h.Set("X-Amzn-Requestid", "req-"+strconv.Itoa(n))
			return middleware.DeserializeOutput{RawResponse: &smithyhttp.Response{Response: &http.Response{
				StatusCode: a.status, Header: h, Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)),
			}}}, middleware.Metadata{}, nil
		}), middleware.After)
}

// ok accepts every entry.
func ok(in *eventbridge.PutEventsInput) answer {
	entries := make([]map[string]any, len(in.Entries))
	for i := range entries {
		entries[i] = map[string]any{"EventId": fmt.Sprintf("id-%d", i)}
	}
	return answer{200, map[string]any{"FailedEntryCount": 0, "Entries": entries}}
}

// failing fails the entries whose eventId is in ids with code.
func failing(in *eventbridge.PutEventsInput, code string, ids ...string) answer {
	entries := make([]map[string]any, len(in.Entries))
	failed := 0
	for i, e := range in.Entries {
		var d struct{ EventID string }
		_ = json.Unmarshal([]byte(*e.Detail), &d)
		entries[i] = map[string]any{"EventId": fmt.Sprintf("id-%d", i)}
		for _, id := range ids {
			if d.EventID == id {
				entries[i] = map[string]any{"ErrorCode": code, "ErrorMessage": "injected"}
				failed++
			}
		}
	}
	return answer{200, map[string]any{"FailedEntryCount": failed, "Entries": entries}}
}

func throttled() answer {
	return answer{400, map[string]any{"__type": "ThrottlingException", "message": "Rate exceeded"}}
}

func events(n int) []capacity.Event {
	at := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	out := make([]capacity.Event, n)
	for i := range out {
		id := fmt.Sprintf("r-1/notice/vm-%d", i)
		out[i] = capacity.Event{ID: id, DetailType: capacity.DetailEvictionNotice, Time: at,
			Detail: map[string]any{"eventId": id, "vmId": fmt.Sprintf("vm-%d", i)}}
	}
	return out
}

// eventIDs lists the eventIds of the entries of one attempt.
func eventIDs(t *testing.T, in *eventbridge.PutEventsInput) []string {
	t.Helper()
	var ids []string
	for _, e := range in.Entries {
		var d struct {
			EventID string `json:"eventId"`
		}
		if err := json.Unmarshal([]byte(*e.Detail), &d); err != nil {
			t.Fatalf("detail %q: %v", *e.Detail, err)
		}
		ids = append(ids, d.EventID)
	}
	return ids
}

func TestPublish(t *testing.T) {
	tests := []struct {
		name    string
		events  int
		script  func(attempt int, in *eventbridge.PutEventsInput) answer
		wantErr string // "" for success
		// wantCalls is the eventIds of each attempt, in order.
		wantCalls [][]string
	}{
		{
			name: "partial failure is retried until it succeeds", events: 3,
			script: func(n int, in *eventbridge.PutEventsInput) answer {
				if n == 1 {
					return failing(in, "InternalFailure", "r-1/notice/vm-1")
				}
				return ok(in)
			},
			wantCalls: [][]string{{"r-1/notice/vm-0", "r-1/notice/vm-1", "r-1/notice/vm-2"}, {"r-1/notice/vm-1"}},
		},
		{
			name: "persistent entry failure is an error naming the codes", events: 2,
			script: func(_ int, in *eventbridge.PutEventsInput) answer {
				return failing(in, "ThrottlingException", "r-1/notice/vm-0")
			},
			wantErr: "r-1/notice/vm-0: ThrottlingException",
			wantCalls: [][]string{
				{"r-1/notice/vm-0", "r-1/notice/vm-1"}, {"r-1/notice/vm-0"}, {"r-1/notice/vm-0"}, {"r-1/notice/vm-0"}, {"r-1/notice/vm-0"},
			},
		},
		{
			name: "a throttled call is retried by the SDK", events: 1,
			script: func(n int, in *eventbridge.PutEventsInput) answer {
				if n == 1 {
					return throttled()
				}
				return ok(in)
			},
			wantCalls: [][]string{{"r-1/notice/vm-0"}, {"r-1/notice/vm-0"}},
		},
		{
			name: "a call throttled past the SDK's attempts is an error", events: 1,
			script:    func(int, *eventbridge.PutEventsInput) answer { return throttled() },
			wantErr:   "ThrottlingException",
			wantCalls: [][]string{{"r-1/notice/vm-0"}, {"r-1/notice/vm-0"}, {"r-1/notice/vm-0"}},
		},
		{
			name: "a failed count without codes sends the batch again", events: 2,
			script: func(n int, in *eventbridge.PutEventsInput) answer {
				if n == 1 {
					return answer{200, map[string]any{"FailedEntryCount": 1, "Entries": []any{}}}
				}
				return ok(in)
			},
			wantCalls: [][]string{{"r-1/notice/vm-0", "r-1/notice/vm-1"}, {"r-1/notice/vm-0", "r-1/notice/vm-1"}},
		},
		{name: "nothing to publish makes no call", events: 0, script: func(int, *eventbridge.PutEventsInput) answer { return throttled() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bus := &fakeBus{script: tt.script}
			p := eventbus.New(bus.client(), "capacity-test")
			p.Backoff = func(int) time.Duration { return 0 }
			err := p.Publish(context.Background(), events(tt.events))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Publish: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Publish error = %v, want one containing %q", err, tt.wantErr)
			}
			if len(bus.calls) != len(tt.wantCalls) {
				t.Fatalf("%d attempts, want %d", len(bus.calls), len(tt.wantCalls))
			}
			for i, in := range bus.calls {
				if got := strings.Join(eventIDs(t, in), ","); got != strings.Join(tt.wantCalls[i], ",") {
					t.Errorf("attempt %d sent %s, want %s", i+1, got, strings.Join(tt.wantCalls[i], ","))
				}
			}
		})
	}
}

// TestPublishBatches: 23 events go in calls of at most 10 entries, each entry as the bus
// expects it.
func TestPublishBatches(t *testing.T) {
	bus := &fakeBus{script: func(_ int, in *eventbridge.PutEventsInput) answer { return ok(in) }}
	if err := eventbus.New(bus.client(), "capacity-test").Publish(context.Background(), events(23)); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	var sizes []int
	seen := map[string]bool{}
	for _, in := range bus.calls {
		sizes = append(sizes, len(in.Entries))
		for _, e := range in.Entries {
			if *e.Source != capacity.SourceCapacity || *e.DetailType != capacity.DetailEvictionNotice ||
				*e.EventBusName != "capacity-test" || !e.Time.Equal(time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)) {
				t.Errorf("entry = source %s, detail-type %s, bus %s, time %s", *e.Source, *e.DetailType, *e.EventBusName, e.Time)
			}
		}
		for _, id := range eventIDs(t, in) {
			seen[id] = true
		}
	}
	if fmt.Sprint(sizes) != "[10 10 3]" || len(seen) != 23 {
		t.Fatalf("calls of %v entries with %d distinct events, want [10 10 3] with 23", sizes, len(seen))
	}
}

// TestPublishSizeLimit: a batch stays under 256 KB, and an event larger than that alone is
// an error before any call.
func TestPublishSizeLimit(t *testing.T) {
	big := strings.Repeat("x", 100*1024)
	evs := events(3)
	for i := range evs {
		evs[i].Detail = map[string]any{"eventId": evs[i].ID, "pad": big}
	}
	bus := &fakeBus{script: func(_ int, in *eventbridge.PutEventsInput) answer { return ok(in) }}
	if err := eventbus.New(bus.client(), "capacity-test").Publish(context.Background(), evs); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if len(bus.calls) != 2 || len(bus.calls[0].Entries) != 2 || len(bus.calls[1].Entries) != 1 {
		t.Fatalf("%d calls, want 2 (2 + 1 entries)", len(bus.calls))
	}

	evs[0].Detail = map[string]any{"eventId": evs[0].ID, "pad": strings.Repeat("x", 257*1024)}
	bus = &fakeBus{script: func(_ int, in *eventbridge.PutEventsInput) answer { return ok(in) }}
	err := eventbus.New(bus.client(), "capacity-test").Publish(context.Background(), evs)
	if err == nil || !strings.Contains(err.Error(), "more than EventBridge's") || len(bus.calls) != 0 {
		t.Fatalf("Publish of a 257 KB event = %v after %d calls, want a size error and no call", err, len(bus.calls))
	}
}
