package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/routes"
)

// openAPIDoc is the part of the document the tests read.
type openAPIDoc struct {
	OpenAPI    string                                `json:"openapi"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas struct {
			ProblemCode struct {
				Enum         []string       `json:"enum"`
				StatusByCode map[string]int `json:"x-status-by-code"`
			} `json:"ProblemCode"`
		} `json:"schemas"`
	} `json:"components"`
}

func readDoc(t *testing.T) openAPIDoc {
	t.Helper()
	var d openAPIDoc
	if err := json.Unmarshal(OpenAPI, &d); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return d
}

// TestOpenAPIMatchesRouteTable: the document's operations are exactly the route table's,
// with the same operationId and operator permission (x-operator-permission), and only the
// routes without auth drop the security requirement.
func TestOpenAPIMatchesRouteTable(t *testing.T) {
	d := readDoc(t)
	if !strings.HasPrefix(d.OpenAPI, "3.1.") {
		t.Errorf("openapi %q, want 3.1.x", d.OpenAPI)
	}
	type op struct {
		ID         string
		Auth       bool
		Permission string
	}
	got := map[string]op{}
	for path, item := range d.Paths {
		for method, raw := range item {
			if method == "parameters" || method == "summary" || method == "description" {
				continue
			}
			var o struct {
				OperationID string             `json:"operationId"`
				Security    *[]json.RawMessage `json:"security"`
				Permission  string             `json:"x-operator-permission"`
				Description string             `json:"description"`
			}
			if err := json.Unmarshal(raw, &o); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			// No security member: the document's global requirement (the API key) applies.
			got[strings.ToUpper(method)+" "+path] = op{o.OperationID, o.Security == nil || len(*o.Security) > 0, o.Permission}
			if o.Permission != "" && !strings.Contains(o.Description, o.Permission) {
				t.Errorf("%s %s: the description does not say it needs %s", method, path, o.Permission)
			}
		}
	}
	want := map[string]op{}
	for _, r := range routes.All {
		want[r.Method+" "+r.Path] = op{r.OperationID, r.Auth, r.Permission}
	}
	if !maps.Equal(got, want) {
		t.Errorf("OpenAPI operations\n got %v\nwant %v (shared/routes)", got, want)
	}
}

// TestEveryRouteHasAHandler: the mux serves the route table, no more and no less.
func TestEveryRouteHasAHandler(t *testing.T) {
	h := &Handler{}
	if _, err := bindRoutes(routes.All, h.handlers()); err != nil {
		t.Fatal(err)
	}
	// And bindRoutes does catch each kind of drift.
	extra := append(slices.Clone(routes.All), routes.Route{Method: "GET", Path: "/v1/x", OperationID: "unbound"})
	if _, err := bindRoutes(extra, h.handlers()); err == nil {
		t.Error("a route without a handler was accepted")
	}
	if _, err := bindRoutes(routes.All[1:], h.handlers()); err == nil {
		t.Error("a handler without a route was accepted")
	}
}

// domainCodes lists every capacity.Code constant declared in the given files, so that a new
// code cannot be added without the document knowing it.
func domainCodes(t *testing.T, files ...string) map[string]bool {
	t.Helper()
	codes := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok || vs.Type == nil || len(vs.Values) != len(vs.Names) {
				return true
			}
			typ := ""
			switch x := vs.Type.(type) {
			case *ast.Ident:
				typ = x.Name
			case *ast.SelectorExpr:
				typ = x.Sel.Name
			}
			if typ != "Code" {
				return true
			}
			for _, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					codes[s] = true
				}
			}
			return true
		})
	}
	return codes
}

// TestOpenAPIProblemCodes: every problem code (the domain's and the transport's) is in the
// document, with the status the API answers it with.
func TestOpenAPIProblemCodes(t *testing.T) {
	codes := domainCodes(t, "../capacity/errors.go", "problem.go")
	if len(codes) < 20 {
		t.Fatalf("found only %d codes: %v", len(codes), codes)
	}
	pc := readDoc(t).Components.Schemas.ProblemCode
	enum := map[string]bool{}
	for _, c := range pc.Enum {
		enum[c] = true
	}
	if !maps.Equal(enum, codes) {
		t.Errorf("ProblemCode enum %v\nwant the codes %v", slices.Sorted(maps.Keys(enum)), slices.Sorted(maps.Keys(codes)))
	}
	for c := range codes {
		if got, want := pc.StatusByCode[c], StatusOf(capacity.Code(c)); got != want {
			t.Errorf("code %s: document says status %d, API answers %d", c, got, want)
		}
	}
	if len(pc.StatusByCode) != len(codes) {
		t.Errorf("x-status-by-code has %d codes, want %d", len(pc.StatusByCode), len(codes))
	}
}

// denyAuth fails the test if anything asks it to authenticate.
type denyAuth struct{ t *testing.T }

func (d denyAuth) Authenticate(context.Context, string) (capacity.Principal, error) {
	d.t.Error("the document's route authenticated the caller")
	return capacity.Principal{}, capacity.Errorf(capacity.CodeUnauthenticated, "no")
}

func (d denyAuth) AuthenticateFresh(ctx context.Context, h string) (capacity.Principal, error) {
	return d.Authenticate(ctx, h)
}

// TestServeOpenAPI: GET /v1/openapi.json answers the document as kept, without a key, under
// any base path; its server URL, resolved against the URL the document was fetched from (as
// OpenAPI resolves a relative one), is the API's base on AWS (a stage, a custom domain's base
// path, the host's root) and in the local stack's path form alike.
func TestServeOpenAPI(t *testing.T) {
	h := (&Handler{Auth: denyAuth{t}}).Mux()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/openapi.json", nil))
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" || w.Body.String() != string(OpenAPI) {
		t.Errorf("GET /v1/openapi.json: %d %s, body %d bytes, want 200 application/json and the document", w.Code, w.Header().Get("Content-Type"), w.Body.Len())
	}
	for _, tc := range []struct {
		base string // the API's base, as its client calls it
		seen string // the base path the function is told (BasePath)
	}{
		{"https://a1b2c3.execute-api.eu-west-1.amazonaws.com/prod", "/prod"},
		{"https://api.example.com/capacity", "/capacity"},
		{"https://api.example.com/team/capacity", "/team/capacity"},
		{"https://api.example.com", ""},
		{"http://127.0.0.1:4566/restapis/a1b2c3/local/_user_request_", "/local"},
		{"http://a1b2c3.execute-api.localhost:4566/local", "/local"},
	} {
		base := tc.base
		staged := (&Handler{Auth: denyAuth{t}, BasePath: func(*http.Request) string { return tc.seen }}).Mux()
		w := httptest.NewRecorder()
		staged.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/openapi.json", nil))
		var doc struct {
			Servers []struct{ URL string } `json:"servers"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || len(doc.Servers) != 1 {
			t.Fatalf("servers %+v (%v), want one", doc.Servers, err)
		}
		fetched, err := url.Parse(base + "/v1/openapi.json")
		if err != nil {
			t.Fatal(err)
		}
		server, err := url.Parse(doc.Servers[0].URL)
		if err != nil {
			t.Fatal(err)
		}
		// The base as API Gateway's own URL of a stage names it: with a trailing slash.
		if got := fetched.ResolveReference(server).String(); strings.TrimSuffix(got, "/") != base {
			t.Errorf("server %q fetched from %s resolves to %s, want the API's base %s", doc.Servers[0].URL, fetched, got, base)
		}
		if !bytes.Equal(w.Body.Bytes(), OpenAPI) {
			t.Errorf("the document served under a base path differs from openapi.json")
		}
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/openapi.json", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/openapi.json: %d, want 405", w.Code)
	}
}

// TestOpenAPIIsValid: the document is a valid OpenAPI 3.1 document.
func TestOpenAPIIsValid(t *testing.T) {
	doc, err := libopenapi.NewDocument(OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Error(e)
		}
	}
}

// TestOpenAPIKeyPermissions: the document's key request accepts exactly the permissions the
// service grants.
func TestOpenAPIKeyPermissions(t *testing.T) {
	var d struct {
		Components struct {
			Schemas struct {
				KeyRequest struct {
					Properties struct {
						Permissions struct {
							Items struct {
								Enum []string `json:"enum"`
							} `json:"items"`
						} `json:"permissions"`
					} `json:"properties"`
				} `json:"KeyRequest"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(OpenAPI, &d); err != nil {
		t.Fatal(err)
	}
	if got := d.Components.Schemas.KeyRequest.Properties.Permissions.Items.Enum; !slices.Equal(slices.Sorted(slices.Values(got)), capacity.AllPermissions) {
		t.Errorf("KeyRequest permissions %v, want %v", got, capacity.AllPermissions)
	}
}
