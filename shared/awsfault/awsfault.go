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
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"syscall"

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
	// ConnectionRefused: the attempt never reaches the service (the dial is refused, as when
	// an endpoint is down): nothing is applied, and the caller gets the transport error the
	// HTTP client reports, which the SDK retries.
	ConnectionRefused Fault = "ConnectionRefused"
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

var faults = []Fault{TransactionConflict, ProvisionedThroughputExceeded, Throttling, AmbiguousTimeout, InternalServerError, ConnectionRefused,
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
	if f == ConnectionRefused {
		i.record(ctx, f, op)
		return middleware.DeserializeOutput{RawResponse: &smithyhttp.Response{Response: &http.Response{
				Header: http.Header{}, Body: http.NoBody,
			}}}, middleware.Metadata{}, &smithyhttp.RequestSendError{Err: &url.Error{
				Op: "Post", URL: requestURL(req), Err: &net.OpError{Op: "dial", Net: "tcp",
					Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)},
			}}
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
		u := requestURL(req)
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

func requestURL(req *smithyhttp.Request) string {
	if req != nil && req.URL != nil {
		return req.URL.String()
	}
	return ""
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
	case Throttling, AmbiguousTimeout, AccessDenied, ConnectionRefused:
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
