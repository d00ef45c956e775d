package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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
)

// The runner fills two gaps of kumo outside product code: it polls SQS event source mappings
// (kumo records them but never polls) and fires one-time EventBridge Scheduler schedules (kumo
// stores them but never fires them).

// pollWait is the long poll of a mapping's ReceiveMessage; errorBackoff is the pause after a
// failed poll or firing round, so that a broken queue does not spin.
const (
	pollWait     = 2 * time.Second
	errorBackoff = time.Second
	fireInterval = 500 * time.Millisecond
)

// bridges runs the pollers and the schedule firer until stop.
type bridges struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startBridges starts workers pollers per mapping and, if fire, the schedule firer.
func startBridges(endpoint string, mappings []mappingSpec, workers int, fire bool, log *slog.Logger) *bridges {
	ctx, cancel := context.WithCancel(context.Background())
	b := &bridges{cancel: cancel}
	cfg := AWSConfig(endpoint)

	sqsClient, lambdaClient := sqs.NewFromConfig(cfg), lambda.NewFromConfig(cfg)

	for _, m := range mappings {
		p := &sqsPoller{m: m, sqs: sqsClient, lambda: lambdaClient, log: log.With("function", m.function, "queue", m.queueURL)}

		for range workers {
			b.wg.Go(func() { p.run(ctx) })
		}
	}

	if fire {
		f := newScheduleFirer(scheduler.NewFromConfig(cfg), eventbridge.NewFromConfig(cfg), log)
		b.wg.Go(func() { f.run(ctx, fireInterval) })
	}

	return b
}

// stop ends the workers and waits for them; an invocation in flight is abandoned, so its
// messages come back after their visibility timeout, as when a Lambda poller stops.
func (b *bridges) stop() {
	b.cancel()
	b.wg.Wait()
}

// sqsPoller does what Lambda's event source mapping does for a standard SQS queue: receive a
// batch, invoke the function synchronously with an SQS event, and delete what succeeded. What is
// not deleted becomes visible again after the queue's visibility timeout, so the queue's redrive
// policy moves a message that keeps failing to its dead-letter queue.
type sqsPoller struct {
	m      mappingSpec
	sqs    *sqs.Client
	lambda *lambda.Client
	log    *slog.Logger
}

func (p *sqsPoller) run(ctx context.Context) {
	for ctx.Err() == nil {
		if _, err := p.pollOnce(ctx, pollWait); err != nil && ctx.Err() == nil {
			p.log.Warn("event source mapping poll failed", "error", err)
			sleepCtx(ctx, errorBackoff)
		}
	}
}

// pollOnce receives one batch (up to the mapping's batch size), delivers it and deletes the
// succeeded messages. It returns how many messages it received.
func (p *sqsPoller) pollOnce(ctx context.Context, wait time.Duration) (int, error) {
	msgs, err := p.receive(ctx, wait)
	if err != nil || len(msgs) == 0 {
		return 0, err
	}

	failed, err := p.deliver(ctx, msgs)
	if err != nil {
		// Nothing is deleted: the batch comes back after the visibility timeout.
		return len(msgs), err
	}

	var done []sqstypes.Message

	for _, m := range msgs {
		if !failed[aws.ToString(m.MessageId)] {
			done = append(done, m)
		}
	}

	if len(failed) > 0 {
		p.log.Info("batch items failed; they return after the visibility timeout", "failed", len(failed), "succeeded", len(done))
	}

	return len(msgs), p.delete(ctx, done)
}

// receive gathers up to batchSize messages: SQS returns at most 10 a call, so a larger batch
// takes more calls, without waiting, as long as messages come.
func (p *sqsPoller) receive(ctx context.Context, wait time.Duration) ([]sqstypes.Message, error) {
	var msgs []sqstypes.Message

	for len(msgs) < p.m.batchSize {
		in := &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(p.m.queueURL),
			MaxNumberOfMessages:         int32(min(p.m.batchSize-len(msgs), maxSQSBatch)),
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		}
		if len(msgs) == 0 {
			in.WaitTimeSeconds = int32(wait / time.Second)
		}

		out, err := p.sqs.ReceiveMessage(ctx, in)
		if err != nil {
			if len(msgs) > 0 {
				break // deliver what was received; they would otherwise wait out their visibility
			}

			return nil, fmt.Errorf("receive from %s: %w", p.m.queueURL, err)
		}

		msgs = append(msgs, out.Messages...)

		if len(out.Messages) == 0 {
			break
		}
	}

	return msgs, nil
}

