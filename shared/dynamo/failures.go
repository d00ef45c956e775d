package dynamo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/openrelay/capacity/shared/capacity"
)

// classify marks an error of a call that DynamoDB refused for capacity with
// capacity.ErrThrottled (nothing was applied; the caller answers 503 throttled, not 500), and
// a read that got no answer (after the SDK's retries) with capacity.ErrUnavailable (503
// unavailable). A write that got no answer is left as it is: it may have been applied.
func classify(err error) error {
	switch {
	case throttled(err):
		return fmt.Errorf("%w: %w", capacity.ErrThrottled, err)
	case unanswered(err) && readOnly(err):
		return fmt.Errorf("%w: %w", capacity.ErrUnavailable, err)
	}
	return err
}

// unanswered reports whether the call failed in transport: the connection was refused or
// broke, or no answer came in time. Not the caller's own context ending (smithy's
// CanceledError), which is no sign of the database's health.
func unanswered(err error) bool {
	var send *smithyhttp.RequestSendError
	var timeout *awshttp.ResponseTimeoutError
	return errors.As(err, &send) || errors.As(err, &timeout) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF)
}

// readOnly reports whether err is of an operation that writes nothing, so that its failure
// changed nothing whatever the transport did.
func readOnly(err error) bool {
	var op *smithy.OperationError
	if !errors.As(err, &op) {
		return false
	}
	switch op.OperationName {
	case "GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems":
		return true
	}
	return false
}

// throttled reports whether DynamoDB refused a transaction for capacity, which applies
// nothing: the throttling exceptions the SDK gave up retrying, or a cancellation whose
// reasons are throttling (the SDK does not retry those) and no condition failure or conflict.
func throttled(err error) bool {
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) {
		throttle := false
		for _, r := range canceled.CancellationReasons {
			switch aws.ToString(r.Code) {
			case "ThrottlingError", "ProvisionedThroughputExceeded":
				throttle = true
			case "", "None":
			default:
				return false
			}
		}
		return throttle
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded":
			return true
		}
	}
	return false
}

// attemptLog records the outcome of each attempt the SDK's retryer makes of one call.
type attemptLog struct {
	mu   sync.Mutex
	errs []error
}

// option adds the log to one call's stack, inside the retry loop.
func (l *attemptLog) option(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Finalize.Insert(middleware.FinalizeMiddlewareFunc("capacity.AttemptLog",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleFinalize(ctx, in)
				l.mu.Lock()
				l.errs = append(l.errs, err)
				l.mu.Unlock()
				return out, md, err
			}), "Retry", middleware.After)
	})
}

// ambiguous reports whether some attempt failed in a way that leaves open whether it was
// applied: no answer (timeout, broken connection) or a server error. An answer that is a
// client error (a 4xx, such as a cancellation or throttling) applied nothing.
func (l *attemptLog) ambiguous() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		if err == nil {
			continue
		}
		var status interface{ HTTPStatusCode() int }
		if errors.As(err, &status) && status.HTTPStatusCode() != 0 {
			if code := status.HTTPStatusCode(); code >= 400 && code < 500 {
				continue
			}
			return true
		}
		var api smithy.APIError
		if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient {
			continue
		}
		return true
	}
	return false
}

// retryable reports whether a cancelled transaction lost to another write (and so a fresh
// read and decision may succeed), rather than failing for a reason a retry cannot fix.
func retryable(e *types.TransactionCanceledException) bool {
	for _, r := range e.CancellationReasons {
		switch aws.ToString(r.Code) {
		case "ConditionalCheckFailed", "TransactionConflict":
			return true
		}
	}
	return false
}

func reasons(e *types.TransactionCanceledException) string {
	var out []string
	for i, r := range e.CancellationReasons {
		if c := aws.ToString(r.Code); c != "" && c != "None" {
			out = append(out, fmt.Sprintf("item %d: %s", i, c))
		}
	}
	return strings.Join(out, ", ")
}
