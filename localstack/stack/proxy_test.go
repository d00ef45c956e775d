package stack

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// seen is what the fake kumo behind the proxy received.
type seen struct {
	host, path, escapedPath, query string
}

func newTestProxy(t *testing.T, backend http.HandlerFunc) *httptest.Server {
	t.Helper()

	kumoSrv := httptest.NewServer(backend)
	t.Cleanup(kumoSrv.Close)

	p, err := newProxy(kumoSrv.URL, "4566", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}

	front := httptest.NewServer(p)
	t.Cleanup(func() {
		front.Close()
		p.close()
	})

	return front
}

func TestProxyUserRequestPathForm(t *testing.T) {
	got := make(chan seen, 1)
	front := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		got <- seen{host: r.Host, path: r.URL.Path, escapedPath: r.URL.EscapedPath(), query: r.URL.RawQuery}
	})

	tests := []struct {
		name, path string
		want       seen
	}{
		{
			name: "resource path",
			path: "/restapis/a1b2c3-d4/local/_user_request_/items/abc123?x=1",
			want: seen{host: "a1b2c3-d4.execute-api.localhost:4566", path: "/local/items/abc123", escapedPath: "/local/items/abc123", query: "x=1"},
		},
		{
			name: "escaping is kept",
			path: "/restapis/api1/local/_user_request_/items/a%20b%2Fc",
			want: seen{host: "api1.execute-api.localhost:4566", path: "/local/items/a b/c", escapedPath: "/local/items/a%20b%2Fc"},
		},
		{
			name: "stage root with slash",
			path: "/restapis/api1/prod/_user_request_/",
			want: seen{host: "api1.execute-api.localhost:4566", path: "/prod/", escapedPath: "/prod/"},
		},
		{
			name: "stage root without slash",
			path: "/restapis/api1/prod/_user_request_",
			want: seen{host: "api1.execute-api.localhost:4566", path: "/prod/", escapedPath: "/prod/"},
		},
		{
			name: "API Gateway management call is not rewritten",
			path: "/restapis/api1/resources",
			want: seen{path: "/restapis/api1/resources", escapedPath: "/restapis/api1/resources"},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(front.URL+tt.path, "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}

			_ = resp.Body.Close()

			s := <-got
			if tt.want.host == "" {
				tt.want.host = front.Listener.Addr().String() // Host kept as sent
			}

			if s != tt.want {
				t.Errorf("kumo saw %+v, want %+v", s, tt.want)
			}
		})
	}
}

func TestProxyKeepsHost(t *testing.T) {
	got := make(chan seen, 1)
	front := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		got <- seen{host: r.Host, path: r.URL.Path}
	})

	req, _ := http.NewRequest(http.MethodGet, front.URL+"/local/items/1", nil)
	req.Host = "api1.execute-api.localhost:4566"

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}

	_ = resp.Body.Close()

	if s := <-got; s.host != req.Host || s.path != "/local/items/1" {
		t.Errorf("kumo saw %+v", s)
	}
}

func TestProxyRewritesRuntimeInvocations(t *testing.T) {
	const restEvent = `{"resource":"/items/{id}","path":"/items/{id}","pathParameters":{"id":"abc123"},"requestContext":{"stage":"local","path":"/local/items/{id}"}}`

	const other = `{"source":"capacity.test","detail":{}}`

	front := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lambda-Runtime-Aws-Request-Id", "req-1")
		w.Header().Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:local:000000000000:function:fn")

		body := restEvent
		if r.URL.Query().Get("other") != "" || r.URL.Path == "/_runtime/fn/2018-06-01/runtime/invocation/req-1/response" {
			body = other
		}

		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, body)
	})

	get := func(path string) (*http.Response, string) {
		t.Helper()

		resp, err := http.Get(front.URL + path)
		if err != nil {
			t.Fatal(err)
		}

		defer func() { _ = resp.Body.Close() }()

		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}

		return resp, string(body)
	}

	resp, body := get("/_runtime/fn/2018-06-01/runtime/invocation/next")

	var event struct {
		Path           string            `json:"path"`
		Resource       string            `json:"resource"`
		RequestContext map[string]string `json:"requestContext"`
	}
	if err := json.Unmarshal([]byte(body), &event); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}

	if event.Path != "/items/abc123" || event.RequestContext["path"] != "/local/items/abc123" || event.Resource != "/items/{id}" {
		t.Errorf("event not corrected: %s", body)
	}

	if resp.ContentLength != int64(len(body)) {
		t.Errorf("Content-Length %d, body %d bytes", resp.ContentLength, len(body))
	}

	if got := resp.Header.Get("Lambda-Runtime-Invoked-Function-Arn"); got != "arn:aws:lambda:us-east-1:000000000000:function:fn" {
		t.Errorf("invoked function ARN %q", got)
	}

	if got := resp.Header.Get("Lambda-Runtime-Aws-Request-Id"); got != "req-1" {
		t.Errorf("request id header %q", got)
	}

	// Another payload on next passes through byte-identical.
	if _, body := get("/_runtime/fn/2018-06-01/runtime/invocation/next?other=1"); body != other {
		t.Errorf("non-API event changed: %s", body)
	}

	// Only next is rewritten: an API Gateway event anywhere else passes through.
	if _, body := get("/restapis"); body != restEvent {
		t.Errorf("response of another path changed: %s", body)
	}
}

