// Package agent is the contract between the capacity service and the agent that runs on each
// GPU node and can terminate its VMs (contract v2): the HTTP API, per-node keys, the request
// and answer signatures that keep anyone else from terminating VMs or faking their end, a
// client for the service's side and a verifier for the agent's. It imports no AWS package.
//
// Paths are relative to the node's endpoint, the base URL stored on the node item (it may
// carry a path prefix, e.g. "https://agents.example/node-a"); a VM id is always one escaped
// path segment ("vm/1" is sent as "vm%2F1"):
//
//	POST {base}/v1/vms/{vmId}/terminate
//	    200 {"vmId":"…","state":"terminated","alreadyGone":false}  terminated by this call
//	    200 {"vmId":"…","state":"terminated","alreadyGone":true}   was already terminated
//	    404 {"vmId":"…","state":"unknown"}                         the node has no such VM
//	GET  {base}/v1/vms/{vmId}
//	    200 {"vmId":"…","state":"running"|"terminating"|"terminated"}, or 404
//	POST {base}/v1/vms/{vmId}/notice   the eviction notice before a grace period (notice.go)
//
// Terminate is idempotent: the service's workflow retries it, so a second call for a VM that is
// gone answers 200 (or 404) and does nothing. Errors are {"error":"…"}; a request without a
// valid, fresh, unreplayed signature for this node gets 401.
//
// Keys: node N's key is NodeKey(master, N), HKDF-SHA256 over a master secret that only the
// service holds, with info "capacity-agent-v2/node/" + N. An agent is given only its own key.
//
// Every request carries
//
//	X-Agent-Node:      the node id
//	X-Agent-Timestamp: unix seconds
//	X-Agent-Nonce:     16 random bytes, hex
//	X-Agent-Signature: v2=hex(HMAC-SHA256(node key, "capacity-agent-v2 request" "\n"
//	    escaped node id "\n" METHOD "\n" escaped path as sent "\n" timestamp "\n" nonce "\n"
//	    hex(SHA-256(body))))
//
// and every answer to a verified request (whatever its status)
//
//	X-Agent-Timestamp: unix seconds
//	X-Agent-Signature: v2=hex(HMAC-SHA256(the key that signed the request, "capacity-agent-v2 answer" "\n"
//	    escaped node id "\n" status "\n" the request's nonce "\n" timestamp "\n" hex(SHA-256(body))))
//
// (see Sign, SignAnswer, Verifier and VerifyAnswer). The query string is not signed; the
// contract uses none.
package agent

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// VM states as the agent reports them. StateUnknown is the state of a VM the node does not
// have (a 404).
const (
	StateRunning     = "running"
	StateTerminating = "terminating"
	StateTerminated  = "terminated"
	StateUnknown     = "unknown"
)

// TerminateResponse is the body of a terminate call's 200.
type TerminateResponse struct {
	VMID        string `json:"vmId"`
	State       string `json:"state"`
	AlreadyGone bool   `json:"alreadyGone"`
}

// StatusResponse is the body of a status call's 200, and of either call's 404
// (State StateUnknown).
type StatusResponse struct {
	VMID  string `json:"vmId"`
	State string `json:"state"`
}

// ErrorResponse is the body of every other answer.
type ErrorResponse struct {
	Error string `json:"error"`
}

// TerminatePath is the path of the terminate call, relative to the endpoint, in escaped form.
func TerminatePath(vmID string) string { return StatusPath(vmID) + "/terminate" }

// StatusPath is the path of the status call, relative to the endpoint, in escaped form.
func StatusPath(vmID string) string { return "/v1/vms/" + url.PathEscape(vmID) }

// ValidVMID reports whether id can be sent as one path segment. "." and ".." cannot: clients
// and servers clean them away, so a call for VM ".." would reach a different path.
func ValidVMID(id string) bool { return id != "" && id != "." && id != ".." }

// ValidNodeID reports whether id can name a node in the contract: not empty, at most 255
// bytes, no control characters (it travels in a header), not "." or "..".
func ValidNodeID(id string) bool {
	if !ValidVMID(id) || len(id) > 255 {
		return false
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// ValidState reports whether s is a state a VM can be in (StateUnknown is not one).
func ValidState(s string) bool {
	return s == StateRunning || s == StateTerminating || s == StateTerminated
}

// WriteJSON writes v as the JSON body of an answer with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// The status is already sent; a failed write means the caller went away.
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError writes an ErrorResponse.
func WriteError(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, ErrorResponse{Error: msg})
}

// joinPath appends an escaped relative path to the base URL's escaped path, keeping the
// base's prefix and its escaping as they are.
func joinPath(base *url.URL, rel string) (*url.URL, error) {
	u := *base
	escaped := strings.TrimRight(base.EscapedPath(), "/") + rel
	p, err := url.PathUnescape(escaped)
	if err != nil {
		return nil, err
	}
	u.Path, u.RawPath = p, escaped
	return &u, nil
}
