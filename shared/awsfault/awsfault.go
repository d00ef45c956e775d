// Package awsfault injects the faults AWS returns and the local emulator never does
// (transaction conflicts, throttling, answers lost or turned into server errors after a
// write was applied, closed Step Functions executions) into AWS SDK clients, as an APIOptions middleware.
//
// Faults are injected as the service's wire answer (an HTTP response with the error body
// AWS sends), just above the HTTP transport: the SDK deserialises them into its real error
// types and its retryer sees them exactly as it would see AWS's, so what it retries on AWS it
// retries here (throttling, timeouts) and what it returns on AWS it returns here
// (TransactionCanceledException, TransactionConflictException, ExecutionAlreadyExists).
//
// It is for tests and the local stack only: shared/config refuses to install it unless the
// endpoint is a loopback address.
package awsfault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Fault is a kind of answer AWS gives that the emulator does not.
type Fault string

const (
	// TransactionConflict: another transaction held an item. TransactWriteItems and
	// TransactGetItems get TransactionCanceledException with one reason
	// "TransactionConflict" (the others "None"); PutItem, UpdateItem and DeleteItem get
	// TransactionConflictException. Nothing is applied; the SDK does not retry either.
	TransactionConflict Fault = "TransactionConflict"
	// ProvisionedThroughputExceeded: ProvisionedThroughputExceededException (the SDK retries
	// it); inside a transaction AWS may instead cancel it with a
	// "ProvisionedThroughputExceeded" reason, which the SDK does not retry: half of the
	// injected transaction faults take that form.
	ProvisionedThroughputExceeded Fault = "ProvisionedThroughputExceeded"
	// Throttling: ThrottlingException, for any operation of any service (the SDK retries it);
	// transactions are half the time cancelled with a "ThrottlingError" reason instead.
	Throttling Fault = "Throttling"
	// AmbiguousTimeout: the call reaches the service and is applied, then the answer is
	// lost: the caller gets the transport timeout the HTTP client reports, which the SDK
	// retries (the retry then meets the state the first attempt left).
	AmbiguousTimeout Fault = "AmbiguousTimeout"
	// InternalServerError: a DynamoDB write (TransactWriteItems, PutItem, UpdateItem,
	// DeleteItem) is applied, then answered with HTTP 500 InternalServerError, which AWS
	// documents as "the outcome may or may not have been applied". The SDK retries it (the
	// retry meets the state the first attempt left). A 500 with nothing applied behind it
	// reads the same to the caller, so the injector gives the harder case.
	InternalServerError Fault = "InternalServerError"
	// ExecutionAlreadyExists: StartExecution answers as AWS does when an execution of that
	// name has already closed (names stay taken for 90 days). The name is then closed for
	// good: every later StartExecution of it gets the same answer and DescribeExecution of it
	// reports FAILED.
	ExecutionAlreadyExists Fault = "ExecutionAlreadyExists"
	// StartThrottling: ThrottlingException on StartExecution (the SDK retries it).
	StartThrottling Fault = "StartThrottling"
	// ExecutionLimitExceeded: StartExecution answers ExecutionLimitExceeded, as AWS does when
	// the account's open executions are at their quota. Nothing is started and the SDK does
	// not retry it, so the start fails: the fault that makes a StartExecution fail outright.
	ExecutionLimitExceeded Fault = "ExecutionLimitExceeded"
	// AccessDenied: AccessDeniedException (HTTP 400), what any operation of any service
	// answers when the caller's IAM policy does not allow it (the emulator enforces no IAM).
	// Nothing is applied. The SDK does not retry it: its retryer retries this code only as a
	// clock-skew error, when the answer's Date header is far from the signing time, and the
	// injected answer carries no Date.
	AccessDenied Fault = "AccessDenied"
)

var faults = []Fault{TransactionConflict, ProvisionedThroughputExceeded, Throttling, AmbiguousTimeout, InternalServerError,
	ExecutionAlreadyExists, StartThrottling, ExecutionLimitExceeded, AccessDenied}