// A function error fails the workflow's task, as on AWS (kumo's engine would take the error
// payload as the task's output); every other caller gets AWS's 200 with X-Amz-Function-Error.
func TestProxyFailsWorkflowTasksOnFunctionErrors(t *testing.T) {
	const errPayload = `{"errorMessage":"store throttled","errorType":"wrapError"}`

	front := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("ok") == "" {
			w.Header().Set("X-Amz-Function-Error", "Unhandled")
		}

		_, _ = io.WriteString(w, errPayload)
	})

	const (
		kumoAuth = "AWS4-HMAC-SHA256 Credential=kumo/19700101/us-east-1/lambda/aws4_request, SignedHeaders=host, Signature=internal"
		sdkAuth  = "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/lambda/aws4_request, SignedHeaders=host, Signature=abc"
		invoke   = "/2015-03-31/functions/capacity-local-TerminateNode/invocations"
	)

	tests := []struct {
		name, method, path, auth string
		wantStatus               int
	}{
		{"workflow invoke, function error", http.MethodPost, invoke, kumoAuth, http.StatusBadGateway},
		{"workflow invoke, success", http.MethodPost, invoke + "?ok=1", kumoAuth, http.StatusOK},
		{"SDK invoke, function error", http.MethodPost, invoke, sdkAuth, http.StatusOK},
		{"unsigned invoke", http.MethodPost, invoke, "", http.StatusOK},
		{"another kumo path", http.MethodPost, "/2015-03-31/functions/fn/configuration", kumoAuth, http.StatusOK},
		{"another kumo method", http.MethodGet, invoke, kumoAuth, http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, front.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}

			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}

			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}

			defer func() { _ = resp.Body.Close() }()

			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus || string(body) != errPayload {
				t.Errorf("status %d body %s, want %d with the payload", resp.StatusCode, body, tc.wantStatus)
			}
		})
	}
}

func TestProxyCountsRuntimePolls(t *testing.T) {
	release := make(chan struct{})
	front := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
	})

	p := front.Config.Handler.(*proxy)

	done := make(chan struct{})

	go func() {
		defer close(done)

		resp, err := http.Get(front.URL + "/_runtime/fn/2018-06-01/runtime/invocation/next")
		if err == nil {
			_ = resp.Body.Close()
		}
	}()

	waitFor(t, func() bool { return p.polling("fn") == 1 })

	if n := p.polling("other"); n != 0 {
		t.Errorf("polling(other) = %d", n)
	}

	close(release)
	<-done
	waitFor(t, func() bool { return p.polling("fn") == 0 })
}

func TestRuntimeNextFunction(t *testing.T) {
	tests := []struct {
		method, path string
		fn           string
		ok           bool
	}{
		{"GET", "/_runtime/capacity-local-api/2018-06-01/runtime/invocation/next", "capacity-local-api", true},
		{"POST", "/_runtime/fn/2018-06-01/runtime/invocation/next", "", false},
		{"GET", "/_runtime/fn/2018-06-01/runtime/invocation/id/response", "", false},
		{"GET", "/_runtime//2018-06-01/runtime/invocation/next", "", false},
		{"GET", "/2015-03-31/functions/fn/invocations", "", false},
	}

	for _, tt := range tests {
		fn, ok := runtimeNextFunction(tt.method, tt.path)
		if fn != tt.fn || ok != tt.ok {
			t.Errorf("runtimeNextFunction(%s %s) = %q, %v", tt.method, tt.path, fn, ok)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()

	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}

		time.Sleep(5 * time.Millisecond)
	}
}

