package stepfn_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/openrelay/capacity/shared/stepfn"
)

// fakeQueue and fakeExecutions record what the runner sends and starts; err fails every call.
type fakeQueue struct {
	sent       []*sqs.SendMessageInput
	visibility []*sqs.ChangeMessageVisibilityInput
	err        error
}

func (q *fakeQueue) ChangeMessageVisibility(_ context.Context, in *sqs.ChangeMessageVisibilityInput, _ ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	q.visibility = append(q.visibility, in)
	return &sqs.ChangeMessageVisibilityOutput{}, nil
}

func (q *fakeQueue) SendMessage(_ context.Context, in *sqs.SendMessageInput, _ ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	if q.err != nil {
		return nil, q.err
	}
	q.sent = append(q.sent, in)
	return &sqs.SendMessageOutput{}, nil
}

type fakeExecutions struct {
	started []*sfn.StartExecutionInput
	err     error
}

func (e *fakeExecutions) StartExecution(_ context.Context, in *sfn.StartExecutionInput, _ ...func(*sfn.Options)) (*sfn.StartExecutionOutput, error) {
	if e.err != nil {
		return nil, e.err
	}
	e.started = append(e.started, in)
	return &sfn.StartExecutionOutput{ExecutionArn: aws.String("arn:x:" + aws.ToString(in.Name))}, nil
}

const stepBody = `{"step":"round","reclaimId":"rcl_1","nodeId":"n1","attempt":2,"round":1,"vmIds":["a"],"maxRounds":5,"dueAt":"%s"}`

// Each step runs once it is due: a due one (or one less than a second early, a clock ahead of
// the queue's) starts a run of the step as it came; an early one goes back to the queue with
// the delay left, rounded up, at most SQS's 900 s; a malformed one is dropped (no delivery
// would run it); a failed send or start is a batch item failure, for another delivery.
func TestStepRunnerRunsEachStepWhenDue(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	body := func(due time.Time) string { return strings.Replace(stepBody, "%s", stepfn.FormatDueAt(due), 1) }
	boom := errors.New("boom")
	tests := []struct {
		name            string
		body            string
		queueErr, exErr error
		wantStarted     bool
		wantDelay       int32 // of the message sent again; -1: none sent
		wantFailed      bool
	}{
		{"due", body(now), nil, nil, true, -1, false},
		{"late", body(now.Add(-time.Minute)), nil, nil, true, -1, false},
		{"early by a clock's skew", body(now.Add(time.Millisecond)), nil, nil, true, -1, false},
		{"early", body(now.Add(7500 * time.Millisecond)), nil, nil, false, 8, false},
		{"early beyond SQS's delay", body(now.Add(time.Hour)), nil, nil, false, 900, false},
		{"early, send fails", body(now.Add(5 * time.Second)), boom, nil, false, -1, true},
		{"due, start fails", body(now), nil, boom, false, -1, true},
		{"not JSON", "{", nil, nil, false, -1, false},
		{"not a round", strings.Replace(body(now), `"round",`, `"first",`, 1), nil, nil, false, -1, false},
		{"no reclaim", strings.Replace(body(now), `"rcl_1"`, `""`, 1), nil, nil, false, -1, false},
		{"no dueAt", strings.Replace(body(now), stepfn.FormatDueAt(now), "", 1), nil, nil, false, -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, ex := &fakeQueue{err: tt.queueErr}, &fakeExecutions{err: tt.exErr}
			r := &stepfn.StepRunner{Executions: ex, StateMachineARN: "arn:sm", Queue: q, QueueURL: "https://q",
				Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Now: func() time.Time { return now }}
			resp, err := r.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m1", ReceiptHandle: "h1", Body: tt.body}}})
			if err != nil {
				t.Fatal(err)
			}
			if failed := len(resp.BatchItemFailures) == 1 && resp.BatchItemFailures[0].ItemIdentifier == "m1"; failed != tt.wantFailed || len(resp.BatchItemFailures) > 1 {
				t.Errorf("batch item failures %+v, want failed %v", resp.BatchItemFailures, tt.wantFailed)
			}
			if started := len(ex.started) == 1; started != tt.wantStarted || len(ex.started) > 1 {
				t.Fatalf("%d runs started, want started %v", len(ex.started), tt.wantStarted)
			}
			// A failed step comes back 10 s on, not after the queue's 180 s visibility timeout.
			if wantVis := tt.wantFailed; (len(q.visibility) == 1) != wantVis || wantVis &&
				(q.visibility[0].VisibilityTimeout != 10 || aws.ToString(q.visibility[0].ReceiptHandle) != "h1") {
				t.Errorf("visibility changes %+v, want one of 10 s when the record failed", q.visibility)
			}
			if tt.wantStarted {
				in := ex.started[0]
				if aws.ToString(in.StateMachineArn) != "arn:sm" || aws.ToString(in.Input) != tt.body || !strings.HasPrefix(aws.ToString(in.Name), "rcl_1-2-r1-") {
					t.Errorf("started %s named %s with %s", aws.ToString(in.StateMachineArn), aws.ToString(in.Name), aws.ToString(in.Input))
				}
			}
			switch {
			case tt.wantDelay < 0 && len(q.sent) > 0:
				t.Errorf("sent %d messages, want none", len(q.sent))
			case tt.wantDelay >= 0 && (len(q.sent) != 1 || q.sent[0].DelaySeconds != tt.wantDelay ||
				aws.ToString(q.sent[0].MessageBody) != tt.body || aws.ToString(q.sent[0].QueueUrl) != "https://q"):
				t.Errorf("sent %+v, want the step again with delay %d", q.sent, tt.wantDelay)
			}
		})
	}
}

