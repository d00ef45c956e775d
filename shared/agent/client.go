package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// DefaultTimeout bounds one call of a Client whose Timeout is zero.
const DefaultTimeout = 5 * time.Second

// maxResponseBytes bounds what the client reads of an answer; the contract's are tiny.
const maxResponseBytes = 64 << 10

// Client calls node agents, signing every request with the node's current key from Keys and
// accepting an answer only when the node's agent signed it (under the current or a previous
// key): a forged or unsigned "terminated" is never taken as done. It never retries: the
// caller's workflow does, and decides by Error.Retryable. Calls reuse connections (through
// HTTP's transport, or a shared one when HTTP is nil); the client follows no redirects, so a
// signed request is only ever sent to the endpoint it was signed for. Endpoints must be
// https:// unless AllowHTTP is set. Safe for concurrent use.
type Client struct {
	Keys Keys
	// AllowHTTP accepts http:// endpoints. Only for the local stack and tests, whose agents
	// listen on loopback: anywhere else the signed answers would cross the network in clear.
	AllowHTTP bool
	HTTP      *http.Client     // nil: a shared client with its own connection pool
	Now       func() time.Time // nil: time.Now; the signature's timestamp
	// Timeout bounds each call, on top of the context's deadline (0: DefaultTimeout).
	Timeout time.Duration
	// MaxSkew bounds how far an answer's timestamp may be from now (0: DefaultMaxSkew).
	MaxSkew time.Duration
}

// Result is the outcome of a successful terminate call.
type Result struct {
	VMID string
	// AlreadyGone: the VM was terminated before this call, or the node does not know it.
	AlreadyGone bool
}

// Error is a failed call. Retryable tells a failure worth retrying (no answer, a timeout, a
// dropped connection, 5xx, 408, 429) from one that will fail again (a malformed endpoint or VM
// id, any other 4xx, an answer that breaks the contract). It wraps the underlying error, if any.
type Error struct {
	Op         string // "terminate", "status" or "notice"
	NodeID     string
	VMID       string
	Endpoint   string // the base URL, with any password redacted
	StatusCode int    // 0 when there was no answer
	Message    string // what went wrong; the agent's {"error"} text when it sent one
	Err        error
	retryable  bool
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "agent %s of vm %q on node %q at %s: ", e.Op, e.VMID, e.NodeID, e.Endpoint)
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, "HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
		if e.Message != "" {
			b.WriteString(": ")
		}
	}
	b.WriteString(e.Message)
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Retryable reports whether the same call may succeed later.
func (e *Error) Retryable() bool { return e.retryable }

// IsRetryable reports whether err is an *Error that is retryable. Other errors are not.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable()
}

// Terminate asks the agent of node nodeID, at endpoint baseURL, to terminate vmID. A VM
// already terminated or unknown to the node is a success with AlreadyGone set: terminating is
// idempotent.
func (c *Client) Terminate(ctx context.Context, baseURL, nodeID, vmID string) (Result, error) {
	var res Result
	cl := call{c: c, op: "terminate", nodeID: nodeID, vmID: vmID, endpoint: redact(baseURL)}
	status, body, err := cl.do(ctx, http.MethodPost, baseURL, TerminatePath(vmID), nil)
	if err != nil {
		return res, err
	}
	switch status {
	case http.StatusOK:
		var tr TerminateResponse
		if err := decodeFor(body, vmID, &tr, &tr.VMID); err != nil {
			return res, cl.contractError(status, err)
		}
		if tr.State != StateTerminated {
			return res, cl.contractError(status, fmt.Errorf("state %q, want %q", tr.State, StateTerminated))
		}
		return Result{VMID: vmID, AlreadyGone: tr.AlreadyGone}, nil
	case http.StatusNotFound:
		// The node has no such VM: whatever it was, it is not running there. Only the
		// contract's 404 says so; any other (a wrong prefix, a proxy) proves nothing.
		if err := unknownVM(body, vmID); err != nil {
			return res, cl.contractError(status, err)
		}
		return Result{VMID: vmID, AlreadyGone: true}, nil
	}
	return res, cl.statusError(status, body)
}

