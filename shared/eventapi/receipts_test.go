package eventapi_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	"github.com/sivchari/kumo"

	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/eventapi"
)

// refusals counts IntakeRecordsRefused.
type refusals struct{ ids []string }

func (r *refusals) IntakeRecordRefused(_ context.Context, id string) { r.ids = append(r.ids, id) }

var queueSeq atomic.Int64

// intake is an intake queue on the emulator and a client of it.
type intake struct {
	client *sqs.Client
	url    string
}

func newIntake(t *testing.T, opts ...func(*sqs.Options)) intake {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	o := sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	setup := sqs.New(o)
	q, err := setup.CreateQueue(context.Background(), &sqs.CreateQueueInput{
		QueueName: aws.String(fmt.Sprintf("capacity-test-%d", queueSeq.Add(1))), Attributes: map[string]string{"VisibilityTimeout": "360"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, opt := range opts {
		opt(&o)
	}
	return intake{client: sqs.New(o), url: aws.ToString(q.QueueUrl)}
}

// receive sends the body through the queue and receives it, as the event source mapping
// does: the record carries the queue's receipt handle.
func (q intake) receive(t *testing.T, body string) events.SQSMessage {
	t.Helper()
	ctx := context.Background()
	if _, err := q.client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q.url), MessageBody: aws.String(body)}); err != nil {
		t.Fatal(err)
	}
	out, err := q.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q.url), MaxNumberOfMessages: 1})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(out.Messages))
	}
	m := out.Messages[0]
	return events.SQSMessage{MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle), Body: aws.ToString(m.Body), EventSourceARN: intakeQueue}
}

// awsStaleHandle makes the emulator answer a handle it no longer holds as AWS answers the
// handle of a deleted message: InvalidParameterValue ("Message does not exist or is not
// available for visibility timeout change"); the emulator says ReceiptHandleIsInvalid.
func awsStaleHandle(o *sqs.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("awsStaleHandle",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				if res, ok := out.Result.(*sqs.ChangeMessageVisibilityBatchOutput); ok {
					for i := range res.Failed {
						res.Failed[i].Code = aws.String("InvalidParameterValue")
					}
				}
				return out, md, err
			}), middleware.After)
	})
}

// throttled fails every ChangeMessageVisibilityBatch, as SQS throttling after the retries.
func throttled(o *sqs.Options) {
	o.RetryMaxAttempts = 1
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("throttled",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if _, ok := in.Parameters.(*sqs.ChangeMessageVisibilityBatchInput); ok {
					return middleware.InitializeOutput{}, middleware.Metadata{}, errors.New("RequestThrottled: over the limit")
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	})
}

// TestIntakeActsOnlyOnWhatTheQueueHandedOut: reclaim-events acts on a record only if the
// intake queue recognises its receipt handle, which only a receive of the queue makes (and
// the queue's policy lets only the function's role receive). A record made up by whoever
// invokes the function directly, with every field a real one has, changes nothing, is
// counted (IntakeRecordsRefused) and reported failed; a check that could not be made leaves
// every record to another delivery, refusing none.
func TestIntakeActsOnlyOnWhatTheQueueHandedOut(t *testing.T) {
	body := envelope("ev-1", tenant, valid)
	tests := []struct {
		name    string
		opts    []func(*sqs.Options)
		records func(t *testing.T, q intake) []events.SQSMessage
		// want
		calls, refused, failed int
	}{
		{name: "received through the queue", records: func(t *testing.T, q intake) []events.SQSMessage {
			return []events.SQSMessage{q.receive(t, body)}
		}, calls: 1},
		{name: "direct invoke, made-up receipt handle", records: func(t *testing.T, q intake) []events.SQSMessage {
			return []events.SQSMessage{{MessageId: "forged-1", ReceiptHandle: "AQEBforged==", Body: body, EventSourceARN: intakeQueue}}
		}, refused: 1, failed: 1},
		{name: "direct invoke, no receipt handle", records: func(t *testing.T, q intake) []events.SQSMessage {
			return []events.SQSMessage{{MessageId: "forged-2", Body: body, EventSourceARN: intakeQueue}}
		}, refused: 1, failed: 1},
		{name: "a real handle of a deleted message, as AWS answers it", opts: []func(*sqs.Options){awsStaleHandle},
			records: func(t *testing.T, q intake) []events.SQSMessage {
				rec := q.receive(t, body)
				if _, err := q.client.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(q.url), ReceiptHandle: aws.String(rec.ReceiptHandle)}); err != nil {
					t.Fatal(err)
				}
				return []events.SQSMessage{rec}
			}, refused: 1, failed: 1},
		{name: "a forged record beside a real one", records: func(t *testing.T, q intake) []events.SQSMessage {
			forged := events.SQSMessage{MessageId: "forged-3", ReceiptHandle: "AQEBforged==", Body: envelope("ev-2", tenant, valid), EventSourceARN: intakeQueue}
			return []events.SQSMessage{forged, q.receive(t, body)}
		}, calls: 1, refused: 1, failed: 1},
		{name: "the check fails: retried, not refused", opts: []func(*sqs.Options){throttled}, records: func(t *testing.T, q intake) []events.SQSMessage {
			return []events.SQSMessage{q.receive(t, body)}
		}, failed: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := newIntake(t, tc.opts...)
			svc := &fakeService{res: result()}
			pub := &capacitytest.Publisher{}
			h := newHandler(svc, pub)
			counted := &refusals{}
			h.Receipts = &eventapi.QueueReceipts{Client: q.client, QueueURL: q.url}
			h.Refusals = counted
			resp, err := h.Handle(context.Background(), events.SQSEvent{Records: tc.records(t, q)})
			if err != nil {
				t.Fatal(err)
			}
			if len(svc.calls) != tc.calls || len(pub.Published()) != tc.calls {
				t.Errorf("service calls %d, outcomes published %d; want %d", len(svc.calls), len(pub.Published()), tc.calls)
			}
			if len(counted.ids) != tc.refused {
				t.Errorf("IntakeRecordsRefused %v, want %d", counted.ids, tc.refused)
			}
			if len(resp.BatchItemFailures) != tc.failed {
				t.Errorf("batch item failures %v, want %d", resp.BatchItemFailures, tc.failed)
			}
		})
	}
}
