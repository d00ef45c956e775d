package stepfn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/openrelay/capacity/shared/capacity"
)

// Step is a later step of the termination workflow as the termination-steps queue carries it:
// one round of an operation's attempt, not to run before DueAt. The state machine writes it
// (its ScheduleRound and ScheduleRetry states); the steps function starts a run of it.
type Step struct {
	Step      string   `json:"step"`
	ReclaimID string   `json:"reclaimId"`
	NodeID    string   `json:"nodeId"`
	Attempt   int      `json:"attempt"`
	Round     int      `json:"round"`
	VMIDs     []string `json:"vmIds"`
	MaxRounds int      `json:"maxRounds"`
	DueAt     string   `json:"dueAt"`
}

// ParseStep decodes and checks a step's message body: a round of a named operation's
// attempt, with a time it is due.
func ParseStep(body string) (Step, time.Time, error) {
	var s Step
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		return s, time.Time{}, fmt.Errorf("step is not JSON: %w", err)
	}
	due, err := time.Parse(time.RFC3339Nano, s.DueAt)
	switch {
	case s.Step != StepRound:
		return s, due, fmt.Errorf("step %q: want %q", s.Step, StepRound)
	case s.ReclaimID == "" || s.NodeID == "":
		return s, due, errors.New("step names no reclaim or node")
	case s.Attempt < 1 || s.Round < 0 || s.MaxRounds < 1:
		return s, due, fmt.Errorf("step of attempt %d, round %d of %d: out of range", s.Attempt, s.Round, s.MaxRounds)
	case err != nil:
		return s, due, fmt.Errorf("step dueAt %q: %w", s.DueAt, err)
	}
	return s, due, nil
}

// earlyTolerance is how early a step may arrive and still run now (after waiting out the
// rest): a clock a little ahead of the queue's is no reason for another trip through it.
const earlyTolerance = time.Second

// Queue is what the steps runner sends to the queue with.
type Queue interface {
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

// Executions is what the steps runner starts runs with.
type Executions interface {
	StartExecution(ctx context.Context, in *sfn.StartExecutionInput, optFns ...func(*sfn.Options)) (*sfn.StartExecutionOutput, error)
}

// StepRunner is the termination-steps function: it starts an Express run of each step the
// queue delivers once the step is due, and holds an early one back by sending it again with
// the delay left (the queue's delay is the only wait of the workflow; the local emulator's
// state machine drops a message's delay, so there this is what makes the wait).
type StepRunner struct {
	Executions      Executions
	StateMachineARN string
	Queue           Queue
	QueueURL        string
	Logger          *slog.Logger
	Now             func() time.Time // nil: time.Now
}

// Handle runs a batch of steps. A record whose send or start failed is reported as a batch
// item failure, so the queue delivers it again (and, after its last receive, dead-letters
// it), sooner than the queue's visibility timeout would (retryAfter); a malformed one is
// logged and dropped: no delivery would make it run.
func (r *StepRunner) Handle(ctx context.Context, batch events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	for _, rec := range batch.Records {
		err := r.run(ctx, rec)
		if err == nil {
			continue
		}
		after := retryAfter(rec)
		r.Logger.ErrorContext(ctx, "termination step not run; it will be delivered again",
			"message_id", rec.MessageId, "retry_after_seconds", after, "error", err.Error())
		resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
		if _, err := r.Queue.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(r.QueueURL), ReceiptHandle: aws.String(rec.ReceiptHandle), VisibilityTimeout: after,
		}); err != nil { // it comes back after the queue's visibility timeout instead
			r.Logger.WarnContext(ctx, "termination step's retry not brought forward", "message_id", rec.MessageId, "error", err.Error())
		}
	}
	return resp, nil
}

// retryAfter is when a step that failed is delivered again: 10 s after its first receive,
// doubling with each (a round waits on it; the queue's 180 s visibility timeout is for a
// batch still in flight), so a step that keeps failing is dead-lettered after its fifth
// receive about 2.5 minutes on, and the reconciler takes its operation over.
func retryAfter(rec events.SQSMessage) int32 {
	n, err := strconv.Atoi(rec.Attributes["ApproximateReceiveCount"])
	if err != nil || n < 1 {
		n = 1
	}
	return int32(10 << min(n-1, 4))
}

func (r *StepRunner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// run handles one record: an error asks for its delivery again.
func (r *StepRunner) run(ctx context.Context, rec events.SQSMessage) error {
	step, due, err := ParseStep(rec.Body)
	if err != nil {
		r.Logger.ErrorContext(ctx, "malformed termination step dropped", "message_id", rec.MessageId, "error", err.Error(), "body", rec.Body)
		return nil
	}
	log := r.Logger.With("reclaim_id", step.ReclaimID, "attempt", step.Attempt, "round", step.Round, "message_id", rec.MessageId)
	left := due.Sub(r.now())
	if left > earlyTolerance {
		delay := DelaySeconds(left)
		if _, err := r.Queue.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl: aws.String(r.QueueURL), MessageBody: aws.String(rec.Body), DelaySeconds: int32(delay),
		}); err != nil {
			return fmt.Errorf("hold step back %d s: %w", delay, err)
		}
		log.InfoContext(ctx, "termination step early: held back", "due_at", step.DueAt, "delay_seconds", delay)
		return nil
	}
	if err := capacity.Sleep(ctx, left); err != nil {
		return err
	}
	name := RunName(step)
	out, err := r.Executions.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(r.StateMachineARN), Name: aws.String(name), Input: aws.String(rec.Body),
		TraceHeader: traceHeader(ctx),
	})
	if err != nil {
		return fmt.Errorf("start run %s: %w", name, err)
	}
	log.InfoContext(ctx, "termination step started", "execution_arn", aws.ToString(out.ExecutionArn))
	return nil
}

// maxExecutionName is the longest execution name Step Functions takes.
const maxExecutionName = 80

// RunName names a run of a step: the operation, attempt and round, and a random suffix. An
// Express start is not idempotent, so a name says what the run is, not that it is the only
// one: a second delivery of the step is a second run, which the claims make a no-op.
func RunName(s Step) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	suffix := fmt.Sprintf("-%d-r%d-%s", s.Attempt, s.Round, hex.EncodeToString(b[:]))
	id := s.ReclaimID
	if len(id)+len(suffix) > maxExecutionName {
		id = id[:maxExecutionName-len(suffix)]
	}
	return id + suffix
}
