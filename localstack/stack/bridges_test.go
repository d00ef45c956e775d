package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	schedtypes "github.com/aws/aws-sdk-go-v2/service/scheduler/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"github.com/sivchari/kumo"
)

// kumoServer serves the emulator on a free port for one test. kumo's services are process-wide
// singletons, so tests name their resources uniquely.
func kumoServer(t *testing.T) aws.Config {
	t.Helper()

	srv := kumo.NewServer()
	t.Cleanup(srv.Close)

	return AWSConfig(srv.URL)
}

var nameSeq atomic.Int64

func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, nameSeq.Add(1))
}

// intercept answers the calls whose input has type In with h, before the SDK's retryer, so the
// code under test sees the answer itself; h returning (nil, nil) lets the call through.
func intercept[In any](h func(in In) (any, error)) func(*middleware.Stack) error {
	return func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc(fmt.Sprintf("intercept %T", *new(In)),
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if p, ok := in.Parameters.(In); ok {
					if out, err := h(p); out != nil || err != nil {
						return middleware.InitializeOutput{Result: out}, middleware.Metadata{}, err
					}
				}

				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testQueue makes a queue with a dead-letter queue (maxReceiveCount 2) and a 1 s visibility
// timeout, and returns the mapping of a function to it and the DLQ's URL.
func testQueue(t *testing.T, client *sqs.Client, batch int, report bool) (mappingSpec, string) {
	t.Helper()

	ctx := t.Context()
	name := uniqueName("q")

	dlq, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + "-dlq")})
	if err != nil {
		t.Fatal(err)
	}

	dlqAttrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: dlq.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{"QueueArn"}})
	if err != nil {
		t.Fatal(err)
	}

	q, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{
		"VisibilityTimeout": "1",
		"RedrivePolicy":     fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":2}`, dlqAttrs.Attributes["QueueArn"]),
	}})
	if err != nil {
		t.Fatal(err)
	}

	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{"QueueArn"}})
	if err != nil {
		t.Fatal(err)
	}

	return mappingSpec{
		function: "fn", queueARN: attrs.Attributes["QueueArn"], queueURL: aws.ToString(q.QueueUrl),
		batchSize: batch, reportFailures: report,
	}, aws.ToString(dlq.QueueUrl)
}

// queueCounts returns the visible and in-flight messages of a queue.
func queueCounts(t *testing.T, client *sqs.Client, url string) (visible, inflight string) {
	t.Helper()

	out, err := client.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{"All"}})
	if err != nil {
		t.Fatal(err)
	}

	return out.Attributes["ApproximateNumberOfMessages"], out.Attributes["ApproximateNumberOfMessagesNotVisible"]
}

// fakeFunction stands in for the function: it records every batch (message bodies) and answers
// with answer(bodies, ids).
type fakeFunction struct {
	mu      sync.Mutex
	batches [][]string
	events  []events.SQSEvent
	answer  func(bodies, ids []string) (*lambda.InvokeOutput, error)
}

func (f *fakeFunction) option(o *lambda.Options) {
	o.APIOptions = append(o.APIOptions, intercept(func(in *lambda.InvokeInput) (any, error) {
		var ev events.SQSEvent
		if err := json.Unmarshal(in.Payload, &ev); err != nil {
			return nil, err
		}

		var bodies, ids []string
		for _, r := range ev.Records {
			bodies = append(bodies, r.Body)
			ids = append(ids, r.MessageId)
		}

		f.mu.Lock()
		f.batches = append(f.batches, bodies)
		f.events = append(f.events, ev)
		f.mu.Unlock()

		out, err := f.answer(bodies, ids)
		if out == nil && err == nil {
			out = &lambda.InvokeOutput{StatusCode: 200, Payload: []byte("null")}
		}

		return out, err
	}))
}

func (f *fakeFunction) received() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()

	return slices.Clone(f.batches)
}

// failBodies answers with a partial batch response naming the messages whose body is in fail.
func failBodies(fail ...string) func(bodies, ids []string) (*lambda.InvokeOutput, error) {
	return func(bodies, ids []string) (*lambda.InvokeOutput, error) {
		var resp events.SQSEventResponse

		for i, b := range bodies {
			if slices.Contains(fail, b) {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: ids[i]})
			}
		}

		payload, _ := json.Marshal(resp)

		return &lambda.InvokeOutput{StatusCode: 200, Payload: payload}, nil
	}
}

