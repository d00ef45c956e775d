package stepfn_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/stepfn"
)

// starter is the real starter on a one-state machine of the emulator, with inj's faults.
func starter(t *testing.T, inj *awsfault.Injector) *stepfn.Starter {
	t.Helper()
	if inj == nil {
		return dynamotest.New(t).Workflow(t)
	}
	return dynamotest.New(t).Workflow(t, inj.APIOption)
}

func TestStartNamesTheAttempt(t *testing.T) {
	ctx := context.Background()
	s := starter(t, nil)
	op := capacity.Operation{ID: fmt.Sprintf("rcl_st%d", time.Now().UnixNano()), NodeID: "n1", VMIDs: []string{"a", "b"},
		Outcomes: map[string]capacity.VMOutcome{"a": {Outcome: capacity.OutcomeTerminated, Attempt: 1}, "b": {Outcome: capacity.OutcomeFailed, Attempt: 1}}}
	op.Attempt = 2 // a re-drive: b's failure is no longer final
	if err := s.Start(ctx, op); err != nil {
		t.Fatal(err)
	}
	arn, _ := stepfn.ExecutionARN(s.StateMachineARN, op.ID+"-2")
	out, err := s.Client.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)})
	if err != nil {
		t.Fatalf("execution %s: %v", arn, err)
	}
	var in stepfn.Input
	if err := json.Unmarshal([]byte(aws.ToString(out.Input)), &in); err != nil {
		t.Fatal(err)
	}
	if in.ReclaimID != op.ID || in.Attempt != 2 || in.NodeID != "n1" || !slices.Equal(in.VMIDs, []string{"b"}) {
		t.Fatalf("input = %+v", in)
	}
}

// On AWS a start of a name whose Standard execution has closed answers
// ExecutionAlreadyExists, which Start takes as started and StartChecked tells the reconciler
// (it then restarts the operation as the next attempt).
func TestStartCheckedTellsAClosedExecutionBehindAlreadyExists(t *testing.T) {
	ctx := context.Background()
	inj := awsfault.New(1, awsfault.Rule{Operation: "StartExecution", Fault: awsfault.ExecutionAlreadyExists, Rate: 1})
	s := starter(t, inj)
	op := capacity.Operation{ID: "rcl_closed", NodeID: "n1", VMIDs: []string{"a"}}
	if err := s.Start(ctx, op); err != nil {
		t.Fatalf("ExecutionAlreadyExists: %v, want taken as started", err)
	}
	if err := s.StartChecked(ctx, op); !errors.Is(err, capacity.ErrExecutionExists) {
		t.Fatalf("StartChecked = %v, want ErrExecutionExists", err)
	}
}

func TestExecutionARN(t *testing.T) {
	got, err := stepfn.ExecutionARN("arn:aws:states:eu-west-1:123456789012:stateMachine:capacity-prod-termination", "rcl_1-2")
	if err != nil || got != "arn:aws:states:eu-west-1:123456789012:execution:capacity-prod-termination:rcl_1-2" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := stepfn.ExecutionARN("arn:aws:lambda:eu-west-1:1:function:x", "n"); err == nil {
		t.Fatal("a non-state-machine ARN was accepted")
	}
}

// StartExecution throttled past the SDK's retries is an error (the API then leaves the
// operation pending-start for the reconciler), and nothing was started.
func TestStartThrottledIsAnErrorAndStartsNothing(t *testing.T) {
	ctx := context.Background()
	inj := awsfault.New(1, awsfault.Rule{Operation: "StartExecution", Fault: awsfault.StartThrottling, Rate: 1})
	s := starter(t, inj)
	op := capacity.Operation{ID: fmt.Sprintf("rcl_th%d", time.Now().UnixNano()), NodeID: "n1", VMIDs: []string{"a"}}
	if err := s.Start(ctx, op); err == nil {
		t.Fatal("throttled start reported success")
	}
	if inj.Count(awsfault.StartThrottling) < 2 {
		t.Errorf("%d throttles injected, want the SDK to have retried", inj.Count(awsfault.StartThrottling))
	}
	arn, _ := stepfn.ExecutionARN(s.StateMachineARN, op.ID)
	if _, err := s.Client.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)}); err == nil {
		t.Fatalf("execution %s exists after a throttled start", arn)
	}
}