// Status asks the agent for vmID's state: StateRunning, StateTerminating or StateTerminated,
// or StateUnknown (and no error) when the node does not know the VM.
func (c *Client) Status(ctx context.Context, baseURL, nodeID, vmID string) (string, error) {
	cl := call{c: c, op: "status", nodeID: nodeID, vmID: vmID, endpoint: redact(baseURL)}
	status, body, err := cl.do(ctx, http.MethodGet, baseURL, StatusPath(vmID), nil)
	if err != nil {
		return "", err
	}
	switch status {
	case http.StatusOK:
		var sr StatusResponse
		if err := decodeFor(body, vmID, &sr, &sr.VMID); err != nil {
			return "", cl.contractError(status, err)
		}
		if !ValidState(sr.State) {
			return "", cl.contractError(status, fmt.Errorf("unknown state %q", sr.State))
		}
		return sr.State, nil
	case http.StatusNotFound:
		if err := unknownVM(body, vmID); err != nil {
			return "", cl.contractError(status, err)
		}
		return StateUnknown, nil
	}
	return "", cl.statusError(status, body)
}

// call is one call of the client, for its errors.
type call struct {
	c                          *Client
	op, nodeID, vmID, endpoint string
}

func (cl call) fail(status int, retryable bool, err error) *Error {
	return &Error{Op: cl.op, NodeID: cl.nodeID, VMID: cl.vmID, Endpoint: cl.endpoint, StatusCode: status,
		Message: err.Error(), Err: err, retryable: retryable}
}

// do sends one signed request and reads the whole answer. An error means there was no
// complete answer; any status is returned for the caller to judge. A 200 or 404, the answers
// that can end a VM's termination, is returned only when the node's agent signed it; any other
// status proves nothing either way and is returned as it is.
func (cl call) do(ctx context.Context, method, baseURL, rel string, reqBody []byte) (int, []byte, error) {
	c := cl.c
	// The check registration applies too, so a registered node's endpoint always passes.
	// Final: the endpoint is stored on the node and will be the same next round.
	base, err := capacity.ParseAgentEndpoint(baseURL, c.AllowHTTP)
	if err != nil {
		return 0, nil, cl.fail(0, false, fmt.Errorf("endpoint refused: %w", err))
	}
	switch {
	case !ValidNodeID(cl.nodeID):
		return 0, nil, cl.fail(0, false, errors.New("invalid node id"))
	case !ValidVMID(cl.vmID):
		return 0, nil, cl.fail(0, false, errors.New("invalid vm id"))
	case c.Keys == nil:
		return 0, nil, cl.fail(0, false, errors.New("client has no keys"))
	}
	fail := func(status int, retryable bool, err error) (int, []byte, error) {
		return 0, nil, cl.fail(status, retryable, err)
	}
	keys, err := c.Keys.NodeKeys(ctx, cl.nodeID)
	if err != nil {
		// Secrets Manager or KMS unreachable or throttled: nothing was sent, and may be next time.
		return fail(0, true, fmt.Errorf("keys of node %q: %w", cl.nodeID, err))
	}
	u, err := joinPath(base, rel)
	if err != nil {
		return fail(0, false, fmt.Errorf("building url: %w", err))
	}
	status, body, heldFallback, err := cl.send(ctx, method, u, reqBody, keys.Current, append([][]byte{keys.Current}, keys.Previous...), keys.Fallback)
	if err == nil && status == http.StatusUnauthorized && heldFallback {
		// The agent proved, by signing its 401 with it, that it holds the previous generation
		// and not the current one yet (rotated, not yet installed): within the overlap, the
		// previous generation once more, and only its answer counts. An unsigned or otherwise
		// signed 401 (a forger on the path) is no reason to sign with the key rotated away.
		status, body, _, err = cl.send(ctx, method, u, reqBody, keys.Fallback, [][]byte{keys.Fallback}, nil)
	}
	return status, body, err
}