// pollUntil runs poll rounds until cond holds, failing the test at the deadline.
func pollUntil(t *testing.T, p *sqsPoller, what string, cond func() bool) {
	t.Helper()

	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15s", what)
		}

		_, _ = p.pollOnce(t.Context(), 0)
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSQSPoller(t *testing.T) {
	cfg := kumoServer(t)

	tests := []struct {
		name     string
		report   bool
		batch    int
		answer   func(bodies, ids []string) (*lambda.InvokeOutput, error)
		deleteOK bool // false: the first DeleteMessageBatch fails for every entry
		// wantKept: the bodies that must come back and end in the DLQ; the others are deleted.
		wantKept   []string
		wantErr    bool // the first round reports an error
		firstBatch int  // records in the first invocation
	}{
		{name: "success deletes the batch", batch: 10, deleteOK: true, firstBatch: 3},
		{name: "batch size bounds the invocation", batch: 2, deleteOK: true, firstBatch: 2},
		{
			name: "partial batch response keeps only the failed", report: true, batch: 10, deleteOK: true,
			answer: failBodies("b"), wantKept: []string{"b"}, firstBatch: 3,
		},
		{
			name: "failures ignored without ReportBatchItemFailures", batch: 10, deleteOK: true,
			answer: failBodies("b"), firstBatch: 3,
		},
		{
			name: "function error retries the whole batch", report: true, batch: 10, deleteOK: true, firstBatch: 3,
			answer: func(_, _ []string) (*lambda.InvokeOutput, error) {
				return &lambda.InvokeOutput{StatusCode: 200, FunctionError: aws.String("Unhandled"), Payload: []byte(`{"errorMessage":"boom"}`)}, nil
			},
			wantKept: []string{"a", "b", "c"},
		},
		{
			name: "unknown item identifier fails the whole batch", report: true, batch: 10, deleteOK: true, firstBatch: 3,
			answer: func(_, _ []string) (*lambda.InvokeOutput, error) {
				return &lambda.InvokeOutput{StatusCode: 200, Payload: []byte(`{"batchItemFailures":[{"itemIdentifier":"nope"}]}`)}, nil
			},
			wantKept: []string{"a", "b", "c"},
		},
		{
			name: "unreadable answer fails the whole batch", report: true, batch: 10, deleteOK: true, firstBatch: 3,
			answer: func(_, _ []string) (*lambda.InvokeOutput, error) {
				return &lambda.InvokeOutput{StatusCode: 200, Payload: []byte(`"ok"`)}, nil
			},
			wantKept: []string{"a", "b", "c"},
		},
		{
			name: "invoke throttled keeps the batch", report: true, batch: 10, deleteOK: true, firstBatch: 3, wantErr: true,
			answer: func(_, _ []string) (*lambda.InvokeOutput, error) {
				return nil, &smithy.GenericAPIError{Code: "TooManyRequestsException", Message: "Rate exceeded"}
			},
			wantKept: []string{"a", "b", "c"},
		},
		{
			// The function ran, the delete failed: the batch comes back (at least once).
			name: "failed delete redelivers", batch: 10, firstBatch: 3, wantErr: true,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var deleteFailed atomic.Bool

			sqsClient := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
				o.APIOptions = append(o.APIOptions, intercept(func(in *sqs.DeleteMessageBatchInput) (any, error) {
					if tt.deleteOK || deleteFailed.Swap(true) {
						return nil, nil
					}

					out := &sqs.DeleteMessageBatchOutput{}
					for _, e := range in.Entries {
						out.Failed = append(out.Failed, sqstypes.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InternalError"), SenderFault: false})
					}

					return out, nil
				}))
			})

			m, dlq := testQueue(t, sqsClient, tt.batch, tt.report)

			fn := &fakeFunction{answer: tt.answer}
			if fn.answer == nil {
				fn.answer = func(_, _ []string) (*lambda.InvokeOutput, error) { return nil, nil }
			}

			p := &sqsPoller{m: m, sqs: sqsClient, lambda: lambda.NewFromConfig(cfg, fn.option), log: discardLogger()}

			for _, body := range []string{"a", "b", "c"} {
				if _, err := sqsClient.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(m.queueURL), MessageBody: aws.String(body)}); err != nil {
					t.Fatal(err)
				}
			}

			n, err := p.pollOnce(t.Context(), 0)
			if (err != nil) != tt.wantErr || n != tt.firstBatch {
				t.Fatalf("first round: %d messages, error %v; want %d, error %v", n, err, tt.firstBatch, tt.wantErr)
			}

			first := fn.events[0].Records[0]
			if first.EventSource != "aws:sqs" || first.EventSourceARN != m.queueARN || first.AWSRegion != region ||
				first.ReceiptHandle == "" || first.Attributes["ApproximateReceiveCount"] != "1" {
				t.Errorf("record = %+v", first)
			}

			// Every message either is deleted or comes back until the redrive policy moves it to
			// the dead-letter queue; drain both to see which.
			pollUntil(t, p, "main queue drained", func() bool {
				visible, inflight := queueCounts(t, sqsClient, m.queueURL)

				return visible == "0" && inflight == "0"
			})

			var kept []string

			for {
				out, err := sqsClient.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlq), MaxNumberOfMessages: 10})
				if err != nil {
					t.Fatal(err)
				}

				if len(out.Messages) == 0 {
					break
				}

				for _, msg := range out.Messages {
					kept = append(kept, aws.ToString(msg.Body))
				}
			}

			slices.Sort(kept)

			if !slices.Equal(kept, tt.wantKept) {
				t.Errorf("dead-lettered %v, want %v (batches %v)", kept, tt.wantKept, fn.received())
			}

			// Each message is delivered once if it succeeded, or maxReceiveCount (2) times.
			counts := map[string]int{}
			for _, b := range fn.received() {
				for _, body := range b {
					counts[body]++
				}
			}

			for _, body := range []string{"a", "b", "c"} {
				want := 1
				if slices.Contains(tt.wantKept, body) || !tt.deleteOK {
					want = 2
				}

				if counts[body] != want {
					t.Errorf("%s delivered %d times, want %d", body, counts[body], want)
				}
			}
		})
	}
}

