package routes

import (
	"net/http"
	"regexp"
	"testing"
)

// apiGatewayPath is a path API Gateway accepts as nested resources: segments of its allowed
// characters or whole {params}.
var apiGatewayPath = regexp.MustCompile(`^(/([A-Za-z0-9._:-]+|\{[A-Za-z][A-Za-z0-9]*\}))+$`)

func TestTable(t *testing.T) {
	ops := map[string]bool{}
	seen := map[string]bool{}
	for _, r := range All {
		if !apiGatewayPath.MatchString(r.Path) {
			t.Errorf("%s %s: not an API Gateway resource path", r.Method, r.Path)
		}
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete:
		default:
			t.Errorf("%s %s: unexpected method", r.Method, r.Path)
		}
		if r.OperationID == "" || ops[r.OperationID] {
			t.Errorf("%s %s: operationId %q empty or repeated", r.Method, r.Path, r.OperationID)
		}
		ops[r.OperationID] = true
		if seen[r.Method+" "+r.Path] {
			t.Errorf("%s %s: repeated", r.Method, r.Path)
		}
		seen[r.Method+" "+r.Path] = true
	}
}