// Rule injects Fault into a share Rate (0..1) of the attempts of an operation.
type Rule struct {
	// Operation is the SDK operation name ("TransactWriteItems", "UpdateItem", "PutItem",
	// "Query", "StartExecution", ...); "" matches any operation the fault applies to.
	Operation string
	Fault     Fault
	Rate      float64
	// Max, if not 0, stops the rule once it has drawn Max faults: with Rate 1, exactly the
	// first Max attempts it matches get the fault.
	Max int
}

func (r Rule) String() string {
	op := r.Operation
	if op == "" {
		op = "*"
	}
	return fmt.Sprintf("%s:%s=%g", op, r.Fault, r.Rate)
}

// Injector decides, attempt by attempt, whether an SDK call gets a fault. It is safe for
// concurrent use by any number of clients.
type Injector struct {
	rules []Rule
	// Log, if set, gets one line per injected fault ("awsfault injected", with the fault and
	// the operation): a process's counts die with it, its log lines let a run count faults
	// across every process of the local stack.
	Log *slog.Logger

	mu     sync.Mutex
	rnd    *rand.Rand
	counts map[Fault]int
	used   []int                      // faults injected by each rule, by index
	closed map[string]closedExecution // execution ARN -> the run that "already exists"
	seq    int
}

type closedExecution struct {
	StateMachineArn, Name, Input string
	Start                        time.Time
}

// New returns an injector that applies rules with a deterministic random source.
func New(seed int64, rules ...Rule) *Injector {
	return &Injector{
		rules: append([]Rule(nil), rules...), rnd: rand.New(rand.NewSource(seed)),
		counts: map[Fault]int{}, closed: map[string]closedExecution{}, used: make([]int, len(rules)),
	}
}

// Rules returns the injector's rules.
func (i *Injector) Rules() []Rule { return append([]Rule(nil), i.rules...) }

// Count returns how many faults of a kind were injected so far.
func (i *Injector) Count(f Fault) int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.counts[f]
}

// Counts returns how many faults of each kind were injected so far.
func (i *Injector) Counts() map[Fault]int {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make(map[Fault]int, len(i.counts))
	for f, n := range i.counts {
		out[f] = n
	}
	return out
}

type paramsKey struct{}

// APIOption adds the injector to an SDK client's middleware stack: add it to
// Options.APIOptions (or aws.Config.APIOptions for every client).
func (i *Injector) APIOption(stack *middleware.Stack) error {
	// The operation's input, for faults shaped by it (reasons per transaction action,
	// execution names); stack values reach every step of every attempt.
	err := stack.Initialize.Add(middleware.InitializeMiddlewareFunc("awsfault.Params",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			return next.HandleInitialize(middleware.WithStackValue(ctx, paramsKey{}, in.Parameters), in)
		}), middleware.After)
	if err != nil {
		return fmt.Errorf("add fault injector: %w", err)
	}
	// Last in the deserialize step, so just above the transport and inside the retry loop:
	// each attempt draws anew, and a synthesised answer goes through the SDK's own error
	// deserialisation, checksum and retry classification.
	err = stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("awsfault.Inject", i.handle), middleware.After)
	if err != nil {
		return fmt.Errorf("add fault injector: %w", err)
	}
	return nil
}

