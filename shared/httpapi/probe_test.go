package httpapi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/routes"
)

// Hostile-input probes (docs/numbers.md, Reliability): requests no client should send, each
// answered with its documented 4xx, never a redirect or a 5xx, without a panic, and without
// changing anything (the node, its reservations and VMs, the idempotency records, and no
// audit record but refusals and dry runs). The gateway's side (what API Gateway itself does
// with such requests) is localstack/e2e's TestHostileInputThroughTheGateway.

// hostileIDs are path ids that name nothing, as they appear in the URL path (escaped).
var hostileIDs = []struct{ name, escaped string }{
	{"dot", "."},
	{"dot-dot", ".."},
	{"escaped dot", "%2E"},
	{"escaped dot-dot", "%2E%2E"},
	{"escaped dot-dot, lower case", "%2e%2e"},
	{"half-escaped dot-dot", ".%2E"},
	{"escaped slash", "n1%2Fr1"},
	{"escaped dot-dot-slash", "..%2F..%2Fkeys"},
	{"escaped backslash", "..%5C.."},
	{"unicode", "n%C3%A9"},
	{"unicode, unescaped", "né"},
	{"right-to-left override", "n1%E2%80%AE"},
	{"emoji", "%F0%9F%98%80"},
	{"NUL", "n1%00"},
	{"CR LF", "n1%0D%0ASet-Cookie:x"},
	{"space", "n%201"},
	{"escaped percent", "n%251"},
	{"leading dash", "-n1"},
	{"semicolon", "n1;x=1"},
	{"129 characters", strings.Repeat("n", 129)},
	{"2 KB", strings.Repeat("n", 2048)},
}

// probeKey holds every permission as an operator: a refusal is the input's, not the caller's.
var probeKey = "Bearer " + secretPlatform

// probe is one hostile request and the answer it must get.
type probe struct {
	name   string
	method string
	path   string // escaped, as sent
	header http.Header
	body   io.Reader
	status int
	code   capacity.Code // "" when the body is not checked (a 2xx)
}

// validValues fills a route's wildcards with ids of the probe node (n1, r1...).
var validValues = map[string]string{
	"nodeId": "n1", "id": "r1", "reclaimId": "rcl-1", "scheduledReclaimId": "sr-1", "vmId": "vm-spot-a", "keyId": "key-owner",
}

var wildcard = regexp.MustCompile(`\{([A-Za-z]+)\}`)

// pathIDProbes puts each hostile id in each wildcard of each route of the route table: every
// one is the route's 404 (or, where the id takes the place of a literal segment, no route's).
func pathIDProbes() []probe {
	var out []probe
	for _, rt := range routes.All {
		for _, m := range wildcard.FindAllStringSubmatch(rt.Path, -1) {
			for _, id := range hostileIDs {
				path := wildcard.ReplaceAllStringFunc(rt.Path, func(w string) string {
					if w == m[0] {
						return id.escaped
					}
					return validValues[w[1:len(w)-1]]
				})
				out = append(out, probe{name: fmt.Sprintf("%s %s: %s %s", rt.Method, rt.Path, m[1], id.name),
					method: rt.Method, path: path, body: strings.NewReader(`{}`), status: 404, code: capacity.CodeNotFound})
			}
		}
	}
	return out
}

// dotPathProbes are paths with dot and empty segments outside the ids: none may be cleaned into
// another route (a redirect, or worse, the call served on the route the cleaning lands on).
func dotPathProbes() []probe {
	var out []probe
	for _, p := range []string{
		"/v1/nodes/n1/reservations/r1/..",
		"/v1/nodes/n1/reservations/r1/.",
		"/v1/nodes/n1/reservations/r1/reclaim/..",
		"/v1/./nodes/n1",
		"/v1/keys/../nodes/n1",
		"/v1/nodes/n1/reservations/../../../v1/keys",
		"/v1/nodes/n1/reservations/%2E%2E/%2E%2E/%2E%2E/keys",
		"/v1/nodes//reservations/r1",
		"//v1/nodes/n1",
		"/v1/nodes/n1/reservations/r1//",
		"/../v1/openapi.json",
		"/v1/openapi.json/.",
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
			out = append(out, probe{name: method + " " + p, method: method, path: p, body: strings.NewReader(`{"unitIds":["u2"]}`),
				status: 404, code: capacity.CodeNotFound})
		}
	}
	return out
}

