package trace_test

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/trace"
)

const id = "1-5759e988-bd862e3fe1be46a994272793"

func TestRoot(t *testing.T) {
	for _, tc := range []struct{ name, header, want string }{
		{"root first", "Root=" + id + ";Parent=53995c3f42cd8ad8;Sampled=1", id},
		{"root not first", "Parent=53995c3f42cd8ad8;Sampled=1;Root=" + id, id},
		{"spaces", "Parent=53995c3f42cd8ad8; Root=" + id, id},
		{"root alone", "Root=" + id, id},
		{"missing", "Parent=53995c3f42cd8ad8;Sampled=1", ""},
		{"empty", "", ""},
		{"malformed root", "Root=1-xyz-123;Sampled=1", ""},
		{"wrong version", "Root=2-5759e988-bd862e3fe1be46a994272793", ""},
		{"upper case hex", "Root=1-5759E988-BD862E3FE1BE46A994272793", ""},
		{"no equals", "Root" + id, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := trace.Root(tc.header); got != tc.want {
				t.Errorf("Root(%q) = %q, want %q", tc.header, got, tc.want)
			}
		})
	}
}

func TestIDFromContextOrEnvironment(t *testing.T) {
	const other = "1-00000001-000000000000000000000001"
	for _, tc := range []struct{ name, ctx, env, want string }{
		{"ctx wins over env", "Root=" + id, "Root=" + other, id},
		{"env when ctx has none", "", "Root=" + other, other},
		{"none", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("_X_AMZN_TRACE_ID", tc.env)
			ctx := context.Background()
			if tc.ctx != "" {
				ctx = trace.WithHeader(ctx, tc.ctx)
			}
			if got := trace.ID(ctx); got != tc.want {
				t.Errorf("ID = %q, want %q", got, tc.want)
			}
		})
	}
}