func (i *Injector) handle(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
	service, op := middleware.GetServiceID(ctx), middleware.GetOperationName(ctx)
	params := middleware.GetStackValue(ctx, paramsKey{})
	req, _ := in.Request.(*smithyhttp.Request)

	if ans, ok := i.closedAnswer(op, params); ok {
		return ans, middleware.Metadata{}, nil
	}
	f, variant, ok := i.draw(service, op)
	if !ok {
		return next.HandleDeserialize(ctx, in)
	}
	if f == AmbiguousTimeout || f == InternalServerError {
		out, md, err := next.HandleDeserialize(ctx, in)
		r, ok := out.RawResponse.(*smithyhttp.Response)
		if err != nil || !ok || r.StatusCode < 200 || r.StatusCode > 299 {
			return out, md, err // the call failed anyway: nothing was applied, the answer stands
		}
		i.record(ctx, f, op)
		if r.Body != nil {
			_, _ = io.Copy(io.Discard, r.Body)
			_ = r.Body.Close()
		}
		if f == InternalServerError {
			return i.errorResponse(500, map[string]any{"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
				"message": "Internal server error"}), md, nil
		}
		u := ""
		if req != nil && req.URL != nil {
			u = req.URL.String()
		}
		// What net/http returns when the answer does not come back in time, wrapped as the
		// SDK's transport handler wraps it.
		return middleware.DeserializeOutput{RawResponse: &smithyhttp.Response{Response: &http.Response{
				StatusCode: 0, Header: http.Header{}, Body: http.NoBody,
			}}}, md, &smithyhttp.RequestSendError{Err: &url.Error{
				Op: "Post", URL: u, Err: timeoutError{},
			}}
	}
	i.record(ctx, f, op)
	return i.answer(service, op, params, f, variant), middleware.Metadata{}, nil
}

func (i *Injector) record(ctx context.Context, f Fault, op string) {
	i.mu.Lock()
	i.counts[f]++
	i.mu.Unlock()
	if i.Log != nil {
		i.Log.InfoContext(ctx, "awsfault injected", "fault", string(f), "operation", op)
	}
}

// draw picks the fault for one attempt, if any: rules are tried in order, each with its own
// draw. variant picks between the forms AWS gives the same fault.
func (i *Injector) draw(service, op string) (Fault, bool, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for k, r := range i.rules {
		if r.Operation != "" && r.Operation != op || !applies(r.Fault, service, op) || r.Max > 0 && i.used[k] >= r.Max {
			continue
		}
		if r.Rate <= 0 || i.rnd.Float64() >= r.Rate {
			continue
		}
		i.used[k]++
		return r.Fault, i.rnd.Intn(2) == 0, true
	}
	return "", false, false
}

func applies(f Fault, service, op string) bool {
	switch f {
	case TransactionConflict:
		return service == dynamodb.ServiceID && (isTransact(op) || isItemWrite(op))
	case ProvisionedThroughputExceeded:
		return service == dynamodb.ServiceID && isData(op)
	case Throttling, AmbiguousTimeout, AccessDenied:
		return true
	case InternalServerError:
		return service == dynamodb.ServiceID && (op == "TransactWriteItems" || isItemWrite(op))
	case ExecutionAlreadyExists, StartThrottling, ExecutionLimitExceeded:
		return service == sfn.ServiceID && op == "StartExecution"
	}
	return false
}

func isTransact(op string) bool { return op == "TransactWriteItems" || op == "TransactGetItems" }

func isItemWrite(op string) bool { return op == "PutItem" || op == "UpdateItem" || op == "DeleteItem" }

func isData(op string) bool {
	switch op {
	case "GetItem", "Query", "Scan", "BatchGetItem", "BatchWriteItem":
		return true
	}
	return isTransact(op) || isItemWrite(op)
}

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
		msg := "The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API."
		if isTransact(op) && variant {
			return i.cancelled(params, "ProvisionedThroughputExceeded", msg)
		}
		return i.errorResponse(400, map[string]any{"__type": ddb + "ProvisionedThroughputExceededException", "message": msg})
	case Throttling, StartThrottling:
		if service == dynamodb.ServiceID {
			msg := "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling your table or index so please try again shortly."
			if isTransact(op) && variant {
				return i.cancelled(params, "ThrottlingError", msg)
			}
			return i.errorResponse(400, map[string]any{"__type": ddb + "ThrottlingException", "message": msg})
		}
		return i.errorResponse(400, map[string]any{"__type": "ThrottlingException", "message": "Rate exceeded"})
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
	reasons := make([]map[string]string, n)
	names := make([]string, n)
	for k := range reasons {
		reasons[k], names[k] = map[string]string{"Code": "None"}, "None"
	}
	reasons[at], names[at] = map[string]string{"Code": code, "Message": msg}, code
	return i.errorResponse(400, map[string]any{
		"__type":              "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
		"Message":             "Transaction cancelled, please refer cancellation reasons for specific reasons [" + strings.Join(names, ", ") + "]",
		"CancellationReasons": reasons,
	})
}

