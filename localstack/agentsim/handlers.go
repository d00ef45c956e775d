package agentsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/openrelay/capacity/shared/agent"
)

const adminPrefix = "_admin"

func (s *Sim) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /{node}/v1/vms/{vm}/terminate", s.signed(s.terminate))
	mux.Handle("GET /{node}/v1/vms/{vm}", s.signed(s.status))
	mux.Handle("POST /{node}/v1/vms/{vm}/notice", s.signed(s.notice))
	mux.HandleFunc("GET /"+adminPrefix+"/notices", s.loopback(s.adminGetNotices))
	mux.HandleFunc("POST /"+adminPrefix+"/vms", s.loopback(s.adminAddVM))
	mux.HandleFunc("GET /"+adminPrefix+"/vms", s.loopback(s.adminGetVM))
	mux.HandleFunc("POST /"+adminPrefix+"/faults", s.loopback(s.adminFaults))
	mux.HandleFunc("POST /"+adminPrefix+"/keys", s.loopback(s.adminKeys))
	mux.HandleFunc("POST /"+adminPrefix+"/reset", s.loopback(func(w http.ResponseWriter, _ *http.Request) {
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	}))
	return mux
}

// signed puts h behind the verifier of the node named by the path prefix (each simulated agent
// checks with its own node's keys only) and counts the requests it refuses.
func (s *Sim) signed(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := s.verifier(r.PathValue("node"))
		if err != nil {
			s.logger.Warn("agent request refused", "node", r.PathValue("node"), "error", err.Error())
			agent.WriteError(w, http.StatusUnauthorized, "unauthorized: this node's agent has no key")
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
			return
		}
		reached := false
		v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached = true
			h(w, r)
		})).ServeHTTP(w, r)
		if !reached {
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
		}
	})
}

func (s *Sim) terminate(w http.ResponseWriter, r *http.Request) {
	nodeID, vmID := r.PathValue("node"), r.PathValue("vm")
	s.learnIfUnknown(r.Context(), nodeID, vmID)
	// Count and pick the fault on arrival, so that concurrent calls use up a fault in the
	// order they arrive.
	s.mu.Lock()
	n, v := s.node(nodeID), s.vm(nodeID, vmID)
	v.calls++
	call := v.calls
	delay := n.faults.latency + v.faults.latency
	f := s.takeFault(n, v)
	s.mu.Unlock()
	log := s.logger.With("node", nodeID, "vmId", vmID, "call", call)

	if !s.delay(w, delay) {
		return
	}
	switch f {
	case faultDrop:
		log.Info("terminate: dropping the connection (injected fault)")
		dropConnection(w)
		return
	case faultFail:
		log.Info("terminate: failing with 500 (injected fault)")
		agent.WriteError(w, http.StatusInternalServerError, "injected fault")
		return
	}

	s.mu.Lock()
	prev := v.state
	if prev == agent.StateRunning || prev == agent.StateTerminating {
		v.state = agent.StateTerminated
		v.terminations++
		v.terminatedAt = time.Now()
	}
	s.mu.Unlock()

	switch prev {
	case "":
		log.Info("terminate: unknown vm")
		agent.WriteJSON(w, http.StatusNotFound, agent.StatusResponse{VMID: vmID, State: agent.StateUnknown})
	case agent.StateTerminated:
		log.Info("terminate: already terminated")
		agent.WriteJSON(w, http.StatusOK, agent.TerminateResponse{VMID: vmID, State: agent.StateTerminated, AlreadyGone: true})
	default:
		log.Info("terminate: terminated", "was", prev)
		agent.WriteJSON(w, http.StatusOK, agent.TerminateResponse{VMID: vmID, State: agent.StateTerminated})
	}
}

func (s *Sim) status(w http.ResponseWriter, r *http.Request) {
	vmID := r.PathValue("vm")
	s.learnIfUnknown(r.Context(), r.PathValue("node"), vmID)
	state := s.State(r.PathValue("node"), vmID)
	if state == agent.StateUnknown {
		agent.WriteJSON(w, http.StatusNotFound, agent.StatusResponse{VMID: vmID, State: agent.StateUnknown})
		return
	}
	agent.WriteJSON(w, http.StatusOK, agent.StatusResponse{VMID: vmID, State: state})
}

// delay waits d before the agent acts, not cut short by the caller hanging up (see "Faults" in
// the package comment); false, with the answer sent, when the simulator closed meanwhile.
func (s *Sim) delay(w http.ResponseWriter, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.done:
		agent.WriteError(w, http.StatusServiceUnavailable, "agent shutting down")
		return false
	}
}

// dropConnection starts a 200 whose body never arrives, then closes the connection, so the
// client sees an answer break off mid-way.
func dropConnection(w http.ResponseWriter) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): abort the stream instead.
		panic(http.ErrAbortHandler)
	}
	defer conn.Close()
	buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{\"vmId\":")
	_ = buf.Flush() // the connection is closed next either way
}

// loopback refuses admin calls from anywhere but this machine. The server listens on
// 127.0.0.1 only, so this guards against the listener ever being widened.
func (s *Sim) loopback(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			agent.WriteError(w, http.StatusForbidden, "admin API is loopback only")
			return
		}
		h(w, r)
	}
}

// AdminVM is the body of POST /_admin/vms and the answer of GET /_admin/vms.
type AdminVM struct {
	Node           string `json:"node"`
	VMID           string `json:"vmId"`
	State          string `json:"state"`
	TerminateCalls int    `json:"terminateCalls,omitempty"`
	Terminations   int    `json:"terminations,omitempty"`
}

