package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	schedtypes "github.com/aws/aws-sdk-go-v2/service/scheduler/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

type cfnQueue struct {
	QueueName                     string
	VisibilityTimeout             *cfnInt
	MessageRetentionPeriod        *cfnInt
	DelaySeconds                  *cfnInt
	MaximumMessageSize            *cfnInt
	ReceiveMessageWaitTimeSeconds *cfnInt
	FifoQueue                     cfnBool
	ContentBasedDeduplication     cfnBool
	RedrivePolicy                 any // an object, or its JSON as a string
	KmsMasterKeyId                string
	SqsManagedSseEnabled          cfnBool
}

// provisionQueue creates an SQS queue with the attributes kumo honours (visibility, retention,
// delay, size, wait, FIFO, redrive to a dead-letter queue). Encryption settings are accepted and
// dropped: kumo stores messages in memory and has no KMS.
func provisionQueue(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var q cfnQueue
	if err := decodeProps(props, &q); err != nil {
		return nil, err
	}

	name := q.QueueName
	if name == "" {
		name = generatedName(p.stackName, id, 80)
		if q.FifoQueue {
			name = generatedName(p.stackName, id, 75) + ".fifo"
		}
	}

	attrs := map[string]string{}

	for key, v := range map[string]*cfnInt{
		"VisibilityTimeout":             q.VisibilityTimeout,
		"MessageRetentionPeriod":        q.MessageRetentionPeriod,
		"DelaySeconds":                  q.DelaySeconds,
		"MaximumMessageSize":            q.MaximumMessageSize,
		"ReceiveMessageWaitTimeSeconds": q.ReceiveMessageWaitTimeSeconds,
	} {
		if v != nil {
			attrs[key] = strconv.FormatInt(int64(*v), 10)
		}
	}

	if q.FifoQueue {
		attrs["FifoQueue"] = "true"
	}

	if q.ContentBasedDeduplication {
		attrs["ContentBasedDeduplication"] = "true"
	}

	switch rp := q.RedrivePolicy.(type) {
	case nil:
	case string:
		attrs["RedrivePolicy"] = rp
	default:
		data, err := json.Marshal(rp)
		if err != nil {
			return nil, fmt.Errorf("queue %s: encode RedrivePolicy: %w", name, err)
		}

		attrs["RedrivePolicy"] = string(data)
	}

	out, err := p.sqs.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		return nil, fmt.Errorf("create queue %s: %w", name, err)
	}

	queueURL := aws.ToString(out.QueueUrl)

	got, err := p.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: out.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return nil, fmt.Errorf("read queue %s ARN: %w", name, err)
	}

	arn := got.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]
	p.queueURLs[arn] = queueURL
	p.log.Info("created queue", "queue", name, "redrive", attrs["RedrivePolicy"])

	// Ref of a queue is its URL.
	return &physical{ref: queueURL, attrs: map[string]any{"Arn": arn, "QueueName": name, "QueueUrl": queueURL}}, nil
}

// provisionQueuePolicy applies the policy to its queues. kumo stores it but evaluates no
// policy, so e.g. a deny of non-TLS access does not stop the local stack's plain HTTP.
func provisionQueuePolicy(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var qp struct {
		PolicyDocument any
		Queues         []string
	}
	if err := decodeProps(props, &qp); err != nil {
		return nil, err
	}

	doc, err := json.Marshal(qp.PolicyDocument)
	if err != nil {
		return nil, fmt.Errorf("queue policy %s: encode PolicyDocument: %w", id, err)
	}

	for _, queueURL := range qp.Queues {
		if _, err := p.sqs.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{
			QueueUrl: aws.String(queueURL), Attributes: map[string]string{"Policy": string(doc)},
		}); err != nil {
			return nil, fmt.Errorf("set policy of queue %s: %w", queueURL, err)
		}
	}

	return &physical{ref: generatedName(p.stackName, id, 64), attrs: map[string]any{}}, nil
}

// mappingSpec is an event source mapping from an SQS queue, which the runner polls because
// kumo records mappings but never polls them.
type mappingSpec struct {
	uuid           string
	function       string
	queueARN       string
	queueURL       string
	batchSize      int
	window         int  // MaximumBatchingWindowInSeconds
	reportFailures bool // FunctionResponseTypes has ReportBatchItemFailures
}