// One failed record of a batch is retried alone: the others ran.
func TestStepRunnerFailsOnlyTheRecordThatFailed(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	good := strings.Replace(stepBody, "%s", stepfn.FormatDueAt(now), 1)
	ex := &fakeExecutions{}
	q := &fakeQueue{err: errors.New("boom")}
	r := &stepfn.StepRunner{Executions: ex, StateMachineARN: "arn:sm", Queue: q, QueueURL: "https://q",
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Now: func() time.Time { return now }}
	early := strings.Replace(stepBody, "%s", stepfn.FormatDueAt(now.Add(time.Minute)), 1)
	resp, _ := r.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m1", Body: good}, {MessageId: "m2", Body: early}, {MessageId: "m3", Body: good}}})
	if want := []events.SQSBatchItemFailure{{ItemIdentifier: "m2"}}; !reflect.DeepEqual(resp.BatchItemFailures, want) {
		t.Errorf("failures %+v, want %+v", resp.BatchItemFailures, want)
	}
	if len(ex.started) != 2 || aws.ToString(ex.started[0].Name) == aws.ToString(ex.started[1].Name) {
		t.Errorf("started %d runs, want 2 of distinct names", len(ex.started))
	}
}

// A step that keeps failing comes back later each time: 10 s after its first receive,
// doubling, at most 160 s (below the queue's 180 s visibility timeout).
func TestStepRunnerBacksOffAFailingStep(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	body := strings.Replace(stepBody, "%s", stepfn.FormatDueAt(now), 1)
	for receives, want := range map[string]int32{"": 10, "1": 10, "2": 20, "3": 40, "5": 160, "9": 160} {
		q := &fakeQueue{}
		r := &stepfn.StepRunner{Executions: &fakeExecutions{err: errors.New("throttled")}, StateMachineARN: "arn:sm", Queue: q, QueueURL: "https://q",
			Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Now: func() time.Time { return now }}
		_, _ = r.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m1", ReceiptHandle: "h1", Body: body,
			Attributes: map[string]string{"ApproximateReceiveCount": receives}}}})
		if len(q.visibility) != 1 || q.visibility[0].VisibilityTimeout != want {
			t.Errorf("receive %q: visibility %+v, want %d s", receives, q.visibility, want)
		}
	}
}

// A run's name fits Step Functions' 80 characters whatever the reclaim id.
func TestRunNameFits(t *testing.T) {
	name := stepfn.RunName(stepfn.Step{ReclaimID: strings.Repeat("r", 100), Attempt: 3, Round: 4})
	if len(name) != 80 || !strings.Contains(name, "-3-r4-") {
		t.Errorf("name %q (%d)", name, len(name))
	}
}