// AdminFaults is the body of POST /_admin/faults. Absent knobs are left as they are.
type AdminFaults struct {
	Node       string   `json:"node"`
	VMID       string   `json:"vmId,omitempty"`
	FailNext   *int     `json:"failNext,omitempty"`
	DropNext   *int     `json:"dropNext,omitempty"`
	FailAlways *bool    `json:"failAlways,omitempty"`
	LatencyMs  *int64   `json:"latencyMs,omitempty"`
	FaultRate  *float64 `json:"faultRate,omitempty"`
	// Notice calls only: answer them as an agent without the notice route does, or late.
	NoticesUnsupported *bool  `json:"noticesUnsupported,omitempty"`
	NoticeLatencyMs    *int64 `json:"noticeLatencyMs,omitempty"`
}

// AdminKeys is the body of POST /_admin/keys: install Key (base64) on Node's agent, as its
// operator does with the key a registration, an owner change or a rotation answered. Rotate
// keeps the key it replaces for the overlap (RotateNodeKey); without it the agent holds Key
// alone (SetNodeKeys).
type AdminKeys struct {
	Node   string `json:"node"`
	Key    []byte `json:"key"`
	Rotate bool   `json:"rotate,omitempty"`
}

func (s *Sim) adminKeys(w http.ResponseWriter, r *http.Request) {
	var in AdminKeys
	if err := decode(w, r, &in); err != nil {
		agent.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	install := func() error { return s.SetNodeKeys(in.Node, in.Key) }
	if in.Rotate {
		install = func() error { return s.RotateNodeKey(in.Node, in.Key) }
	}
	if err := install(); err != nil {
		agent.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Sim) adminAddVM(w http.ResponseWriter, r *http.Request) {
	var in AdminVM
	if err := decode(w, r, &in); err != nil {
		agent.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	if in.TerminateCalls != 0 || in.Terminations != 0 {
		agent.WriteError(w, http.StatusBadRequest, "counters cannot be set")
		return
	}
	if err := s.AddVM(in.Node, in.VMID, in.State); err != nil {
		agent.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Sim) adminGetVM(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	nodeID, vmID := q.Get("node"), q.Get("vmId")
	if nodeID == "" {
		agent.WriteError(w, http.StatusBadRequest, "query parameter node is required (vmId: one VM, else all)")
		return
	}
	s.learn(r.Context(), nodeID)
	if vmID == "" { // every VM of the node, by id
		s.mu.Lock()
		all := []AdminVM{}
		if n := s.nodes[nodeID]; n != nil {
			for _, id := range slices.Sorted(maps.Keys(n.vms)) {
				v := n.vms[id]
				all = append(all, AdminVM{Node: nodeID, VMID: id, State: v.state, TerminateCalls: v.calls, Terminations: v.terminations})
			}
		}
		s.mu.Unlock()
		agent.WriteJSON(w, http.StatusOK, all)
		return
	}
	s.mu.Lock()
	out := AdminVM{Node: nodeID, VMID: vmID, State: agent.StateUnknown}
	if v := s.lookup(nodeID, vmID); v != nil {
		if v.state != "" {
			out.State = v.state
		}
		out.TerminateCalls, out.Terminations = v.calls, v.terminations
	}
	s.mu.Unlock()
	agent.WriteJSON(w, http.StatusOK, out)
}

func (s *Sim) adminFaults(w http.ResponseWriter, r *http.Request) {
	var in AdminFaults
	if err := decode(w, r, &in); err != nil {
		agent.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch {
	case !validNodeID(in.Node):
		agent.WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid node %q", in.Node))
		return
	case in.VMID != "" && !agent.ValidVMID(in.VMID):
		agent.WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid vmId %q", in.VMID))
		return
	case in.FailNext != nil && *in.FailNext < 0, in.DropNext != nil && *in.DropNext < 0,
		in.LatencyMs != nil && *in.LatencyMs < 0, in.NoticeLatencyMs != nil && *in.NoticeLatencyMs < 0:
		agent.WriteError(w, http.StatusBadRequest, "failNext, dropNext, latencyMs and noticeLatencyMs must not be negative")
		return
	case in.FaultRate != nil && (*in.FaultRate < 0 || *in.FaultRate > 1):
		agent.WriteError(w, http.StatusBadRequest, "faultRate must be between 0 and 1")
		return
	}
	// One lock for all the knobs, so a concurrent call sees all of them or none.
	s.setFaults(in.Node, in.VMID, func(f *faults) {
		if in.FailNext != nil {
			f.failNext = *in.FailNext
		}
		if in.DropNext != nil {
			f.dropNext = *in.DropNext
		}
		if in.FailAlways != nil {
			f.failAlways = *in.FailAlways
		}
		if in.LatencyMs != nil {
			f.latency = time.Duration(*in.LatencyMs) * time.Millisecond
		}
		if in.FaultRate != nil {
			f.rate = *in.FaultRate
		}
		if in.NoticesUnsupported != nil {
			f.noticesUnsupported = *in.NoticesUnsupported
		}
		if in.NoticeLatencyMs != nil {
			f.noticeLatency = time.Duration(*in.NoticeLatencyMs) * time.Millisecond
		}
	})
	w.WriteHeader(http.StatusNoContent)
}

// decode reads exactly one JSON value with no unknown fields.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding body: %w", err)
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return errors.New("decoding body: more than one JSON value")
	}
	return nil
}