func TestBatchItemFailures(t *testing.T) {
	batch := map[string]bool{"m1": true, "m2": true}

	tests := []struct {
		payload string
		want    []string
		ok      bool
	}{
		{payload: ``, ok: true},
		{payload: `null`, ok: true},
		{payload: `{}`, ok: true},
		{payload: `{"batchItemFailures":[]}`, ok: true},
		{payload: `{"batchItemFailures":[{"itemIdentifier":"m2"}]}`, want: []string{"m2"}, ok: true},
		{payload: `{"batchItemFailures":[{"itemIdentifier":""}]}`},
		{payload: `{"batchItemFailures":[{"itemIdentifier":"m3"}]}`},
		{payload: `[1]`},
	}

	for _, tt := range tests {
		got, ok := batchItemFailures([]byte(tt.payload), batch)

		var ids []string
		for id := range got {
			ids = append(ids, id)
		}

		if ok != tt.ok || !slices.Equal(ids, tt.want) {
			t.Errorf("%s: %v %v, want %v %v", tt.payload, ids, ok, tt.want, tt.ok)
		}
	}
}

func TestParseAt(t *testing.T) {
	tests := []struct {
		expr, tz string
		want     string // RFC 3339 in UTC; "" for an error
	}{
		{expr: "at(2030-01-02T03:04:05)", want: "2030-01-02T03:04:05Z"},
		{expr: "at(2030-01-02T03:04:05)", tz: "UTC", want: "2030-01-02T03:04:05Z"},
		{expr: "at(2030-07-01T12:00:00)", tz: "Europe/Berlin", want: "2030-07-01T10:00:00Z"},
		{expr: "rate(5 minutes)"},
		{expr: "cron(0 12 * * ? *)"},
		{expr: "at(2030-01-02)"},
		{expr: "at(2030-01-02T03:04:05)", tz: "Nowhere/Special"},
	}

	for _, tt := range tests {
		got, err := parseAt(tt.expr, tt.tz)
		if tt.want == "" {
			if err == nil {
				t.Errorf("%s %s: %v, want an error", tt.expr, tt.tz, got)
			}

			continue
		}

		if err != nil || got.UTC().Format(time.RFC3339) != tt.want {
			t.Errorf("%s %s: %v %v, want %s", tt.expr, tt.tz, got, err, tt.want)
		}
	}
}

