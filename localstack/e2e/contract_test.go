package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"

	"github.com/openrelay/capacity/localstack/demo"
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
	// Formats too (date-time, uri, int64): "" is a string but no date-time.
	v, errs := validator.NewValidator(doc, config.WithFormatAssertions())
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
// the repository; its server URL is relative to the document (".."), so a client
// that takes its base URL from the document (resolving it against the document's own URL, as
// OpenAPI says) reaches the API. It asks as a client on AWS would, on the execute-api host
// ({apiId}.execute-api.localhost:4566/local/...), not in the local path form.
func TestOpenAPIServed(t *testing.T) {
	api, err := url.Parse(apiURL)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(strings.TrimPrefix(api.Path, "/restapis/"), "/") // {apiId}/{stage}/_user_request_/
	if len(parts) < 2 {
		t.Fatalf("ApiUrl %s is not in the local path form", apiURL)
	}
	host := parts[0] + ".execute-api.localhost:" + api.Port()
	stage := parts[1]
	// *.localhost may not resolve here: dial the local stack whatever the host.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, api.Host)
		},
	}}
	get := func(t *testing.T, u, key string) response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return response{resp.StatusCode, resp.Header, body}
	}

	docURL := "http://" + host + "/" + stage + "/v1/openapi.json"
	r := get(t, docURL, "")
	var doc struct {
		Servers []struct{ URL string } `json:"servers"`
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &doc) != nil || len(doc.Servers) != 1 {
		t.Fatalf("GET %s: %d, %d bytes, want 200 and a document with one server", docURL, r.Status, len(r.Body))
	}
	if !bytes.Equal(r.Body, httpapi.OpenAPI) {
		t.Errorf("GET %s: the document differs from openapi.json", docURL)
	}
	// In the local path form too, the server resolves to the API's base, which serves the
	// document again.
	local, err := url.Parse(strings.TrimSuffix(apiURL, "/") + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := url.Parse(doc.Servers[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	localBase := local.ResolveReference(ref)
	if strings.TrimSuffix(localBase.String(), "/") != strings.TrimSuffix(apiURL, "/") {
		t.Errorf("server %q fetched from %s resolves to %s, want the API's base %s", ref, local, localBase, apiURL)
	}
	if got := get(t, localBase.String()+"v1/openapi.json", ""); got.Status != http.StatusOK {
		t.Errorf("GET %sv1/openapi.json (the document's server, local form): %d, want 200", localBase, got.Status)
	}
	base, err := url.Parse(docURL)
	if err != nil {
		t.Fatal(err)
	}
	server, err := base.Parse(doc.Servers[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	node := newNode(t, nil)
	path := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID
	if got := get(t, strings.TrimSuffix(server.String(), "/")+path, keyOwner); got.Status != http.StatusOK {
		t.Errorf("GET %s%s (the document's server): %d %s, want 200", server, path, got.Status, got.Body)
	}
}

// errorsTB records what a check reports instead of failing the test.
type errorsTB struct {
	testing.TB
	errs []string
}

func (e *errorsTB) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}
func (e *errorsTB) Helper() {}

// TestContractChecksFormats: the contract check refuses an answer whose members have the right
// type but not the document's format (a createdAt of "", a date-time without its zone), and
// passes the same answer with real date-times.
func TestContractChecksFormats(t *testing.T) {
	key := func(createdAt string) []byte {
		return []byte(`{"key":{"keyId":"key-1","orgId":"org-1","permissions":["reservation.read"],"operator":false,"revoked":false` + createdAt + `}}`)
	}
	for _, tc := range []struct {
		name, createdAt string
		ok              bool
	}{
		{"date-time", `,"createdAt":"2026-12-03T10:00:00Z"`, true},
		{"absent", ``, true},
		{"empty", `,"createdAt":""`, false},
		{"no zone", `,"createdAt":"2026-12-03T10:00:00"`, false},
		{"a date", `,"createdAt":"2026-12-03"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &errorsTB{TB: t}
			h := http.Header{"Authorization": {"Bearer " + keyOperator}}
			resp := response{http.StatusOK, http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r-1"}}, key(tc.createdAt)}
			checkContract(rec, http.MethodGet, "/v1/keys/key-1", h, nil, resp)
			if ok := len(rec.errs) == 0; ok != tc.ok {
				t.Errorf("contract check passed=%v, want %v: %v", ok, tc.ok, rec.errs)
			}
		})
	}
}
