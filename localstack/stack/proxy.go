package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is the front door on Options.Addr. It forwards everything to kumo with the Host header
// intact (kumo routes execute-api calls on it) and corrects what kumo gets wrong; see
// fixRESTProxyEvent and userRequestTarget.
type proxy struct {
	kumo      *url.URL
	port      string
	transport *http.Transport
	rp        *httputil.ReverseProxy
	log       *slog.Logger

	quota atomic.Pointer[quota.Model] // AWS's quotas, when the stack models them

	mu      sync.Mutex
	pollers map[string]int    // function name -> runtime-API polls that reached kumo and wait there
	apiIDs  map[string]string // stable RestApi id -> kumo's (setAPIIDs)
}

func newProxy(kumoURL, port string, logger *slog.Logger) (*proxy, error) {
	target, err := url.Parse(kumoURL)
	if err != nil {
		return nil, fmt.Errorf("parse kumo URL %q: %w", kumoURL, err)
	}

	p := &proxy{
		kumo: target,
		port: port,
		log:  logger,
		// Every bootstrap process holds a long poll open, so keep plenty of idle connections and
		// never time out waiting for response headers.
		transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		},
		pollers: map[string]int{},
	}

	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		Transport:      p.transport,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.proxyError,
		ErrorLog:       log.New(io.Discard, "", 0),
	}

	return p, nil
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The host the caller named the API by, as the function should see it: the execute-api
	// host of the id the caller used (the path form's id, on this port).
	publicHost := r.Host
	if apiID, _, _, ok := parseUserRequestPath(r.URL.EscapedPath()); ok {
		publicHost = apiID + ".execute-api.localhost:" + p.port
	}
	if out, ok := userRequestTarget(r, p.port, p.apiID); ok {
		r = out
	} else if out, ok := stableHostTarget(r, p.port, p.apiID); ok {
		r = out
	}

	if strings.Contains(r.Host, ".execute-api.") {
		r = r.Clone(r.Context())
		markTrailingSlash(r)
		markHost(r, publicHost)
	}

	if fn, ok := runtimeNextFunction(r.Method, r.URL.Path); ok {
		var done func()

		r, done = p.trackPoll(r, fn)
		defer done()
	}

	if q := p.quota.Load(); q != nil {
		handled, release := q.Handle(w, r)
		defer release()
		if handled {
			return
		}
	}

	p.rp.ServeHTTP(w, r)
}

// setAPIIDs makes the proxy answer each stable RestApi id (stableAPIID) for kumo's.
func (p *proxy) setAPIIDs(kumoToStable map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.apiIDs = map[string]string{}
	for kumoID, stable := range kumoToStable {
		p.apiIDs[stable] = kumoID
	}
}

// apiID is kumo's id of the RestApi a request names: the stable id's, or the id itself.
func (p *proxy) apiID(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if kumoID, ok := p.apiIDs[id]; ok {
		return kumoID
	}
	return id
}

// stableHostTarget turns an execute-api call on a stable id's host,
// {stable id}.execute-api.localhost:{port}, into one on kumo's id's host.
func stableHostTarget(r *http.Request, port string, apiID func(string) string) (*http.Request, bool) {
	id, ok := strings.CutSuffix(r.Host, ".execute-api.localhost:"+port)
	if !ok || apiID(id) == id {
		return nil, false
	}
	out := r.Clone(r.Context())
	out.Host = apiID(id) + ".execute-api.localhost:" + port
	return out, true
}

// close drops the proxy's connections to kumo.
func (p *proxy) close() {
	p.transport.CloseIdleConnections()
}

// modifyResponse rewrites the invocation that kumo hands to a function's runtime, and the
// answer to a function error that kumo's Step Functions engine gets (see workflowInvoke).
func (p *proxy) modifyResponse(resp *http.Response) error {
	if resp.StatusCode != http.StatusOK || resp.Request == nil {
		return nil
	}

	if workflowInvoke(resp.Request) && resp.Header.Get("X-Amz-Function-Error") != "" {
		// On AWS a function error fails the Task state (its Retry and Catch apply: the
		// termination workflow retries States.TaskFailed). kumo's engine passes a 200 on as the
		// state's output, so the workflow would loop on an error payload; it fails the task on
		// any other status, so answer it with one.
		resp.StatusCode = http.StatusBadGateway
		resp.Status = "502 Bad Gateway"
		p.log.Debug("function error: failing the workflow task", "path", resp.Request.URL.Path)

		return nil
	}

	if _, ok := runtimeNextFunction(resp.Request.Method, resp.Request.URL.Path); !ok {
		return nil
	}

	if q := p.quota.Load(); q != nil {
		fn, _ := runtimeNextFunction(resp.Request.Method, resp.Request.URL.Path)
		q.ExecutionStarted(fn, resp.Header.Get("Lambda-Runtime-Aws-Request-Id"))
	}

	if arn := resp.Header.Get("Lambda-Runtime-Invoked-Function-Arn"); arn != "" {
		resp.Header.Set("Lambda-Runtime-Invoked-Function-Arn", fixInvokedFunctionARN(arn))
	}

	if resp.Header.Get(traceIDHeader) == "" {
		// AWS sends one with every invocation when tracing is active; the runner fills the
		// emulator's gap, so that logs, metrics and workflows carry a trace id here too.
		resp.Header.Set(traceIDHeader, newTraceHeader(time.Now()))
	}

	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()

	if err != nil {
		return fmt.Errorf("read invocation: %w", err)
	}

	body = restoreTrailingSlash(fixRESTProxyEvent(body))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))

	return nil
}

