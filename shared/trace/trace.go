// Package trace reads the X-Ray trace header of the Lambda invocation being served, so logs,
// metrics and the workflows a call starts all name the same trace.
package trace

import (
	"context"
	"os"
	"strings"
)

// ctxKey is the key aws-lambda-go stores the invocation's trace header under (a plain
// string, which is why it is spelled out here rather than imported).
const ctxKey = "x-amzn-trace-id"

// envVar is where aws-lambda-go also puts the header of the invocation being served. A
// function serves one invocation at a time, so it is right even where no ctx is at hand.
const envVar = "_X_AMZN_TRACE_ID"

// Header returns the invocation's X-Ray trace header ("Root=1-...;Parent=...;Sampled=1"):
// the ctx's when it carries one, else the environment's, else "".
func Header(ctx context.Context) string {
	if ctx != nil {
		if h, _ := ctx.Value(ctxKey).(string); h != "" {
			return h
		}
	}
	return os.Getenv(envVar)
}

// WithHeader returns a ctx carrying the header as aws-lambda-go would, for tests.
func WithHeader(ctx context.Context, header string) context.Context {
	return context.WithValue(ctx, ctxKey, header) //nolint:staticcheck // the key aws-lambda-go uses
}

// ID returns the trace id, the Root of the invocation's header (e.g.
// "1-5759e988-bd862e3fe1be46a994272793"), or "" when there is none.
func ID(ctx context.Context) string {
	return Root(Header(ctx))
}

// Root returns the Root field of an X-Ray trace header, wherever it sits among the fields,
// or "" when the header has none or it is not a trace id ("1-<8 hex>-<24 hex>").
func Root(header string) string {
	for field := range strings.SplitSeq(header, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(field), "=")
		if ok && k == "Root" && validID(v) {
			return v
		}
	}
	return ""
}

func validID(id string) bool {
	parts := strings.Split(id, "-")
	return len(parts) == 3 && parts[0] == "1" && hex(parts[1], 8) && hex(parts[2], 24)
}

func hex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