// dryRun is a valid dry run of r1, the baseline the header and body probes vary.
const dryRun = `{"unitIds":["u2"],"dryRun":true}`

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h[http.CanonicalHeaderKey(kv[i])] = append(h[http.CanonicalHeaderKey(kv[i])], kv[i+1])
	}
	return h
}

// nested is a JSON value nested depth arrays deep around inner.
func nested(depth int, inner string) string {
	return strings.Repeat("[", depth) + inner + strings.Repeat("]", depth)
}

// elements is a JSON array of n copies of v.
func elements(n int, v string) string {
	return "[" + strings.TrimSuffix(strings.Repeat(v+",", n), ",") + "]"
}

func headerProbes() []probe {
	big := strings.Repeat("a", 1<<20)
	return []probe{
		// Headers are the gateway's to bound (API Gateway: 10 KB in all); here, each is read
		// only as far as it is needed.
		{name: "1 MiB Authorization", header: hdr("Authorization", "Bearer "+big), status: 401, code: capacity.CodeUnauthenticated},
		{name: "Authorization with CR LF", header: hdr("Authorization", probeKey+"\r\nX-Forwarded-For: 1.2.3.4"), status: 401, code: capacity.CodeUnauthenticated},
		{name: "Authorization twice", header: hdr("Authorization", probeKey, "Authorization", "Bearer "+secretStranger), status: 401, code: capacity.CodeUnauthenticated},
		{name: "1 MiB Idempotency-Key", header: hdr("Idempotency-Key", big), status: 422, code: capacity.CodeInvalidRequest},
		{name: "Idempotency-Key with CR LF", header: hdr("Idempotency-Key", "k1\r\nX: y"), status: 422, code: capacity.CodeInvalidRequest},
		{name: "Idempotency-Key with unicode", header: hdr("Idempotency-Key", "kéy"), status: 422, code: capacity.CodeInvalidRequest},
		{name: "1 MiB If-Match", header: hdr("If-Match", big), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "If-Match with CR LF", header: hdr("If-Match", "\"a\"\r\nX: y"), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "If-Match of 10,000 tags", body: strings.NewReader(`{"unitIds":["u2"]}`), header: hdr("If-Match", strings.TrimSuffix(strings.Repeat(`"a",`, 10000), ",")), status: 412, code: capacity.CodePlanChanged},
		{name: "1 MiB Content-Type", header: hdr("Content-Type", "application/json; x="+big), status: 200},
		{name: "Content-Type with CR LF", header: hdr("Content-Type", "application/json\r\nX: y"), status: 415, code: httpapi.CodeUnsupportedMediaType},
		{name: "two Content-Types", header: hdr("Content-Type", "text/plain", "Content-Type", "application/json"), status: 415, code: httpapi.CodeUnsupportedMediaType},
		{name: "Content-Type list", header: hdr("Content-Type", "application/json, text/plain"), status: 415, code: httpapi.CodeUnsupportedMediaType},
		{name: "1 MiB X-Request-Id", header: hdr("X-Request-Id", big), status: 200},
		{name: "X-Request-Id with CR LF", header: hdr("X-Request-Id", "r1\r\nSet-Cookie: a=b"), status: 200},
		{name: "X-Request-Id with controls", header: hdr("X-Request-Id", "r1\x1b[2J\u202e"), status: 200},
		{name: "10,000 unknown headers", header: func() http.Header {
			h := http.Header{}
			for i := range 10000 {
				h.Set(fmt.Sprintf("X-Junk-%d", i), "v")
			}
			return h
		}(), status: 200},
	}
}