// traceIDHeader carries an invocation's X-Ray trace header to the function's runtime.
const traceIDHeader = "Lambda-Runtime-Trace-Id"

// newTraceHeader returns a sampled X-Ray trace header of a new trace started at now:
// Root=1-<8 hex of unix seconds>-<24 random hex>;Parent=<16 random hex>;Sampled=1.
func newTraceHeader(now time.Time) string {
	var b [20]byte

	_, _ = rand.Read(b[:]) // never fails (crypto/rand)

	return fmt.Sprintf("Root=1-%08x-%s;Parent=%s;Sampled=1", now.Unix(), hex.EncodeToString(b[:12]), hex.EncodeToString(b[12:]))
}

func (p *proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	// A bootstrap that stops, or a client that gives up, cancels its request: not an error.
	if errors.Is(err, context.Canceled) || r.Context().Err() != nil {
		return
	}

	p.log.Warn("proxy to kumo failed", "method", r.Method, "path", r.URL.Path, "error", err)
	w.WriteHeader(http.StatusBadGateway)
}

// trackPoll counts the runtime-API long polls per function once they have been written to kumo,
// which is when kumo considers the function backed by a runtime; Start waits on the count.
func (p *proxy) trackPoll(r *http.Request, fn string) (*http.Request, func()) {
	var (
		mu             sync.Mutex
		counted, ended bool
	)

	trace := &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			mu.Lock()
			defer mu.Unlock()

			if info.Err == nil && !ended && !counted {
				counted = true
				p.addPollers(fn, 1)
			}
		},
	}

	done := func() {
		mu.Lock()
		defer mu.Unlock()

		ended = true
		if counted {
			p.addPollers(fn, -1)
		}
	}

	return r.WithContext(httptrace.WithClientTrace(r.Context(), trace)), done
}

func (p *proxy) addPollers(fn string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()

	p.pollers[fn] += n
}

// polling returns how many runtime polls for fn are waiting in kumo.
func (p *proxy) polling(fn string) int {
	p.mu.Lock()
	defer p.mu.Unlock()

	return p.pollers[fn]
}

// kumoScope is how kumo's own service-to-service calls sign (awsauth.ScopeHeader): the
// Step Functions engine's Lambda invokes carry it, SDK clients never do.
const kumoScope = "Credential=kumo/"

// workflowInvoke recognises a Lambda Invoke from kumo's Step Functions engine:
// POST /2015-03-31/functions/<fn>/invocations signed with kumo's internal scope. Invokes from
// SDK clients (tests, make invoke) keep AWS's 200 with X-Amz-Function-Error.
func workflowInvoke(r *http.Request) bool {
	if r.Method != http.MethodPost || !strings.Contains(r.Header.Get("Authorization"), kumoScope) {
		return false
	}

	rest, ok := strings.CutPrefix(r.URL.Path, "/2015-03-31/functions/")
	if !ok {
		return false
	}

	fn, ok := strings.CutSuffix(rest, "/invocations")

	return ok && fn != "" && !strings.Contains(fn, "/")
}

// runtimeNextFunction recognises GET /_runtime/<fn>/2018-06-01/runtime/invocation/next.
func runtimeNextFunction(method, path string) (string, bool) {
	if method != http.MethodGet {
		return "", false
	}

	rest, ok := strings.CutPrefix(path, "/_runtime/")
	if !ok {
		return "", false
	}

	fn, ok := strings.CutSuffix(rest, "/2018-06-01/runtime/invocation/next")
	if !ok || fn == "" || strings.Contains(fn, "/") {
		return "", false
	}

	return fn, true
}

// userRequestPrefix marks LocalStack's path form of an execute-api call.
const userRequestPrefix = "_user_request_"

// userRequestTarget turns LocalStack's path form of an API call,
// /restapis/{apiId}/{stage}/_user_request_/{path...}, into the form kumo serves:
// /{stage}/{path...} on Host {apiId}.execute-api.localhost:{port}. kumo answers the path form
// with 400, and the host form needs DNS for *.localhost, which not every resolver gives.
func userRequestTarget(r *http.Request, port string, apiIDOf func(string) string) (*http.Request, bool) {
	apiID, stage, rest, ok := parseUserRequestPath(r.URL.EscapedPath())
	if !ok {
		return nil, false
	}

	escaped := "/" + stage + rest

	path, err := url.PathUnescape(escaped)
	if err != nil {
		return nil, false
	}

	out := r.Clone(r.Context())
	out.URL.Path = path
	out.URL.RawPath = escaped
	out.Host = apiIDOf(apiID) + ".execute-api.localhost:" + port

	return out, true
}

// parseUserRequestPath splits an escaped /restapis/{apiId}/{stage}/_user_request_[/rest] path.
// rest keeps its escaping and its leading slash ("/" when absent).
func parseUserRequestPath(escaped string) (apiID, stage, rest string, ok bool) {
	trimmed, ok := strings.CutPrefix(escaped, "/restapis/")
	if !ok {
		return "", "", "", false
	}

	parts := strings.SplitN(trimmed, "/", 4)
	if len(parts) < 3 || parts[0] == "" || parts[1] == "" || parts[2] != userRequestPrefix {
		return "", "", "", false
	}

	rest = "/"
	if len(parts) == 4 {
		rest += parts[3]
	}

	return parts[0], parts[1], rest, true
}

// userRequestURL is the local address of an API stage, in the path form the proxy accepts.
func userRequestURL(endpoint, apiID, stage string) string {
	return endpoint + "/restapis/" + apiID + "/" + stage + "/" + userRequestPrefix + "/"
}
