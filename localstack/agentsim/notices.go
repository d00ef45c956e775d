package agentsim

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/openrelay/capacity/shared/agent"
)

// Notice is an eviction notice as the VM's guest reads it, after EC2's spot
// instance-action: the VM is terminated, not before Time.
type Notice struct {
	Action     string    `json:"action"` // "terminate"
	Time       time.Time `json:"time"`   // the notice's terminateAfter
	ReclaimID  string    `json:"reclaimId"`
	Reason     string    `json:"reason"`
	ReceivedAt time.Time `json:"receivedAt"` // when the agent got the call
}

// AdminNotices is one VM's answer of GET /_admin/notices.
type AdminNotices struct {
	Node    string   `json:"node"`
	VMID    string   `json:"vmId"`
	Notices []Notice `json:"notices"`
}

// notice serves the notice call: a VM the node has gets the notice (once per reclaim; a repeat
// is answered alreadyNoticed), one it does not have is a 404 unknown. With the node's or VM's
// noticesUnsupported knob it answers as an agent that predates notices: a plain 404 (signed,
// since the verifier wraps the whole agent), the route being unknown to it.
func (s *Sim) notice(w http.ResponseWriter, r *http.Request) {
	nodeID, vmID := r.PathValue("node"), r.PathValue("vm")
	received := time.Now()
	s.learnIfUnknown(r.Context(), nodeID, vmID)
	s.mu.Lock()
	n, v := s.node(nodeID), s.vm(nodeID, vmID)
	unsupported := n.faults.noticesUnsupported || v.faults.noticesUnsupported
	delay := n.faults.noticeLatency + v.faults.noticeLatency
	s.mu.Unlock()
	if unsupported {
		http.NotFound(w, r)
		return
	}
	if !s.delay(w, delay) {
		return
	}
	var req agent.NoticeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.VMID != vmID || req.ReclaimID == "" {
		agent.WriteError(w, http.StatusBadRequest, "notice body must name this VM and a reclaim")
		return
	}
	after, err := time.Parse(time.RFC3339, req.TerminateAfter)
	if err != nil {
		agent.WriteError(w, http.StatusBadRequest, "terminateAfter: "+err.Error())
		return
	}
	s.mu.Lock()
	known := v.state != ""
	already := slices.ContainsFunc(v.notices, func(n Notice) bool { return n.ReclaimID == req.ReclaimID })
	if known && !already {
		v.notices = append(v.notices, Notice{Action: "terminate", Time: after.UTC(), ReclaimID: req.ReclaimID, Reason: req.Reason, ReceivedAt: received})
	}
	s.mu.Unlock()
	if !known {
		agent.WriteJSON(w, http.StatusNotFound, agent.StatusResponse{VMID: vmID, State: agent.StateUnknown})
		return
	}
	agent.WriteJSON(w, http.StatusOK, agent.NoticeResponse{VMID: vmID, ReclaimID: req.ReclaimID,
		TerminateAfter: req.TerminateAfter, State: agent.StateNoticed, AlreadyNoticed: already})
}

// Notices are the eviction notices the VM received, oldest first.
func (s *Sim) Notices(nodeID, vmID string) []Notice {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.lookup(nodeID, vmID); v != nil {
		return slices.Clone(v.notices)
	}
	return nil
}

// SetNoticesUnsupported makes the VM's agent (vmID "": the node's) answer notice calls as one
// that predates them, while on.
func (s *Sim) SetNoticesUnsupported(nodeID, vmID string, on bool) {
	s.setFaults(nodeID, vmID, func(f *faults) { f.noticesUnsupported = on })
}

// SetNoticeLatency delays every notice call for the VM (vmID "": any VM of the node) by d.
func (s *Sim) SetNoticeLatency(nodeID, vmID string, d time.Duration) {
	s.setFaults(nodeID, vmID, func(f *faults) { f.noticeLatency = max(d, 0) })
}

func (s *Sim) adminGetNotices(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	nodeID, vmID := q.Get("node"), q.Get("vmId")
	if nodeID == "" {
		agent.WriteError(w, http.StatusBadRequest, "query parameter node is required (vmId: one VM, else all)")
		return
	}
	s.mu.Lock()
	all := []AdminNotices{}
	if n := s.nodes[nodeID]; n != nil {
		for _, id := range slices.Sorted(maps.Keys(n.vms)) {
			if vmID == "" || id == vmID {
				all = append(all, AdminNotices{Node: nodeID, VMID: id, Notices: append([]Notice{}, n.vms[id].notices...)})
			}
		}
	}
	s.mu.Unlock()
	agent.WriteJSON(w, http.StatusOK, all)
}