// close records a StartExecution's name as taken by a closed run and returns its ARN.
func (i *Injector) close(params any) string {
	p, ok := params.(*sfn.StartExecutionInput)
	if !ok || p.StateMachineArn == nil || p.Name == nil {
		return ""
	}
	arn := executionArn(*p.StateMachineArn, *p.Name)
	input := "{}"
	if p.Input != nil {
		input = *p.Input
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if _, ok := i.closed[arn]; !ok {
		i.closed[arn] = closedExecution{StateMachineArn: *p.StateMachineArn, Name: *p.Name, Input: input, Start: time.Now().Add(-time.Minute)}
	}
	return arn
}

// closedAnswer keeps a name the injector closed closed: StartExecution of it is refused again
// and DescribeExecution reports the failed run.
func (i *Injector) closedAnswer(op string, params any) (middleware.DeserializeOutput, bool) {
	switch p := params.(type) {
	case *sfn.StartExecutionInput:
		if p.StateMachineArn == nil || p.Name == nil {
			return middleware.DeserializeOutput{}, false
		}
		arn := executionArn(*p.StateMachineArn, *p.Name)
		i.mu.Lock()
		_, ok := i.closed[arn]
		i.mu.Unlock()
		if !ok {
			return middleware.DeserializeOutput{}, false
		}
		return i.errorResponse(400, map[string]any{"__type": "ExecutionAlreadyExists",
			"message": fmt.Sprintf("Execution Already Exists: '%s'", arn)}), true
	case *sfn.DescribeExecutionInput:
		if p.ExecutionArn == nil {
			return middleware.DeserializeOutput{}, false
		}
		i.mu.Lock()
		c, ok := i.closed[*p.ExecutionArn]
		i.mu.Unlock()
		if !ok {
			return middleware.DeserializeOutput{}, false
		}
		return i.response(200, map[string]any{
			"executionArn": *p.ExecutionArn, "stateMachineArn": c.StateMachineArn, "name": c.Name,
			"status": "FAILED", "input": c.Input,
			"startDate": float64(c.Start.UnixMilli()) / 1000, "stopDate": float64(c.Start.Add(time.Second).UnixMilli()) / 1000,
			"error": "States.TaskFailed", "cause": "injected by awsfault: the run failed before its first round",
		}), true
	}
	_ = op
	return middleware.DeserializeOutput{}, false
}

// executionArn derives an execution's ARN from its state machine's, as Step Functions does.
func executionArn(stateMachineArn, name string) string {
	return strings.Replace(stateMachineArn, ":stateMachine:", ":execution:", 1) + ":" + name
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

// Parse reads rules written as "Operation:Fault=rate" separated by commas, for example
// "TransactWriteItems:TransactionConflict=0.1,*:Throttling=0.1". "*" or no "Operation:"
// matches any operation.
func Parse(spec string) ([]Rule, error) {
	var rules []Rule
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lhs, rate, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("fault rule %q: want Operation:Fault=rate", part)
		}
		op, name, hasOp := strings.Cut(strings.TrimSpace(lhs), ":")
		if !hasOp {
			op, name = "", op
		}
		op, name = strings.TrimSpace(op), strings.TrimSpace(name)
		if op == "*" {
			op = ""
		}
		f, err := parseFault(name)
		if err != nil {
			return nil, fmt.Errorf("fault rule %q: %w", part, err)
		}
		r, err := strconv.ParseFloat(strings.TrimSpace(rate), 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("fault rule %q: rate must be a number from 0 to 1", part)
		}
		rules = append(rules, Rule{Operation: op, Fault: f, Rate: r})
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("fault spec %q has no rules", spec)
	}
	return rules, nil
}

func parseFault(name string) (Fault, error) {
	for _, f := range faults {
		if string(f) == name {
			return f, nil
		}
	}
	known := make([]string, len(faults))
	for k, f := range faults {
		known[k] = string(f)
	}
	return "", fmt.Errorf("unknown fault %q (known: %s)", name, strings.Join(known, ", "))
}
