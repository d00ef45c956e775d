package routes

import (
	"net/http"
	"os"
	"regexp"
	"strings"
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

// TestAPIDocNamesEachOperatorPermission: the route table of docs/api.md says which operator
// permission each operator route needs, as this table does, and names no other.
func TestAPIDocNamesEachOperatorPermission(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	perms := []string{KeyManage, NodeManage, ReservationManage, AuditRead}
	for _, r := range All {
		if r.Permission == "" {
			continue
		}
		route := "`" + r.Method + " " + r.Path + "`"
		var who string
		for line := range strings.Lines(string(doc)) {
			// A row of the route table: | method and path | who | does |
			if cells := strings.Split(line, " | "); strings.HasPrefix(line, "| ") && strings.Contains(cells[0], route) && len(cells) >= 3 {
				who = cells[1]
				break
			}
		}
		if who == "" {
			t.Errorf("%s: no row in the route table of docs/api.md", route)
			continue
		}
		for _, p := range perms {
			if strings.Contains(who, "`"+p+"`") != (p == r.Permission) {
				t.Errorf("%s: docs/api.md says %q; the route table's operator permission is %s", route, who, r.Permission)
			}
		}
	}
}