// deliver invokes the function with the batch and returns the ids of the failed messages.
func (p *sqsPoller) deliver(ctx context.Context, msgs []sqstypes.Message) (map[string]bool, error) {
	payload, err := json.Marshal(sqsEvent(p.m.queueARN, msgs))
	if err != nil {
		return nil, fmt.Errorf("encode SQS event: %w", err)
	}

	out, err := p.lambda.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(p.m.function), Payload: payload})
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", p.m.function, err)
	}

	all := func() map[string]bool {
		ids := make(map[string]bool, len(msgs))
		for _, m := range msgs {
			ids[aws.ToString(m.MessageId)] = true
		}

		return ids
	}

	if out.FunctionError != nil {
		p.log.Warn("function error: the whole batch is retried", "error", aws.ToString(out.FunctionError), "payload", truncate(string(out.Payload), 500))

		return all(), nil
	}

	if !p.m.reportFailures {
		return nil, nil
	}

	failed, ok := batchItemFailures(out.Payload, all())
	if !ok {
		// Lambda's rule: an answer it cannot read fails the whole batch.
		p.log.Warn("invalid batch item failures answer: the whole batch is retried", "payload", truncate(string(out.Payload), 500))

		return all(), nil
	}

	return failed, nil
}

// batchItemFailures reads a partial batch response. An empty answer, null or no failures means
// every message succeeded; an identifier that is empty or not in the batch makes it invalid.
func batchItemFailures(payload []byte, batch map[string]bool) (map[string]bool, bool) {
	trimmed := strings.TrimSpace(string(payload))
	if trimmed == "" || trimmed == "null" {
		return nil, true
	}

	var resp events.SQSEventResponse
	if err := json.Unmarshal(payload, &resp); err != nil {
		return nil, false
	}

	failed := map[string]bool{}

	for _, f := range resp.BatchItemFailures {
		if f.ItemIdentifier == "" || !batch[f.ItemIdentifier] {
			return nil, false
		}

		failed[f.ItemIdentifier] = true
	}

	return failed, true
}

// sqsEvent builds the event Lambda sends for a batch of SQS messages.
func sqsEvent(queueARN string, msgs []sqstypes.Message) events.SQSEvent {
	ev := events.SQSEvent{Records: make([]events.SQSMessage, len(msgs))}

	for i, m := range msgs {
		rec := events.SQSMessage{
			MessageId:              aws.ToString(m.MessageId),
			ReceiptHandle:          aws.ToString(m.ReceiptHandle),
			Body:                   aws.ToString(m.Body),
			Md5OfBody:              aws.ToString(m.MD5OfBody),
			Md5OfMessageAttributes: aws.ToString(m.MD5OfMessageAttributes),
			Attributes:             m.Attributes,
			MessageAttributes:      map[string]events.SQSMessageAttribute{},
			EventSourceARN:         queueARN,
			EventSource:            "aws:sqs",
			AWSRegion:              region,
		}

		for name, a := range m.MessageAttributes {
			rec.MessageAttributes[name] = events.SQSMessageAttribute{
				StringValue: a.StringValue, BinaryValue: a.BinaryValue,
				StringListValues: a.StringListValues, BinaryListValues: a.BinaryListValues,
				DataType: aws.ToString(a.DataType),
			}
		}

		ev.Records[i] = rec
	}

	return ev
}

// delete removes the messages, 10 per call. A message whose delete fails comes back after its
// visibility timeout: delivery is at least once, on AWS as here.
func (p *sqsPoller) delete(ctx context.Context, msgs []sqstypes.Message) error {
	var errs []error

	for start := 0; start < len(msgs); start += maxSQSBatch {
		chunk := msgs[start:min(start+maxSQSBatch, len(msgs))]
		entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(chunk))

		for i, m := range chunk {
			entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle}
		}

		out, err := p.sqs.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(p.m.queueURL), Entries: entries})
		if err != nil {
			errs = append(errs, fmt.Errorf("delete %d messages from %s: %w", len(chunk), p.m.queueURL, err))

			continue
		}

		for _, f := range out.Failed {
			errs = append(errs, fmt.Errorf("delete message %s from %s: %s %s", aws.ToString(f.Id), p.m.queueURL, aws.ToString(f.Code), aws.ToString(f.Message)))
		}
	}

	return errors.Join(errs...)
}

// scheduleFirer does what EventBridge Scheduler does with a one-time schedule whose target is an
// event bus: when at(...) is due, it puts the target's Input as the event detail, with the
// target's EventBridgeParameters source and detail type, on the bus; then, with
// ActionAfterCompletion DELETE, it deletes the schedule. A failed put is retried on the next
// round (Scheduler retries too), so a firing is delivered at least once.
type scheduleFirer struct {
	scheduler *scheduler.Client
	events    *eventbridge.Client
	log       *slog.Logger
	now       func() time.Time

	fired  map[string]bool // schedule key+version -> put on the bus
	warned map[string]bool // schedule key+version -> told it cannot be fired here
}

func newScheduleFirer(s *scheduler.Client, e *eventbridge.Client, log *slog.Logger) *scheduleFirer {
	return &scheduleFirer{scheduler: s, events: e, log: log, now: time.Now, fired: map[string]bool{}, warned: map[string]bool{}}
}

func (f *scheduleFirer) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()

	for {
		if err := f.tick(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("schedule round failed", "error", err)
		}

		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// tick fires every enabled one-time schedule that is due and not fired yet, in every group.
func (f *scheduleFirer) tick(ctx context.Context) error {
	var errs []error

	pages := scheduler.NewListSchedulesPaginator(f.scheduler, &scheduler.ListSchedulesInput{State: schedtypes.ScheduleStateEnabled})

	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list schedules: %w", err)
		}

		for _, s := range page.Schedules {
			if s.State != schedtypes.ScheduleStateEnabled {
				continue
			}

			if err := f.consider(ctx, aws.ToString(s.GroupName), aws.ToString(s.Name)); err != nil {
				errs = append(errs, err)
			}
		}
	}

	return errors.Join(errs...)
}