// contentTypeProbes: JSON is application/json or any +json type (RFC 6839); everything else is 415.
func contentTypeProbes() []probe {
	var out []probe
	for _, ct := range []string{
		"application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "application/problem+json",
		"application/merge-patch+json", "application/json-patch+json", "application/vnd.api+json", "application/ld+json",
		"application/geo+json", "application/x-anything+json", "application/vnd.openrelay.capacity.v1+json",
	} {
		out = append(out, probe{name: "content type " + ct, header: hdr("Content-Type", ct), status: 200})
	}
	for _, ct := range []string{
		"text/json", "text/plain", "application/jsonx", "application/json+xml", "application/x-json", "application/xml",
		"multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "application/octet-stream", "*/*", "json", "",
	} {
		out = append(out, probe{name: "content type " + ct, header: hdr("Content-Type", ct), status: 415, code: httpapi.CodeUnsupportedMediaType})
	}
	return out
}

// slowBody hands out its bytes one at a time, with a pause before each.
type slowBody struct {
	data  []byte
	pause time.Duration
}

func (s *slowBody) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	time.Sleep(s.pause)
	p[0], s.data = s.data[0], s.data[1:]
	return 1, nil
}

// brokenBody fails after its bytes: a connection that drops mid-body.
type brokenBody struct{ data []byte }

func (b *brokenBody) Read(p []byte) (int, error) {
	if len(b.data) == 0 {
		return 0, errors.New("connection reset by peer")
	}
	n := copy(p, b.data)
	b.data = b.data[n:]
	return n, nil
}

func bodyProbes() []probe {
	s := func(body string) io.Reader { return strings.NewReader(body) }
	return []probe{
		{name: "64 KiB + 1", body: s(`{"unitIds":["u2"],"dryRun":true,"reason":"` + strings.Repeat("a", httpapi.MaxBodyBytes) + `"}`), status: 413, code: httpapi.CodeBodyTooLarge},
		{name: "10 MiB", body: s(`{"unitIds":["u2"],"reason":"` + strings.Repeat("a", 10<<20) + `"}`), status: 413, code: httpapi.CodeBodyTooLarge},
		{name: "64 KiB of whitespace around a dry run", body: s(strings.Repeat(" ", httpapi.MaxBodyBytes-len(dryRun)) + dryRun), status: 200},
		{name: "nested 100 deep", body: s(nested(100, "1")), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "nested 10,001 deep", body: s(nested(10001, "1")), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "nested 30,000 deep", body: s(nested(30000, "")), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "objects nested 10,000 deep in reason", body: s(`{"unitIds":["u2"],"reason":` + strings.Repeat(`{"a":`, 10000) + `1` + strings.Repeat(`}`, 10000) + `}`), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "unitIds nested 10,000 deep", body: s(`{"unitIds":` + nested(10000, `"u2"`) + `}`), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "unclosed nesting 60,000 deep", body: s(strings.Repeat("[", 60000)), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "10,000 unit ids", body: s(`{"unitIds":` + elements(10000, `"u2"`) + `,"dryRun":true}`), status: 422, code: capacity.CodeInvalidRequest},
		{name: "10,000 distinct unit ids", body: s(`{"unitIds":["u0"` + func() string {
			var b strings.Builder
			for i := 1; i < 10000; i++ {
				fmt.Fprintf(&b, `,"u%d"`, i)
			}
			return b.String()
		}() + `],"dryRun":true}`), status: 413, code: httpapi.CodeBodyTooLarge},
		{name: "10,000 numbers as unit ids", body: s(`{"unitIds":` + elements(10000, `1`) + `}`), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "10,000 nulls as unit ids", body: s(`{"unitIds":` + elements(10000, `null`) + `}`), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "10,000 empty objects", body: s(elements(10000, `{}`)), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "10,000 members", body: s(`{` + strings.TrimSuffix(strings.Repeat(`"dryRun":true,`, 10000), ",") + `}`), status: 413, code: httpapi.CodeBodyTooLarge},
		{name: "1,000 members", body: s(`{` + strings.TrimSuffix(strings.Repeat(`"dryRun":true,`, 1000), ",") + `}`), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "huge number", body: s(`{"unitIds":["u2"],"dryRun":true,"graceSeconds":1e400}`), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "integer past int64", body: s(`{"unitIds":["u2"],"dryRun":true,"graceSeconds":99999999999999999999}`), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "reason with CR LF", body: s(`{"unitIds":["u2"],"dryRun":true,"reason":"a\r\nb"}`), status: 422, code: capacity.CodeInvalidRequest},
		{name: "reason with bidi override", body: s(`{"unitIds":["u2"],"dryRun":true,"reason":"a\u202eb"}`), status: 422, code: capacity.CodeInvalidRequest},
		{name: "unit id with unicode", body: s(`{"unitIds":["u\u00e92"],"dryRun":true}`), status: 422, code: capacity.CodeInvalidRequest},
		{name: "unit id of 2 KB", body: s(`{"unitIds":["` + strings.Repeat("u", 2048) + `"],"dryRun":true}`), status: 422, code: capacity.CodeInvalidRequest},
		{name: "unit id ..", body: s(`{"unitIds":[".."],"dryRun":true}`), status: 422, code: capacity.CodeInvalidRequest},
		{name: "invalid UTF-8", body: s("{\"unitIds\":[\"u2\xff\"],\"dryRun\":true}"), status: 422, code: capacity.CodeInvalidRequest},
		{name: "byte order mark", body: s("\ufeff" + dryRun), status: 400, code: httpapi.CodeMalformedRequest},
		{name: "slow body", body: &slowBody{data: []byte(dryRun), pause: time.Millisecond}, status: 200},
		{name: "body cut off mid-way", body: &brokenBody{data: []byte(`{"unitIds":["u2"],"dry`)}, status: 400, code: httpapi.CodeMalformedRequest},
		{name: "valid body, then a connection reset", body: &brokenBody{data: []byte(dryRun)}, status: 400, code: httpapi.CodeMalformedRequest},
	}
}

func methodProbes() []probe {
	var out []probe
	for _, m := range []string{"TRACE", "CONNECT", "OPTIONS", "PATCH", "HEAD", "PROPFIND", "get"} {
		out = append(out, probe{name: "method " + m, method: m, status: 405, code: httpapi.CodeMethodNotAllowed})
	}
	return out
}

// TestHostileInputProbes runs every probe against the real service over an in-memory store.
func TestHostileInputProbes(t *testing.T) {
	groups := map[string][]probe{
		"path ids": pathIDProbes(), "dot paths": dotPathProbes(), "headers": headerProbes(),
		"content types": contentTypeProbes(), "bodies": bodyProbes(), "methods": methodProbes(),
	}
	total := 0
	for group, probes := range groups {
		t.Run(group, func(t *testing.T) {
			for _, pr := range probes {
				total++
				t.Run(pr.name, func(t *testing.T) { runProbe(t, pr) })
			}
		})
	}
	t.Logf("%d probes", total)
}

func runProbe(t *testing.T, pr probe) {
	h, store := newRealHandler(t)
	if pr.method == "" {
		pr.method = http.MethodPost
	}
	if pr.path == "" {
		pr.path = reclaimPath
	}
	if pr.body == nil && pr.method == http.MethodPost {
		pr.body = strings.NewReader(dryRun)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Method = pr.method
	u := *r.URL
	if err := (&u).UnmarshalBinary([]byte(pr.path)); err != nil {
		// An unparsable path never reaches the function: the gateway refuses it.
		t.Skipf("not a request path: %v", err)
	}
	r.URL, r.RequestURI = &u, pr.path
	if pr.body != nil {
		r.Body = io.NopCloser(pr.body)
	}
	r.Header.Set("Authorization", probeKey)
	r.Header.Set("Content-Type", "application/json")
	for k, v := range pr.header {
		r.Header[k] = v
	}
	before := snapshot(store)
	w := httptest.NewRecorder()
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("panic: %v", p)
			}
		}()
		h.ServeHTTP(w, r)
	}()
	switch {
	case w.Code >= 300 && w.Code < 400:
		t.Fatalf("%s %s: redirect %d to %q", pr.method, pr.path, w.Code, w.Header().Get("Location"))
	case w.Code >= 500:
		t.Fatalf("%s %s: %d %s", pr.method, pr.path, w.Code, w.Body.String())
	case pr.code != "":
		problem(t, w, pr.status, pr.code)
	case w.Code != pr.status:
		t.Fatalf("%s %s: %d, want %d: %s", pr.method, pr.path, w.Code, pr.status, w.Body.String())
	}
	for name, vs := range w.Header() {
		for _, v := range vs {
			if strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f || r > 0x7e }) {
				t.Errorf("answer header %s = %q holds a control or non-ASCII character", name, v)
			}
		}
	}
	if after := snapshot(store); !reflect.DeepEqual(before.state, after.state) {
		t.Errorf("the store changed:\nbefore %s\nafter  %s", before.state, after.state)
	} else if added := after.audits[len(before.audits):]; len(added) > 1 || len(added) == 1 && added[0].Outcome == "ok" && !added[0].DryRun {
		t.Errorf("audit records of a change: %+v", added)
	}
}

// storeSnapshot is what a probe must leave as it was: every node (its reservations and VMs)
// and the idempotency records, and the audit records so far.
type storeSnapshot struct {
	state  string
	audits []capacity.AuditRecord
}

func snapshot(s *memStore) storeSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, err := json.Marshal([]any{s.nodes, s.idem})
	if err != nil {
		panic(err)
	}
	return storeSnapshot{state: string(state), audits: clone(s.audits)}
}
