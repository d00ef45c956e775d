package httpapi_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// ---------------------------------------------------------------------------------------
// Error codes map to statuses.

func TestEveryErrorCodeMapsToItsStatus(t *testing.T) {
	tests := []struct {
		code   capacity.Code
		status int
	}{
		{capacity.CodeUnauthenticated, 401},
		{capacity.CodeForbidden, 403},
		{capacity.CodeNotFound, 404},
		{capacity.CodeReservationNotActive, 409},
		{capacity.CodeOutsideTerm, 409},
		{capacity.CodeTopologyChanged, 409},
		{capacity.CodeUnitsInUse, 409},
		{capacity.CodeUnitsUnavailable, 409},
		{capacity.CodeVMExists, 409},
		{capacity.CodeConcurrentModification, 409},
		{capacity.CodeOperationRunning, 409},
		{capacity.CodeScheduledReclaimCancelled, 409},
		{capacity.CodeScheduledReclaimFired, 409},
		{capacity.CodeCreatorKeyInvalid, 409},
		{capacity.CodeScheduledReclaimNotDue, 409},
		{capacity.CodeScheduledReclaimLimit, 409},
		{capacity.CodeReservationExists, 409},
		{capacity.CodeReservationOverlap, 409},
		{capacity.CodeInvalidTransition, 409},
		{capacity.CodePlanChanged, 412},
		{capacity.CodeSchedulingUnavailable, 501},
		{capacity.CodeRateLimited, 429},
		{capacity.CodeThrottled, 503},
		{capacity.CodeUnavailable, 503},
		{capacity.CodeInvalidRequest, 422},
		{capacity.CodeUnitsNotReserved, 422},
		{capacity.CodeUnknownUnits, 422},
		{capacity.CodeIdempotencyKeyReused, 422},
		{capacity.CodeInsufficientUnits, 422},
		{capacity.CodeInternal, 500},
		{httpapi.CodeMalformedRequest, 400},
		{httpapi.CodeBodyTooLarge, 413},
		{httpapi.CodeUnsupportedMediaType, 415},
		{httpapi.CodeMethodNotAllowed, 405},
		{"no_such_code", 500},
	}
	covered := map[capacity.Code]bool{}
	for _, tt := range tests {
		covered[tt.code] = true
	}
	for _, c := range declaredCodes(t) {
		if !covered[c] {
			t.Errorf("code %q is declared in shared/capacity or shared/httpapi but not covered here", c)
		}
	}

	routes := []req{
		{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`},
		{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
		{method: http.MethodPost, path: vmsPath, auth: ptr("Bearer " + secretOperator), body: `{"vmId":"v","orgId":"o","tier":"spot","unitIds":["u1"]}`},
		{method: http.MethodGet, path: reservationPath},
		{method: http.MethodPut, path: "/v1/nodes/n1", auth: ptr("Bearer " + secretPlatform), body: `{"ownerOrgId":"o","unitIds":["u1"],"agentEndpoint":"https://a"}`},
		{method: http.MethodPost, path: reservationPath + "/cancel", auth: ptr("Bearer " + secretPlatform)},
		{method: http.MethodGet, path: "/v1/keys", auth: ptr("Bearer " + secretPlatform)},
		{method: http.MethodGet, path: "/v1/nodes/n1/reservations/r1/audit"},
	}
	for _, tt := range tests {
		for _, rt := range routes {
			t.Run(fmt.Sprintf("%s/%s %s", tt.code, rt.method, rt.path), func(t *testing.T) {
				err := &capacity.Error{Code: tt.code, Message: "message for " + string(tt.code), UnitIDs: []string{"u7"}}
				svc := &fakeService{err: fmt.Errorf("wrapped: %w", err)}
				w := rt.do(t, newHandler(svc))
				p := problem(t, w, tt.status, tt.code)
				if tt.status < 500 {
					if p.Detail != err.Message || !slices.Equal(p.UnitIDs, err.UnitIDs) {
						t.Errorf("problem = %+v, want detail %q and unitIds %v", p, err.Message, err.UnitIDs)
					}
				}
				if got := w.Header().Get("WWW-Authenticate"); (tt.status == 401) != strings.HasPrefix(got, "Bearer ") {
					t.Errorf("WWW-Authenticate = %q with status %d", got, tt.status)
				}
				if got := w.Header().Get("Cache-Control"); got != "no-store" {
					t.Errorf("Cache-Control = %q, want no-store", got)
				}
			})
		}
	}
}

// declaredCodes returns the values of every Code constant in shared/capacity and
// shared/httpapi, so that a code added later without a status fails the test above.
func declaredCodes(t *testing.T) []capacity.Code {
	t.Helper()
	fset := token.NewFileSet()
	var codes []capacity.Code
	for _, dir := range []string{"../capacity", "."} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
			if err != nil {
				t.Fatalf("parse %s: %v", e.Name(), err)
			}
			{
				ast.Inspect(f, func(n ast.Node) bool {
					vs, ok := n.(*ast.ValueSpec)
					if !ok || vs.Type == nil || len(vs.Values) != len(vs.Names) {
						return true
					}
					typ := types(vs.Type)
					if typ != "Code" && typ != "capacity.Code" {
						return true
					}
					for _, v := range vs.Values {
						if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							s, _ := strconv.Unquote(lit.Value)
							codes = append(codes, capacity.Code(s))
						}
					}
					return true
				})
			}
		}
	}
	if len(codes) < 15 {
		t.Fatalf("found only %d codes: %v", len(codes), codes)
	}
	return codes
}

func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return types(e.X) + "." + e.Sel.Name
	}
	return ""
}

func TestInternalErrorsDoNotLeak(t *testing.T) {
	secret := "dynamodb: TransactWriteItems arn:aws:dynamodb:eu-west-1:123456789012:table/state: ValidationException"
	tests := []struct {
		name string
		err  error
	}{
		{"plain error", errors.New(secret)},
		{"wrapped error", fmt.Errorf("commit reclaim of reservation r1: %w", errors.New(secret))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{err: tt.err}
			w := req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`}.do(t, newHandler(svc))
			p := problem(t, w, http.StatusInternalServerError, capacity.CodeInternal)
			for _, leak := range []string{"dynamodb", "arn:", "123456789012", "ValidationException", "commit reclaim"} {
				if strings.Contains(w.Body.String(), leak) {
					t.Errorf("500 body leaks %q: %s", leak, w.Body.String())
				}
			}
			if p.Detail != "internal error" {
				t.Errorf("detail = %q, want \"internal error\"", p.Detail)
			}
		})
	}
}