// Every invocation a function's runtime gets carries a trace header, as on AWS with tracing
// active: kumo's is kept, and one is made up when kumo sends none.
func TestProxyGivesEachInvocationATrace(t *testing.T) {
	const kumos = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"

	header := regexp.MustCompile(`^Root=1-[0-9a-f]{8}-[0-9a-f]{24};Parent=[0-9a-f]{16};Sampled=1$`)

	tests := []struct {
		name, path, fromKumo string
		want                 func(got string) bool
	}{
		{"made up when kumo sends none", "/_runtime/fn/2018-06-01/runtime/invocation/next", "", header.MatchString},
		{"kumo's kept", "/_runtime/fn/2018-06-01/runtime/invocation/next", kumos, func(got string) bool { return got == kumos }},
		{"only on next", "/restapis", "", func(got string) bool { return got == "" }},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			front := newTestProxy(t, func(w http.ResponseWriter, _ *http.Request) {
				if tt.fromKumo != "" {
					w.Header().Set(traceIDHeader, tt.fromKumo)
				}

				_, _ = io.WriteString(w, `{}`)
			})

			seen := map[string]bool{}

			for range 2 {
				resp, err := http.Get(front.URL + tt.path)
				if err != nil {
					t.Fatal(err)
				}

				_ = resp.Body.Close()

				got := resp.Header.Get(traceIDHeader)
				if !tt.want(got) {
					t.Fatalf("trace header %q", got)
				}

				seen[got] = true
			}

			if tt.fromKumo == "" && tt.path != "/restapis" && len(seen) != 2 {
				t.Errorf("two invocations share a trace: %v", seen)
			}
		})
	}
}

func TestNewTraceHeaderStampsTheTime(t *testing.T) {
	at := time.Unix(0x5759e988, 0)
	if got := newTraceHeader(at); !strings.HasPrefix(got, "Root=1-5759e988-") {
		t.Errorf("header %q, want Root=1-5759e988-...", got)
	}
}

// TestProxyStableAPIID: the URL make run prints names the RestApi by its stable id, the same
// at every run; the proxy sends its calls, in the path form and on the execute-api host, to
// the id kumo drew this run, and still takes kumo's id.
func TestProxyStableAPIID(t *testing.T) {
	got := make(chan seen, 1)
	kumoSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{host: r.Host, path: r.URL.Path}
	}))
	t.Cleanup(kumoSrv.Close)
	p, err := newProxy(kumoSrv.URL, "4566", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	stable := stableAPIID("capacity-local", "Api")
	p.setAPIIDs(map[string]string{"5f2c9e1a-b": stable})
	front := httptest.NewServer(p)
	t.Cleanup(func() { front.Close(); p.close() })

	tests := []struct {
		name, host, path string
		want             seen
	}{
		{"stable id, path form", "", "/restapis/" + stable + "/local/_user_request_/v1/nodes",
			seen{host: "5f2c9e1a-b.execute-api.localhost:4566", path: "/local/v1/nodes"}},
		{"stable id, execute-api host", stable + ".execute-api.localhost:4566", "/local/v1/nodes",
			seen{host: "5f2c9e1a-b.execute-api.localhost:4566", path: "/local/v1/nodes"}},
		{"kumo's id, path form", "", "/restapis/5f2c9e1a-b/local/_user_request_/v1/nodes",
			seen{host: "5f2c9e1a-b.execute-api.localhost:4566", path: "/local/v1/nodes"}},
		{"another id: passed as it is", "other1.execute-api.localhost:4566", "/local/v1/nodes",
			seen{host: "other1.execute-api.localhost:4566", path: "/local/v1/nodes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, front.URL+tt.path, nil)
			if tt.host != "" {
				req.Host = tt.host
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if s := <-got; s != tt.want {
				t.Errorf("kumo saw %+v, want %+v", s, tt.want)
			}
		})
	}

	if stableAPIID("capacity-local", "Api") != stable || stableAPIID("capacity-dev", "Api") == stable || stableAPIID("capacity-local", "Api2") == stable {
		t.Error("stableAPIID is not one id per stack and logical id")
	}
}
