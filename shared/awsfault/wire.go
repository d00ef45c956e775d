package awsfault

import (
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Answer is an error as AWS puts it on the wire: the HTTP status and the JSON body. The
// injector answers SDK calls with it, and the local stack's quota layer (localstack/quota)
// answers throttled requests with the same bytes, so both reach the SDK as AWS's own.
type Answer struct {
	Status int
	Body   map[string]any
}

// dynamoNamespace is the coral namespace DynamoDB puts before its error names.
const dynamoNamespace = "com.amazonaws.dynamodb.v20120810#"

// AWS's messages and cancellation reason codes for throughput errors.
const (
	ProvisionedThroughputMessage = "The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API."
	DynamoThrottlingMessage      = "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling your table or index so please try again shortly."

	ReasonThrottlingError               = "ThrottlingError"
	ReasonProvisionedThroughputExceeded = "ProvisionedThroughputExceeded"
)

// ThrottlingAnswer is ThrottlingException as service (an SDK service id) answers it: DynamoDB's
// on-demand throttle in its coral namespace, every JSON service's "Rate exceeded" otherwise
// (Step Functions, EventBridge, Scheduler). HTTP 400; the SDK retries it.
func ThrottlingAnswer(service string) Answer {
	if service == dynamodb.ServiceID {
		return Answer{400, map[string]any{"__type": dynamoNamespace + "ThrottlingException", "message": DynamoThrottlingMessage}}
	}
	return Answer{400, map[string]any{"__type": "ThrottlingException", "message": "Rate exceeded"}}
}

// ProvisionedThroughputAnswer is DynamoDB's throttle of a provisioned table or index.
func ProvisionedThroughputAnswer() Answer {
	return Answer{400, map[string]any{"__type": dynamoNamespace + "ProvisionedThroughputExceededException", "message": ProvisionedThroughputMessage}}
}

// CancelledAnswer is TransactionCanceledException for a transaction of n actions: the reason
// code in codes for each action it names, "None" for the others, as AWS reports it. The SDK
// does not retry it.
func CancelledAnswer(n int, codes map[int]string, msg string) Answer {
	reasons := make([]map[string]string, n)
	names := make([]string, n)
	for k := range reasons {
		reasons[k], names[k] = map[string]string{"Code": "None"}, "None"
		if code, ok := codes[k]; ok {
			reasons[k], names[k] = map[string]string{"Code": code, "Message": msg}, code
		}
	}
	return Answer{400, map[string]any{
		"__type":              dynamoNamespace + "TransactionCanceledException",
		"Message":             "Transaction cancelled, please refer cancellation reasons for specific reasons [" + strings.Join(names, ", ") + "]",
		"CancellationReasons": reasons,
	}}
}
