package dynamotest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/stepfn"
)

var machineSeq atomic.Int64

// Workflow returns the real Step Functions starter on a one-state machine of the Env's
// emulator. Its SDK calls are counted with the store's (Calls) and go through apiOptions too
// (for example an awsfault injector's APIOption).
func (e *Env) Workflow(t testing.TB, apiOptions ...func(*middleware.Stack) error) *stepfn.Starter {
	t.Helper()
	client := sfn.New(sfn.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(e.URL),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		APIOptions:  append([]func(*middleware.Stack) error{e.Calls.Middleware}, apiOptions...),
		// The functions' retryer (shared/config), with millisecond backoff as the store's.
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 3
			o.MaxBackoff = 5 * time.Millisecond
		}),
	})
	// The emulator keeps state machines process-wide: a name per call, so that a test can run
	// again (-count=2) in the same process.
	out, err := client.CreateStateMachine(context.Background(), &sfn.CreateStateMachineInput{
		Name:       aws.String(fmt.Sprintf("termination-%d", machineSeq.Add(1))),
		RoleArn:    aws.String("arn:aws:iam::000000000000:role/sfn"),
		Definition: aws.String(`{"StartAt":"Done","States":{"Done":{"Type":"Succeed"}}}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	return &stepfn.Starter{Client: client, StateMachineARN: aws.ToString(out.StateMachineArn)}
}