func (f *scheduleFirer) consider(ctx context.Context, group, name string) error {
	s, err := f.scheduler.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(name), GroupName: aws.String(group)})

	var notFound *schedtypes.ResourceNotFoundException
	if errors.As(err, &notFound) {
		return nil // deleted since the listing
	}

	if err != nil {
		return fmt.Errorf("get schedule %s/%s: %w", group, name, err)
	}

	// An update re-arms a schedule: its expression or modification time is part of the key.
	key := fmt.Sprintf("%s/%s@%s@%d", group, name, aws.ToString(s.ScheduleExpression), aws.ToTime(s.LastModificationDate).UnixNano())

	at, err := parseAt(aws.ToString(s.ScheduleExpression), aws.ToString(s.ScheduleExpressionTimezone))
	if err != nil {
		f.warnOnce(key, "schedule not fired locally: only one-time at(...) schedules are", "schedule", group+"/"+name, "error", err)

		return nil
	}

	if at.After(f.now()) {
		return nil
	}

	if !f.fired[key] {
		if err := f.fire(ctx, s); err != nil {
			var unsupported errUnsupportedTarget
			if errors.As(err, &unsupported) {
				f.warnOnce(key, "schedule not fired locally", "schedule", group+"/"+name, "error", err)

				return nil
			}

			return fmt.Errorf("fire schedule %s/%s: %w", group, name, err)
		}

		f.fired[key] = true
		f.log.Info("fired schedule", "schedule", group+"/"+name, "at", at, "target", aws.ToString(s.Target.Arn))
	}

	if s.ActionAfterCompletion != schedtypes.ActionAfterCompletionDelete {
		return nil
	}

	_, err = f.scheduler.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{Name: aws.String(name), GroupName: aws.String(group)})
	if err != nil && !errors.As(err, &notFound) {
		// Fired already (the key says so); the delete is tried again next round.
		return fmt.Errorf("delete fired schedule %s/%s: %w", group, name, err)
	}

	return nil
}

type errUnsupportedTarget struct{ arn string }

func (e errUnsupportedTarget) Error() string {
	return "the local stack fires schedules only at event bus targets, not " + e.arn
}

// fire puts the schedule's event on its target bus.
func (f *scheduleFirer) fire(ctx context.Context, s *scheduler.GetScheduleOutput) error {
	t := s.Target
	if t == nil || !strings.Contains(aws.ToString(t.Arn), ":event-bus/") || t.EventBridgeParameters == nil {
		arn := ""
		if t != nil {
			arn = aws.ToString(t.Arn)
		}

		return errUnsupportedTarget{arn: arn}
	}

	detail := valueOr(aws.ToString(t.Input), "{}")

	out, err := f.events.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		// kumo matches rules on the bus name only; AWS takes the name or the ARN.
		EventBusName: aws.String(eventBusName(aws.ToString(t.Arn))),
		Source:       t.EventBridgeParameters.Source,
		DetailType:   t.EventBridgeParameters.DetailType,
		Detail:       aws.String(detail),
		Time:         aws.Time(f.now()),
	}}})
	if err != nil {
		return fmt.Errorf("put event: %w", err)
	}

	if out.FailedEntryCount > 0 {
		code, msg := "", ""
		if len(out.Entries) > 0 {
			code, msg = aws.ToString(out.Entries[0].ErrorCode), aws.ToString(out.Entries[0].ErrorMessage)
		}

		return fmt.Errorf("put event: entry failed: %s %s", code, msg)
	}

	return nil
}

func (f *scheduleFirer) warnOnce(key, msg string, args ...any) {
	if f.warned[key] {
		return
	}

	f.warned[key] = true
	f.log.Warn(msg, args...)
}

// parseAt reads a one-time schedule expression, at(yyyy-mm-ddThh:mm:ss), in its time zone
// (UTC when none is given).
func parseAt(expr, tz string) (time.Time, error) {
	inner, ok := strings.CutPrefix(strings.TrimSpace(expr), "at(")
	if !ok {
		return time.Time{}, fmt.Errorf("expression %q is not at(...)", expr)
	}

	inner, ok = strings.CutSuffix(inner, ")")
	if !ok {
		return time.Time{}, fmt.Errorf("expression %q is not at(...)", expr)
	}

	loc := time.UTC

	if tz != "" && tz != "UTC" {
		l, err := time.LoadLocation(tz)
		if err != nil {
			return time.Time{}, fmt.Errorf("time zone %q: %w", tz, err)
		}

		loc = l
	}

	at, err := time.ParseInLocation("2006-01-02T15:04:05", inner, loc)
	if err != nil {
		return time.Time{}, fmt.Errorf("expression %q: %w", expr, err)
	}

	return at, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}

	return s[:n] + "..."
}
