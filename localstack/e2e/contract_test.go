package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/routes"
)

// The contract: every call the suite makes is checked against the OpenAPI document
// (shared/httpapi/openapi.json), so that the API and its document cannot drift apart.
var contract struct {
	once    sync.Once
	mu      sync.Mutex // the validator's caches are not documented as safe for concurrent use
	v       validator.Validator
	err     error
	methods *http.ServeMux // "METHOD path" of each route: which calls are operations
	paths   *http.ServeMux // path of each route
}

func loadContract() {
	doc, err := libopenapi.NewDocument(httpapi.OpenAPI)
	if err != nil {
		contract.err = fmt.Errorf("read openapi.json: %w", err)
		return
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		contract.err = fmt.Errorf("build a validator from openapi.json: %v", errs)
		return
	}
	contract.v = v
	contract.methods, contract.paths = http.NewServeMux(), http.NewServeMux()
	nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	seen := map[string]bool{}
	for _, r := range routes.All {
		contract.methods.Handle(r.Method+" "+r.Path, nop)
		if !seen[r.Path] {
			contract.paths.Handle(r.Path, nop)
			seen[r.Path] = true
		}
	}
}

// checkContract validates one call the suite made (path is relative to the API's base URL):
//   - a request the document accepts must get an answer the document describes (its status
//     among the operation's, its body and content type matching);
//   - a request the document refuses (unknown member, missing key, bad id...) must be refused
//     by the API too, with a 4xx; if it names an operation, the answer must still be one the
//     document describes.
//
// Benchmarks are not checked: the check would be timed with the call.
func checkContract(t testing.TB, method, path string, reqHeader http.Header, reqBody []byte, resp response) {
	t.Helper()
	if _, ok := t.(*testing.B); ok || strings.HasPrefix(path, "/v1/_floor/") { // the floor is local only, not part of the API
		return
	}
	contract.once.Do(loadContract)
	if contract.err != nil {
		t.Errorf("contract: %v", contract.err)
		return
	}
	newReq := func() *http.Request {
		r, err := http.NewRequest(method, "http://api"+path, bytes.NewReader(reqBody))
		if err != nil {
			t.Fatalf("contract: %v", err)
		}
		r.Header = reqHeader.Clone()
		return r
	}
	_, opPattern := contract.methods.Handler(newReq())
	_, pathPattern := contract.paths.Handler(newReq())
	if opPattern == "" && pathPattern == "" {
		// No such route: the API must refuse it, whatever the document says.
		if resp.Status < 400 || resp.Status >= 500 {
			t.Errorf("contract: %s %s is no route, yet answered %d", method, path, resp.Status)
		}
		return
	}
	if opPattern == "" { // a route, but not this method: the document has no operation for it
		if resp.Status != http.StatusMethodNotAllowed {
			t.Errorf("contract: %s %s: method not in the document, answered %d, want 405", method, path, resp.Status)
		}
		return
	}

	contract.mu.Lock()
	defer contract.mu.Unlock()
	reqOK, reqErrs := contract.v.ValidateHttpRequest(newReq())
	httpResp := &http.Response{
		StatusCode: resp.Status, Header: resp.Header, Body: http.NoBody, Request: newReq(),
	}
	if len(resp.Body) > 0 {
		httpResp.Body = readCloser{bytes.NewReader(resp.Body)}
	}
	respOK, respErrs := contract.v.ValidateHttpResponse(newReq(), httpResp)
	if !reqOK && (resp.Status < 400 || resp.Status >= 500) {
		t.Errorf("contract: %s %s: the document refuses the request (%s), the API answered %d", method, path, describe(reqErrs), resp.Status)
	}
	if !respOK {
		t.Errorf("contract: %s %s: answer %d does not match the document: %s\nbody: %s", method, path, resp.Status, describe(respErrs), resp.Body)
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func describe[E interface{ Error() string }](errs []E) string {
	var b strings.Builder
	for i, e := range errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// TestOpenAPIServed: the document is served through API Gateway without a key, as kept in
// the repository.
func TestOpenAPIServed(t *testing.T) {
	r := call(t, http.MethodGet, "/v1/openapi.json", "", nil)
	if r.Status != http.StatusOK || !bytes.Equal(r.Body, httpapi.OpenAPI) {
		t.Errorf("GET /v1/openapi.json: %d, %d bytes, want 200 and the document (%d bytes)", r.Status, len(r.Body), len(httpapi.OpenAPI))
	}
}