// putRecorder records the entries put on the bus and can fail the first puts of the events
// that carry marker.
type putRecorder struct {
	mu      sync.Mutex
	entries []ebtypes.PutEventsRequestEntry
	marker  string
	fail    func(n int) (any, error) // the answer to the n-th put with marker (from 1); nil, nil to let it through
	n       int
}

func (r *putRecorder) option(o *eventbridge.Options) {
	o.APIOptions = append(o.APIOptions, intercept(func(in *eventbridge.PutEventsInput) (any, error) {
		r.mu.Lock()
		defer r.mu.Unlock()

		mine := slices.ContainsFunc(in.Entries, func(e ebtypes.PutEventsRequestEntry) bool {
			return strings.Contains(aws.ToString(e.Detail), r.marker)
		})
		if mine {
			r.n++
		}

		if mine && r.fail != nil {
			if out, err := r.fail(r.n); out != nil || err != nil {
				return out, err
			}
		}

		r.entries = append(r.entries, in.Entries...)

		return nil, nil
	}))
}

// of returns the entries whose detail carries marker (kumo's schedules are shared by the tests).
func (r *putRecorder) of(marker string) []ebtypes.PutEventsRequestEntry {
	r.mu.Lock()
	defer r.mu.Unlock()

	var out []ebtypes.PutEventsRequestEntry

	for _, e := range r.entries {
		if strings.Contains(aws.ToString(e.Detail), marker) {
			out = append(out, e)
		}
	}

	return out
}

