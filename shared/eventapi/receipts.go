package eventapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Receipts proves that records came out of the intake queue: only a receive of the queue
// makes a receipt handle the queue recognises, and the queue's policy lets only this
// function's role receive. A record put together by whoever may invoke the function directly
// carries no such handle, whatever its other fields say.
type Receipts interface {
	// Check answers, for each record, nil if the queue holds it in flight under its receipt
	// handle now, an error wrapping ErrNotReceived if the queue does not recognise the
	// handle, or another error if it could not tell (the record is tried again). A failed
	// call is returned as the error: no record could be checked.
	Check(ctx context.Context, recs []events.SQSMessage) ([]error, error)
}

// ErrNotReceived: the queue does not recognise the record's receipt handle.
var ErrNotReceived = errors.New("not received from the intake queue")

// SQSVisibility is the part of the SQS client QueueReceipts uses.
type SQSVisibility interface {
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// QueueReceipts checks receipt handles against the queue by renewing each record's
// visibility timeout to the queue's own (ChangeMessageVisibilityBatch): a handle the queue
// handed out and still holds in flight is accepted; any other fails its entry. Renewing
// costs the record nothing: a record that fails later is seen again after the queue's
// usual wait, counted from the check rather than the receive.
type QueueReceipts struct {
	Client   SQSVisibility
	QueueURL string

	mu         sync.Mutex
	visibility int32 // the queue's VisibilityTimeout (seconds), read once
}

// notReceived are the entry failures that say the handle is not one the queue holds in
// flight: malformed or never issued (ReceiptHandleIsInvalid), issued but no longer current
// (InvalidParameterValue: "Message does not exist or is not available for visibility timeout
// change", as AWS answers a deleted message's handle), or its message visible again.
var notReceived = map[string]bool{"ReceiptHandleIsInvalid": true, "InvalidParameterValue": true, "MessageNotInflight": true}

// Check implements Receipts, ten records a call (SQS's batch limit).
func (q *QueueReceipts) Check(ctx context.Context, recs []events.SQSMessage) ([]error, error) {
	visibility, err := q.queueVisibility(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]error, len(recs))
	for start := 0; start < len(recs); start += 10 {
		chunk := recs[start:min(start+10, len(recs))]
		in := &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(q.QueueURL)}
		for i, rec := range chunk {
			if rec.ReceiptHandle == "" { // SQS refuses the whole call for an empty one
				out[start+i] = fmt.Errorf("message %s has no receipt handle: %w", rec.MessageId, ErrNotReceived)
				continue
			}
			in.Entries = append(in.Entries, types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(start + i)), ReceiptHandle: aws.String(rec.ReceiptHandle), VisibilityTimeout: visibility,
			})
		}
		if len(in.Entries) == 0 {
			continue
		}
		res, err := q.Client.ChangeMessageVisibilityBatch(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("check receipt handles: %w", err)
		}
		answered := map[int]bool{}
		for _, ok := range res.Successful {
			i, _ := strconv.Atoi(aws.ToString(ok.Id))
			answered[i] = true
		}
		for _, f := range res.Failed {
			i, err := strconv.Atoi(aws.ToString(f.Id))
			if err != nil || i < start || i >= start+len(chunk) {
				continue
			}
			answered[i] = true
			code := aws.ToString(f.Code)
			if notReceived[code] {
				out[i] = fmt.Errorf("message %s: the queue answers %s: %w", recs[i].MessageId, code, ErrNotReceived)
			} else {
				out[i] = fmt.Errorf("check receipt of message %s: %s: %s", recs[i].MessageId, code, aws.ToString(f.Message))
			}
		}
		for _, e := range in.Entries {
			if i, _ := strconv.Atoi(aws.ToString(e.Id)); !answered[i] {
				out[i] = fmt.Errorf("check receipt of message %s: no answer", recs[i].MessageId)
			}
		}
	}
	return out, nil
}

// queueVisibility reads the queue's visibility timeout once.
func (q *QueueReceipts) queueVisibility(ctx context.Context) (int32, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.visibility > 0 {
		return q.visibility, nil
	}
	res, err := q.Client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(q.QueueURL), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout},
	})
	if err != nil {
		return 0, fmt.Errorf("read the intake queue's visibility timeout: %w", err)
	}
	v, err := strconv.Atoi(res.Attributes[string(types.QueueAttributeNameVisibilityTimeout)])
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("the intake queue's visibility timeout %q", res.Attributes[string(types.QueueAttributeNameVisibilityTimeout)])
	}
	q.visibility = int32(v)
	return q.visibility, nil
}