// send signs one request, with body (nil for none), with key and reads the whole answer,
// accepting a 200 or 404 only when signed with one of accept. held reports whether the answer
// is a 401 signed with holds (the agent holds that key); always false for a nil holds.
func (cl call) send(ctx context.Context, method string, u *url.URL, reqBody, key []byte, accept [][]byte, holds []byte) (int, []byte, bool, error) {
	c := cl.c
	fail := func(status int, retryable bool, err error) (int, []byte, bool, error) {
		return 0, nil, false, cl.fail(status, retryable, err)
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if reqBody != nil {
		rd = bytes.NewReader(reqBody)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fail(0, false, fmt.Errorf("building request: %w", err))
	}
	req.Header.Set("Accept", "application/json")
	if reqBody != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	if err := Sign(req, cl.nodeID, key, reqBody, now()); err != nil {
		return fail(0, false, err)
	}

	resp, err := c.httpClient().Do(req)
	if err != nil {
		// No answer: refused, reset, timed out, cancelled. All may go better next time,
		// except a certificate the agent will keep presenting.
		return fail(0, !isCertificateError(err), fmt.Errorf("no answer: %w", unwrapURLError(err)))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		// The connection broke mid-answer: the agent may or may not have acted, and
		// terminating again is safe.
		return fail(resp.StatusCode, true, fmt.Errorf("reading answer: %w", err))
	}
	if len(body) > maxResponseBytes {
		return fail(resp.StatusCode, false, fmt.Errorf("answer over %d bytes", maxResponseBytes))
	}
	skew := c.MaxSkew
	if skew <= 0 {
		skew = DefaultMaxSkew
	}
	nonce := req.Header.Get(HeaderNonce)
	switch resp.StatusCode {
	case http.StatusOK, http.StatusNotFound:
		if err := VerifyAnswer(resp.Header, cl.nodeID, accept, resp.StatusCode, nonce, body, now(), skew); err != nil {
			// Retryable: a forger on the path may be gone next round, and the VM must never be
			// taken as terminated on an answer its agent did not give.
			return fail(resp.StatusCode, true, err)
		}
	case http.StatusUnauthorized:
		held := len(holds) > 0 && VerifyAnswer(resp.Header, cl.nodeID, [][]byte{holds}, resp.StatusCode, nonce, body, now(), skew) == nil
		return resp.StatusCode, body, held, nil
	}
	return resp.StatusCode, body, false, nil
}

func (cl call) contractError(status int, err error) error {
	return cl.fail(status, false, fmt.Errorf("answer breaks the agent contract: %w", err))
}

// statusError is the error for an answer that is neither 200 nor 404.
func (cl call) statusError(status int, body []byte) error {
	var er ErrorResponse
	msg := ""
	if json.Unmarshal(body, &er) == nil {
		msg = er.Error
	}
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	retryable := status >= 500 || status == http.StatusTooManyRequests || status == http.StatusRequestTimeout
	return &Error{Op: cl.op, NodeID: cl.nodeID, VMID: cl.vmID, Endpoint: cl.endpoint, StatusCode: status, Message: msg, retryable: retryable}
}

// decodeFor decodes an answer into v and checks that it is about the VM asked for (*id), so
// that a misrouted answer is never taken for this VM's.
func decodeFor(body []byte, vmID string, v any, id *string) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decoding answer: %w", err)
	}
	if *id != vmID {
		return fmt.Errorf("answer is about vm %q", *id)
	}
	return nil
}

// unknownVM checks that a 404 is the agent's "no such VM" answer for vmID.
func unknownVM(body []byte, vmID string) error {
	var sr StatusResponse
	if err := decodeFor(body, vmID, &sr, &sr.VMID); err != nil {
		return fmt.Errorf("404 is not the agent's unknown-VM answer (wrong endpoint?): %w", err)
	}
	if sr.State != StateUnknown {
		return fmt.Errorf("404 with state %q, want %q", sr.State, StateUnknown)
	}
	return nil
}

// defaultHTTP is shared by every Client without HTTP, so all of them reuse one pool.
var defaultHTTP = &http.Client{Transport: newTransport()}

func newTransport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// A termination calls one node's agent for each of its VMs in turn.
	t.MaxIdleConnsPerHost = 16
	return t
}

// httpClient is c.HTTP, or the shared client, with redirects turned off: a copy of an
// http.Client shares its transport, so connections are still reused.
func (c *Client) httpClient() *http.Client {
	hc := defaultHTTP
	if c.HTTP != nil {
		hc = c.HTTP
	}
	cp := *hc
	cp.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cp
}

// redact hides a password in s, if s parses at all.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return s
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func isCertificateError(err error) bool {
	var cv *tls.CertificateVerificationError
	return errors.As(err, &cv)
}
