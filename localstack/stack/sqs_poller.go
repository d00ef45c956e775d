package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

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