func TestScheduleFirer(t *testing.T) {
	cfg := kumoServer(t)
	ctx := t.Context()
	busARN := "arn:aws:events:us-east-1:000000000000:event-bus/firer-bus"
	now := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)

	throttled := &smithy.GenericAPIError{Code: "ThrottlingException", Message: "Rate exceeded"}

	tests := []struct {
		name    string
		expr    string
		state   schedtypes.ScheduleState
		action  schedtypes.ActionAfterCompletion
		target  string
		putFail func(n int) (any, error)
		delFail int // DeleteSchedule calls that fail first

		wantPuts    []int // events put (for this schedule) after each round, at now, now, now+1h
		wantDeleted bool
	}{
		{name: "due and deleted", expr: "at(2030-05-06T07:08:09)", action: schedtypes.ActionAfterCompletionDelete, wantPuts: []int{1, 1, 1}, wantDeleted: true},
		{name: "future fires later", expr: "at(2030-05-06T07:30:00)", action: schedtypes.ActionAfterCompletionDelete, wantPuts: []int{0, 0, 1}, wantDeleted: true},
		{name: "kept without DELETE fires once", expr: "at(2030-05-06T07:00:00)", action: schedtypes.ActionAfterCompletionNone, wantPuts: []int{1, 1, 1}},
		{name: "disabled never fires", expr: "at(2030-05-06T07:00:00)", state: schedtypes.ScheduleStateDisabled, action: schedtypes.ActionAfterCompletionDelete, wantPuts: []int{0, 0, 0}},
		{name: "rate is not fired", expr: "rate(1 minute)", action: schedtypes.ActionAfterCompletionNone, wantPuts: []int{0, 0, 0}},
		{
			name: "non-bus target is not fired", expr: "at(2030-05-06T07:00:00)", action: schedtypes.ActionAfterCompletionDelete,
			target: "arn:aws:sqs:us-east-1:000000000000:somewhere", wantPuts: []int{0, 0, 0},
		},
		{
			name: "failed entry is retried", expr: "at(2030-05-06T07:00:00)", action: schedtypes.ActionAfterCompletionDelete,
			putFail: func(n int) (any, error) {
				if n > 1 {
					return nil, nil
				}

				return &eventbridge.PutEventsOutput{FailedEntryCount: 1, Entries: []ebtypes.PutEventsResultEntry{{ErrorCode: aws.String("InternalFailure")}}}, nil
			},
			wantPuts: []int{0, 1, 1}, wantDeleted: true,
		},
		{
			name: "throttled put is retried", expr: "at(2030-05-06T07:00:00)", action: schedtypes.ActionAfterCompletionDelete,
			putFail: func(n int) (any, error) {
				if n > 1 {
					return nil, nil
				}

				return nil, throttled
			},
			wantPuts: []int{0, 1, 1}, wantDeleted: true,
		},
		{
			name: "failed delete is retried without firing again", expr: "at(2030-05-06T07:00:00)", action: schedtypes.ActionAfterCompletionDelete,
			delFail: 1, wantPuts: []int{1, 1, 1}, wantDeleted: true,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			group := uniqueName("g")
			marker := uniqueName("marker")

			admin := scheduler.NewFromConfig(cfg)
			if _, err := admin.CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
				t.Fatal(err)
			}

			target := valueOr(tt.target, busARN)
			in := &scheduler.CreateScheduleInput{
				Name: aws.String("s1"), GroupName: aws.String(group),
				ScheduleExpression: aws.String(tt.expr), ActionAfterCompletion: tt.action,
				FlexibleTimeWindow: &schedtypes.FlexibleTimeWindow{Mode: schedtypes.FlexibleTimeWindowModeOff},
				Target: &schedtypes.Target{
					Arn: aws.String(target), RoleArn: aws.String("arn:aws:iam::000000000000:role/scheduler"),
					Input: aws.String(fmt.Sprintf(`{"marker":%q}`, marker)),
					EventBridgeParameters: &schedtypes.EventBridgeParameters{
						DetailType: aws.String("Capacity Reclaim Requested"), Source: aws.String("openrelay.capacity.schedule"),
					},
				},
			}
			if tt.state != "" {
				in.State = tt.state
			}

			if _, err := admin.CreateSchedule(ctx, in); err != nil {
				t.Fatal(err)
			}

			// kumo's schedules are process-wide: leave none for the next test's firer.
			t.Cleanup(func() {
				_, _ = admin.DeleteSchedule(context.Background(), &scheduler.DeleteScheduleInput{Name: aws.String("s1"), GroupName: aws.String(group)})
			})

			var deletes atomic.Int32

			sched := scheduler.NewFromConfig(cfg, func(o *scheduler.Options) {
				o.APIOptions = append(o.APIOptions, intercept(func(in *scheduler.DeleteScheduleInput) (any, error) {
					if aws.ToString(in.GroupName) == group && int(deletes.Add(1)) <= tt.delFail {
						return nil, &smithy.GenericAPIError{Code: "InternalServerException", Message: "try again"}
					}

					return nil, nil
				}))
			})

			puts := &putRecorder{marker: marker, fail: tt.putFail}
			f := newScheduleFirer(sched, eventbridge.NewFromConfig(cfg, puts.option), discardLogger())

			for round, at := range []time.Time{now, now, now.Add(time.Hour)} {
				f.now = func() time.Time { return at }
				_ = f.tick(ctx) // other tests' schedules may fail here on purpose

				if got := len(puts.of(marker)); got != tt.wantPuts[round] {
					t.Fatalf("round %d: %d events put, want %d", round, got, tt.wantPuts[round])
				}
			}

			if got := puts.of(marker); len(got) > 0 {
				e := got[0]
				if aws.ToString(e.EventBusName) != "firer-bus" || aws.ToString(e.Source) != "openrelay.capacity.schedule" ||
					aws.ToString(e.DetailType) != "Capacity Reclaim Requested" || aws.ToString(e.Detail) != fmt.Sprintf(`{"marker":%q}`, marker) {
					t.Errorf("event = %+v", e)
				}
			}

			_, err := admin.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String("s1"), GroupName: aws.String(group)})

			var notFound *schedtypes.ResourceNotFoundException
			if deleted := errors.As(err, &notFound); deleted != tt.wantDeleted || (err != nil && !deleted) {
				t.Errorf("after the rounds: get schedule error %v, want deleted %v", err, tt.wantDeleted)
			}
		})
	}
}