type cfnEventSourceMapping struct {
	FunctionName                   string
	EventSourceArn                 string
	BatchSize                      cfnInt
	MaximumBatchingWindowInSeconds cfnInt
	Enabled                        *cfnBool
	FunctionResponseTypes          []string
}

// maxSQSBatch is the largest batch Lambda takes from a standard queue without a batching window.
const maxSQSBatch = 10

func provisionEventSourceMapping(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var m cfnEventSourceMapping
	if err := decodeProps(props, &m); err != nil {
		return nil, err
	}

	in := &lambda.CreateEventSourceMappingInput{
		FunctionName:   aws.String(m.FunctionName),
		EventSourceArn: optString(m.EventSourceArn),
	}
	if m.BatchSize > 0 {
		in.BatchSize = aws.Int32(int32(m.BatchSize))
	}

	if m.MaximumBatchingWindowInSeconds > 0 {
		in.MaximumBatchingWindowInSeconds = aws.Int32(int32(m.MaximumBatchingWindowInSeconds))
	}

	if m.Enabled != nil {
		in.Enabled = aws.Bool(bool(*m.Enabled))
	}

	out, err := p.lambda.CreateEventSourceMapping(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("create event source mapping of %s: %w", m.FunctionName, err)
	}

	uuid := aws.ToString(out.UUID)
	queueURL, isQueue := p.queueURLs[m.EventSourceArn]

	switch {
	case !isQueue:
		p.log.Warn("event source mapping from a source other than a queue of this stack: nothing polls it locally",
			"mapping", id, "source", m.EventSourceArn)
	case m.Enabled != nil && !bool(*m.Enabled):
		p.log.Info("event source mapping disabled: not polled", "mapping", id)
	default:
		spec := mappingSpec{
			uuid: uuid, function: functionNameOf(m.FunctionName), queueARN: m.EventSourceArn, queueURL: queueURL,
			batchSize: int(valueOr(m.BatchSize, maxSQSBatch)), window: int(m.MaximumBatchingWindowInSeconds),
		}

		for _, t := range m.FunctionResponseTypes {
			if t == "ReportBatchItemFailures" {
				spec.reportFailures = true
			}
		}

		p.mappings = append(p.mappings, spec)
		p.log.Info("created event source mapping; the runner polls it", "function", spec.function, "queue", queueURL,
			"batchSize", spec.batchSize, "reportBatchItemFailures", spec.reportFailures)
	}

	return &physical{ref: uuid, attrs: map[string]any{"Id": uuid, "EventSourceMappingArn": aws.ToString(out.EventSourceMappingArn)}}, nil
}

// functionNameOf accepts a function name or ARN (arn:aws:lambda:region:account:function:name[:qualifier]).
func functionNameOf(nameOrARN string) string {
	parts := strings.Split(nameOrARN, ":")
	if len(parts) >= 7 && parts[5] == "function" {
		return parts[6]
	}

	return nameOrARN
}

func provisionScheduleGroup(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var g struct{ Name string }
	if err := decodeProps(props, &g); err != nil {
		return nil, err
	}

	name := valueOr(g.Name, generatedName(p.stackName, id, 64))

	out, err := p.scheduler.CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(name)})

	var conflict *schedtypes.ConflictException
	if errors.As(err, &conflict) {
		// Only the default group exists before provisioning; a template naming it gets it.
		got, gerr := p.scheduler.GetScheduleGroup(ctx, &scheduler.GetScheduleGroupInput{Name: aws.String(name)})
		if gerr != nil {
			return nil, fmt.Errorf("read schedule group %s: %w", name, gerr)
		}

		p.schedules = true

		return &physical{ref: name, attrs: map[string]any{"Arn": aws.ToString(got.Arn)}}, nil
	}

	if err != nil {
		return nil, fmt.Errorf("create schedule group %s: %w", name, err)
	}

	p.schedules = true
	p.log.Info("created schedule group; the runner fires its one-time schedules", "group", name)

	return &physical{ref: name, attrs: map[string]any{"Arn": aws.ToString(out.ScheduleGroupArn)}}, nil
}
