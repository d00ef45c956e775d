package awsfault

import (
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/smithy-go/middleware"
)

type closedExecution struct {
	StateMachineArn, Name, Input string
	Start                        time.Time
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
