package awsfault

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// answer synthesises AWS's HTTP answer for a fault.
func (i *Injector) answer(service, op string, params any, f Fault, variant bool) middleware.DeserializeOutput {
	const ddb = "com.amazonaws.dynamodb.v20120810#"
	switch f {
	case TransactionConflict:
		if isTransact(op) {
			return i.cancelled(params, "TransactionConflict", "Transaction is ongoing for the item")
		}
		return i.errorResponse(400, map[string]any{"__type": ddb + "TransactionConflictException",
			"message": "Transaction is ongoing for the item"})
	case ProvisionedThroughputExceeded:
		if isTransact(op) && variant {
			return i.cancelled(params, ReasonProvisionedThroughputExceeded, ProvisionedThroughputMessage)
		}
		return i.write(ProvisionedThroughputAnswer())
	case Throttling, StartThrottling:
		if service == dynamodb.ServiceID && isTransact(op) && variant {
			return i.cancelled(params, ReasonThrottlingError, DynamoThrottlingMessage)
		}
		return i.write(ThrottlingAnswer(service))
	case AccessDenied:
		return i.accessDenied(service, op)
	case ExecutionLimitExceeded:
		return i.errorResponse(400, map[string]any{"__type": "ExecutionLimitExceeded",
			"message": "The maximum number of running executions has been reached"})
	case ExecutionAlreadyExists:
		arn := i.close(params)
		return i.errorResponse(400, map[string]any{"__type": "ExecutionAlreadyExists",
			"message": fmt.Sprintf("Execution Already Exists: '%s'", arn)})
	}
	return i.errorResponse(500, map[string]any{"__type": "InternalServerError", "message": "awsfault: unknown fault " + string(f)})
}

// accessDenied is IAM's refusal as the service words it. DynamoDB names the error in the
// coral namespace, the JSON 1.1 services bare; the SDK strips the namespace either way.
func (i *Injector) accessDenied(service, op string) middleware.DeserializeOutput {
	action := iamPrefix(service) + ":" + op
	typ := "AccessDeniedException"
	if service == dynamodb.ServiceID {
		typ = "com.amazon.coral.service#AccessDeniedException"
	}
	return i.errorResponse(400, map[string]any{"__type": typ,
		"Message": "User: arn:aws:sts::000000000000:assumed-role/awsfault/injected is not authorized to perform: " +
			action + " because no identity-based policy allows the " + action + " action"})
}

// iamPrefix is the IAM action prefix of an SDK service id ("Secrets Manager" -> "secretsmanager").
func iamPrefix(service string) string {
	switch service {
	case sfn.ServiceID:
		return "states"
	case "EventBridge":
		return "events"
	}
	return strings.ToLower(strings.ReplaceAll(service, " ", ""))
}

// cancelled is TransactionCanceledException with reason code on one action (chosen at
// random) and "None" on the others, as AWS reports it.
func (i *Injector) cancelled(params any, code, msg string) middleware.DeserializeOutput {
	n := 1
	switch p := params.(type) {
	case *dynamodb.TransactWriteItemsInput:
		n = max(len(p.TransactItems), 1)
	case *dynamodb.TransactGetItemsInput:
		n = max(len(p.TransactItems), 1)
	}
	i.mu.Lock()
	at := i.rnd.Intn(n)
	i.mu.Unlock()
	return i.write(CancelledAnswer(n, map[int]string{at: code}, msg))
}

func (i *Injector) write(a Answer) middleware.DeserializeOutput {
	return i.errorResponse(a.Status, a.Body)
}

func (i *Injector) errorResponse(status int, body map[string]any) middleware.DeserializeOutput {
	return i.response(status, body)
}

func (i *Injector) response(status int, body map[string]any) middleware.DeserializeOutput {
	b, _ := json.Marshal(body)
	i.mu.Lock()
	i.seq++
	id := "awsfault-" + strconv.Itoa(i.seq)
	i.mu.Unlock()
	h := http.Header{}
	h.Set("Content-Type", "application/x-amz-json-1.0")
	h.Set("X-Amzn-Requestid", id)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	return middleware.DeserializeOutput{RawResponse: &smithyhttp.Response{Response: &http.Response{
		StatusCode: status, Status: strconv.Itoa(status) + " " + http.StatusText(status),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)),
	}}}
}

// timeoutError is net/http's error for an answer that did not arrive in time.
type timeoutError struct{}

func (timeoutError) Error() string   { return "net/http: timeout awaiting response headers" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
