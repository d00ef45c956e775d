package stepfn_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/stepfn"
	"github.com/openrelay/capacity/shared/trace"
)

// capturingStarter is a Starter whose client sends nothing: it keeps each StartExecution
// input and answers with an empty output.
func capturingStarter(inputs *[]*sfn.StartExecutionInput) *stepfn.Starter {
	capture := middleware.InitializeMiddlewareFunc("capture", func(ctx context.Context, in middleware.InitializeInput, _ middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
		*inputs = append(*inputs, in.Parameters.(*sfn.StartExecutionInput))
		return middleware.InitializeOutput{Result: &sfn.StartExecutionOutput{}}, middleware.Metadata{}, nil
	})
	client := sfn.New(sfn.Options{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		APIOptions: []func(*middleware.Stack) error{func(s *middleware.Stack) error {
			return s.Initialize.Add(capture, middleware.Before)
		}}})
	return &stepfn.Starter{Client: client, StateMachineARN: "arn:aws:states:us-east-1:000000000000:stateMachine:termination"}
}

func TestStartJoinsTheInvocationsTrace(t *testing.T) {
	const header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	const envHeader = "Root=1-00000001-000000000000000000000001;Parent=0000000000000001;Sampled=1"
	tests := []struct {
		name, ctx, env string
		want           *string
	}{
		{name: "the ctx's header", ctx: header, env: envHeader, want: aws.String(header)},
		{name: "the environment's", env: envHeader, want: aws.String(envHeader)},
		{name: "none"},
		{name: "256 characters", ctx: header + ";" + strings.Repeat("x", 256-len(header)-1), want: aws.String(header + ";" + strings.Repeat("x", 256-len(header)-1))},
		{name: "too long is left out", ctx: header + ";" + strings.Repeat("x", 256-len(header))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("_X_AMZN_TRACE_ID", tt.env)
			ctx := context.Background()
			if tt.ctx != "" {
				ctx = trace.WithHeader(ctx, tt.ctx)
			}
			var inputs []*sfn.StartExecutionInput
			if err := capturingStarter(&inputs).Start(ctx, capacity.Operation{ID: "rcl_1", NodeID: "n1", VMIDs: []string{"a"}}); err != nil {
				t.Fatal(err)
			}
			if len(inputs) != 1 {
				t.Fatalf("%d StartExecution calls", len(inputs))
			}
			if got := inputs[0].TraceHeader; aws.ToString(got) != aws.ToString(tt.want) || (got == nil) != (tt.want == nil) {
				t.Errorf("TraceHeader = %v, want %v", aws.ToString(got), aws.ToString(tt.want))
			}
		})
	}
}
