package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// The eviction notice (contract v2, notice revision): before the grace period of a reclaim,
// the service tells each evicted VM's agent when it will be terminated, so that the guest can
// checkpoint. Signed, verified, answered and replay-protected exactly as terminate is:
//
//	POST {base}/v1/vms/{vmId}/notice   body NoticeRequest (its SHA-256 is in the signature)
//	    200 NoticeResponse {"vmId":"…","reclaimId":"…","terminateAfter":"…","state":"noticed","alreadyNoticed":false}
//	    404 {"vmId":"…","state":"unknown"}   the node has no such VM
//
// Idempotent per (vmId, reclaimId): a repeat answers 200 with alreadyNoticed true. An agent
// that predates notices has no such route: its 404 is not the unknown-VM answer (or it
// answers 405 or 501), which the client reports as ErrNoticeUnsupported. The service then
// records the notice as unsupported and terminates after the grace all the same: no
// advertisement is needed, the route's absence is the negotiation.
const (
	// NoticeReasonReclaim: the node's owner takes the capacity back.
	NoticeReasonReclaim = "reclaim"
	// StateNoticed is the state of a 200 notice answer.
	StateNoticed = "noticed"
)

// NoticeRequest is the body of a notice call.
type NoticeRequest struct {
	VMID      string `json:"vmId"`
	ReclaimID string `json:"reclaimId"`
	// TerminateAfter is RFC 3339 UTC: the VM is not terminated before it.
	TerminateAfter string `json:"terminateAfter"`
	Reason         string `json:"reason"` // NoticeReasonReclaim
}

// NoticeResponse is the body of a notice call's 200.
type NoticeResponse struct {
	VMID           string `json:"vmId"`
	ReclaimID      string `json:"reclaimId"`
	TerminateAfter string `json:"terminateAfter"`
	State          string `json:"state"` // StateNoticed
	AlreadyNoticed bool   `json:"alreadyNoticed"`
}

// ErrNoticeUnsupported: the agent does not implement the notice call. It is the domain's
// error, so that the service records such a notice as unsupported.
var ErrNoticeUnsupported = capacity.ErrNoticeUnsupported

// NoticePath is the path of the notice call, relative to the endpoint, in escaped form.
func NoticePath(vmID string) string { return StatusPath(vmID) + "/notice" }

// Notice tells the agent of node nodeID, at endpoint baseURL, that vmID will be terminated
// after req.TerminateAfter (req.VMID is set to vmID). It returns true when the agent knew the
// VM, false (no error) when the node has no such VM, and an *Error wrapping
// ErrNoticeUnsupported when the agent has no notice call.
func (c *Client) Notice(ctx context.Context, baseURL, nodeID, vmID string, req NoticeRequest) (bool, error) {
	cl := call{c: c, op: "notice", nodeID: nodeID, vmID: vmID, endpoint: redact(baseURL)}
	req.VMID = vmID
	reqBody, err := json.Marshal(req)
	if err != nil {
		return false, cl.fail(0, false, fmt.Errorf("encoding notice: %w", err))
	}
	status, body, err := cl.do(ctx, http.MethodPost, baseURL, NoticePath(vmID), reqBody)
	if err != nil {
		return false, err
	}
	switch status {
	case http.StatusOK:
		var nr NoticeResponse
		if err := decodeFor(body, vmID, &nr, &nr.VMID); err != nil {
			return false, cl.contractError(status, err)
		}
		if nr.State != StateNoticed || nr.ReclaimID != req.ReclaimID {
			return false, cl.contractError(status, fmt.Errorf("state %q for reclaim %q, want %q for %q", nr.State, nr.ReclaimID, StateNoticed, req.ReclaimID))
		}
		return true, nil
	case http.StatusNotFound:
		if unknownVM(body, vmID) == nil {
			return false, nil
		}
		// Any other 404 (signed: do verified it) is an agent without the route.
		return false, cl.fail(status, false, ErrNoticeUnsupported)
	case http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return false, cl.fail(status, false, ErrNoticeUnsupported)
	}
	return false, cl.statusError(status, body)
}

// Notice tells vmID's agent on node of its eviction, signed with the node's own key: an
// unknown VM is capacity.ErrNoticeUnknownVM, an agent without notices ErrNoticeUnsupported.
func (a NodeAgent) Notice(ctx context.Context, node capacity.Node, n capacity.EvictionNotice) error {
	c := *a.Client
	c.Keys = a.keysOf(node)
	// Whole seconds, rounded down: the guest is never told a time after the termination may
	// start (the workflow holds the round until the exact terminateAfter: stepfn.InputOf).
	known, err := c.Notice(ctx, node.AgentEndpoint, node.ID, n.VMID, NoticeRequest{
		ReclaimID: n.ReclaimID, TerminateAfter: n.TerminateAfter.UTC().Format(time.RFC3339), Reason: n.Reason,
	})
	switch {
	case err != nil:
		return err // ErrNoticeUnsupported is the domain's already
	case !known:
		return capacity.ErrNoticeUnknownVM
	}
	return nil
}
