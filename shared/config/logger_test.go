package config

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/openrelay/capacity/shared/trace"
)

func TestLogLinesNameTheInvocation(t *testing.T) {
	const ctxID, envID = "1-5759e988-bd862e3fe1be46a994272793", "1-00000001-000000000000000000000001"
	withLambda := func(ctx context.Context) context.Context {
		return lambdacontext.NewContext(ctx, &lambdacontext.LambdaContext{AwsRequestID: "lambda-req-1"})
	}
	tests := []struct {
		name      string
		ctx       func(context.Context) context.Context // nil: a log call without ctx
		env       string
		wantTrace string
		wantReqID string
	}{
		{name: "ctx header", ctx: func(c context.Context) context.Context {
			return trace.WithHeader(c, "Root="+ctxID+";Parent=53995c3f42cd8ad8;Sampled=1")
		}, wantTrace: ctxID},
		{name: "ctx wins over env", ctx: func(c context.Context) context.Context {
			return trace.WithHeader(c, "Parent=53995c3f42cd8ad8;Root="+ctxID)
		}, env: "Root=" + envID, wantTrace: ctxID},
		{name: "env without ctx", env: "Root=" + envID + ";Sampled=0", wantTrace: envID},
		{name: "env when ctx has no header", ctx: withLambda, env: "Root=" + envID, wantTrace: envID, wantReqID: "lambda-req-1"},
		{name: "lambda request id", ctx: func(c context.Context) context.Context {
			return withLambda(trace.WithHeader(c, "Root="+ctxID))
		}, wantTrace: ctxID, wantReqID: "lambda-req-1"},
		{name: "no trace, no attribute"},
		{name: "malformed header, no attribute", env: "Root=nonsense"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("_X_AMZN_TRACE_ID", tt.env)
			var out bytes.Buffer
			logger := slog.New(LogHandler(slog.NewJSONHandler(&out, nil))).With("fn", "api")
			if tt.ctx == nil {
				logger.Info("hello")
			} else {
				logger.InfoContext(tt.ctx(context.Background()), "hello")
			}
			var line map[string]any
			if err := json.Unmarshal(out.Bytes(), &line); err != nil {
				t.Fatal(err)
			}
			got, has := line["trace_id"]
			if tt.wantTrace == "" && has || tt.wantTrace != "" && got != tt.wantTrace {
				t.Errorf("trace_id = %v (present %v), want %q", got, has, tt.wantTrace)
			}
			got, has = line["aws_request_id"]
			if tt.wantReqID == "" && has || tt.wantReqID != "" && got != tt.wantReqID {
				t.Errorf("aws_request_id = %v (present %v), want %q", got, has, tt.wantReqID)
			}
			if line["fn"] != "api" {
				t.Errorf("attributes of With lost: %v", line)
			}
		})
	}
}
