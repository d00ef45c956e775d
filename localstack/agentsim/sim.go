// Package agentsim simulates the agents of many GPU nodes for the local stack and for tests:
// one real HTTP server on 127.0.0.1 (a random port, or StartOn's) that serves the node-agent contract of
// shared/agent for every node under its own prefix, so node N's endpoint is
// Endpoint(N) = URL() + "/" + N. Each node's agent holds only its own node's keys (contract
// v2): the simulator gets them from the KeySource given to Start the first time it sees the
// node (or from SetNodeKeys), and checks requests for node N with an agent.Verifier of its own
// for N (node id, keys and nonce cache), which also signs its answers. It answers 401 to any
// other request and counts it in Refused.
//
// VMs live in memory, per node: those it is given (AddVM, the admin API) and, with
// LearnPlacements, those the API placed, read from the state table when a call names a VM
// the node does not know. A terminate call for a running or terminating VM makes it
// terminated (a termination); for a terminated VM it answers 200 alreadyGone; for a VM the
// node does not have, 404. TerminateCalls counts every terminate call that passed the
// signature check, whatever it was answered; Terminations counts only state changes.
//
// # Faults
//
// Fault knobs apply to terminate calls only (status calls are always answered at once and
// truthfully), to one VM, or to every VM of a node when the VM id is "":
//
//   - FailNext(n): the next n calls are answered 500 and change nothing.
//   - FailAlways(on): every call is answered 500 and changes nothing.
//   - DropNext(n): the next n calls get the start of a 200 and then the connection is
//     closed (hijacked) mid-answer; they change nothing.
//   - SetFaultRate(rate): each call fails at random with probability rate, half of them
//     answered 500 and half dropped mid-answer; they change nothing. A flaky agent, not a dead
//     one: a VM never gets more than MaxFaultsInARow of these in a row, so a termination
//     under it still ends within the workflow's rounds (FailAlways is the dead agent).
//     RandomFaults counts them.
//   - SetLatency(d): every call waits d before the agent acts. The agent then acts even if the
//     caller has given up (a real agent finishes a termination it started), so a client
//     timeout followed by a retry shows the "acted, but the answer was lost" case: two calls,
//     one termination, the second alreadyGone.
//
// A call takes at most one fault, checked in this order, the VM's before the node's: drop,
// always fail, fail next, then the fault rate (the VM's if set, else the node's). Latency
// comes on top of any of them.
//
// # Admin API
//
// Unsigned, and refused (403) unless the caller's address is loopback. Bodies are JSON with
// unknown fields refused; answers are JSON, {"error": "…"} on failure.
//
//	POST /_admin/vms     {"node","vmId","state"}       add or set a VM (state running|terminating|terminated); 204
//	GET  /_admin/vms?node=N[&vmId=V]                  {"node","vmId","state","terminateCalls","terminations"}, or a list of every VM of N
//	POST /_admin/keys    {"node","key","rotate"?}                install a key (base64) on the node's agent; 204
//	POST /_admin/faults  {"node","vmId"?,"failNext"?,"dropNext"?,"failAlways"?,"latencyMs"?,"faultRate"?,
//	                      "noticesUnsupported"?,"noticeLatencyMs"?}
//	                     sets the knobs given (vmId absent or "" = the whole node); 204
//	GET  /_admin/notices?node=N[&vmId=V]              the eviction notices each VM received, as its guest reads them
//	POST /_admin/reset                                 forget every VM, counter and fault; 204
//
// The node id "_admin" is therefore reserved. All methods are safe for concurrent use.
package agentsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/openrelay/capacity/shared/agent"
)

// Sim is a running simulator. Start it, Close it.
type Sim struct {
	logger *slog.Logger
	srv    *http.Server
	url    string
	done   chan struct{} // closed by Close; ends injected latency early
	once   sync.Once
	keys   KeySource

	mu         sync.Mutex
	nodes      map[string]*node
	agents     map[string]*agent.Verifier // per node; kept by Reset, like a fleet's provisioning
	keyOverlap time.Duration
	refused    int
	rnd        *rand.Rand // draws of the fault rate
	random     int        // faults drawn by the fault rate
	placements NodeLoader // LearnPlacements; nil: the node knows only the VMs it is given
}

// MaxFaultsInARow bounds the random faults (SetFaultRate) one VM gets in a row.
const MaxFaultsInARow = 2

// KeySource provisions a node's agent with its keys, current first.
type KeySource func(nodeID string) ([][]byte, error)

// DerivedKeys gives each node's agent its own key derived from master, as the service derives
// it (agent.NodeKey), and nothing else.
func DerivedKeys(master []byte) KeySource {
	return func(nodeID string) ([][]byte, error) {
		k, err := agent.NodeKey(master, nodeID)
		if err != nil {
			return nil, err
		}
		return [][]byte{k}, nil
	}
}

type node struct {
	vms    map[string]*vm
	faults faults
}

type vm struct {
	state        string // "" while the node does not have the VM (only counted)
	calls        int
	terminations int
	terminatedAt time.Time // when a call last moved it to terminated
	faults       faults
	inARow       int      // random faults since the last call that had none
	notices      []Notice // eviction notices received, oldest first, one per reclaim
}

type faults struct {
	failNext   int
	dropNext   int
	failAlways bool
	latency    time.Duration
	rate       float64 // share of calls failed at random
	// Notice calls only (see notices.go).
	noticesUnsupported bool
	noticeLatency      time.Duration
}

type fault int

const (
	noFault fault = iota
	faultDrop
	faultFail
)

// Start serves a simulator on 127.0.0.1 at a random port whose node agents get their keys from
// keys. logger may be nil.
func Start(keys KeySource, logger *slog.Logger) (*Sim, error) {
	return StartOn("127.0.0.1:0", keys, logger)
}

// StartOn is Start on addr, so that the URL a user was given stays the same from run to run;
// when addr is taken (another stack's simulator, say) it falls back to a random port of the
// same host, and says so.
func StartOn(addr string, keys KeySource, logger *slog.Logger) (*Sim, error) {
	if keys == nil {
		return nil, errors.New("start agent simulator: no key source")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		host, _, _ := net.SplitHostPort(addr)
		if ln, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err == nil {
			logger.Warn("agent simulator address taken: serving on another port", "wanted", addr, "addr", ln.Addr().String())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("start agent simulator: %w", err)
	}
	s := &Sim{
		logger: logger.With("component", "agentsim"),
		url:    "http://" + ln.Addr().String(),
		done:   make(chan struct{}),
		keys:   keys,
		nodes:  make(map[string]*node),
		agents: make(map[string]*agent.Verifier),
		rnd:    rand.New(rand.NewPCG(1, 2)), // fixed: a run's share of faults is reproducible
	}
	s.srv = &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("agent simulator stopped", "error", err.Error())
		}
	}()
	return s, nil
}

// URL is the server's base URL, e.g. "http://127.0.0.1:37411".
func (s *Sim) URL() string { return s.url }

// Endpoint is the agent endpoint of a node, to store on the node item.
func (s *Sim) Endpoint(nodeID string) string { return s.url + "/" + url.PathEscape(nodeID) }

// Close stops the server. Calls waiting out injected latency are answered 503 and change
// nothing. Safe to call more than once.
func (s *Sim) Close() {
	s.once.Do(func() {
		close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.srv.Close()
		}
	})
}

// SetNodeKeys gives node nodeID's agent these keys (current first) in place of the ones it
// had, as an operator does during a rotation. Its nonce cache is kept.
func (s *Sim) SetNodeKeys(nodeID string, keys ...[]byte) error {
	if !validNodeID(nodeID) || len(keys) == 0 || slices.ContainsFunc(keys, func(k []byte) bool { return len(k) == 0 }) {
		return fmt.Errorf("set keys of node %q: invalid node id or no key", nodeID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.agents[nodeID]; v != nil {
		v.SetKeys(keys...)
		return nil
	}
	s.agents[nodeID] = &agent.Verifier{NodeID: nodeID, Keys: keys, Logger: s.logger, KeyOverlap: s.keyOverlap}
	return nil
}

// RotateNodeKey installs key on node nodeID's agent as the operator does after a rotation
// (agent.Verifier.RotateKey): from now on the agent accepts key, and the key it held before
// only for the key overlap (SetKeyOverlap; agent.DefaultKeyOverlap unless set), then no more.
func (s *Sim) RotateNodeKey(nodeID string, key []byte) error {
	if !validNodeID(nodeID) || len(key) == 0 {
		return fmt.Errorf("rotate key of node %q: invalid node id or no key", nodeID)
	}
	v, err := s.verifier(nodeID)
	if err != nil {
		return err
	}
	v.RotateKey(key)
	return nil
}

// SetKeyOverlap sets how long the agents keep accepting a key RotateNodeKey replaced, for
// rotations from now on (0: agent.DefaultKeyOverlap).
func (s *Sim) SetKeyOverlap(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keyOverlap = d
	for _, v := range s.agents {
		v.KeyOverlap = d
	}
}

// verifier returns node nodeID's agent, provisioning its keys on first sight.
func (s *Sim) verifier(nodeID string) (*agent.Verifier, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.agents[nodeID]; v != nil {
		return v, nil
	}
	keys, err := s.keys(nodeID)
	if err != nil {
		return nil, fmt.Errorf("keys of node %q: %w", nodeID, err)
	}
	v := &agent.Verifier{NodeID: nodeID, Keys: keys, Logger: s.logger, KeyOverlap: s.keyOverlap}
	s.agents[nodeID] = v
	return v, nil
}

// AddVM gives node a VM in state (agent.StateRunning, StateTerminating or StateTerminated), or
// sets the state of the VM it has; counters and faults are kept.
func (s *Sim) AddVM(nodeID, vmID, state string) error {
	switch {
	case !validNodeID(nodeID):
		return fmt.Errorf("add vm %q: invalid node id %q", vmID, nodeID)
	case !agent.ValidVMID(vmID):
		return fmt.Errorf("add vm %q to node %q: invalid vm id", vmID, nodeID)
	case !agent.ValidState(state):
		return fmt.Errorf("add vm %q to node %q: invalid state %q", vmID, nodeID, state)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vm(nodeID, vmID).state = state
	return nil
}

// State is the VM's state, or agent.StateUnknown when the node does not have it (having
// learned the node's placements first, with LearnPlacements).
func (s *Sim) State(nodeID, vmID string) string {
	s.learnIfUnknown(context.Background(), nodeID, vmID)
	return s.state(nodeID, vmID)
}

// state is State without learning.
func (s *Sim) state(nodeID, vmID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.lookup(nodeID, vmID); v != nil && v.state != "" {
		return v.state
	}
	return agent.StateUnknown
}

// TerminateCalls counts the signed terminate calls for the VM, whatever they were answered.
func (s *Sim) TerminateCalls(nodeID, vmID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.lookup(nodeID, vmID); v != nil {
		return v.calls
	}
	return 0
}

// Terminations counts the calls that moved the VM from running or terminating to terminated.
func (s *Sim) Terminations(nodeID, vmID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.lookup(nodeID, vmID); v != nil {
		return v.terminations
	}
	return 0
}

// TerminatedAt is when a call last moved the VM to terminated; zero if none has.
func (s *Sim) TerminatedAt(nodeID, vmID string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.lookup(nodeID, vmID); v != nil {
		return v.terminatedAt
	}
	return time.Time{}
}

// Refused counts requests to node paths that the signature check refused.
func (s *Sim) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// FailNext answers the next n terminate calls for the VM (vmID "": for any VM of the node)
// with 500. n = 0 clears it.
func (s *Sim) FailNext(nodeID, vmID string, n int) {
	s.setFaults(nodeID, vmID, func(f *faults) { f.failNext = max(n, 0) })
}

// DropNext closes the connection mid-answer on the next n terminate calls for the VM (vmID "":
// for any VM of the node). n = 0 clears it.
func (s *Sim) DropNext(nodeID, vmID string, n int) {
	s.setFaults(nodeID, vmID, func(f *faults) { f.dropNext = max(n, 0) })
}

// FailAlways answers every terminate call for the VM (vmID "": for any VM of the node) with
// 500 while on.
func (s *Sim) FailAlways(nodeID, vmID string, on bool) {
	s.setFaults(nodeID, vmID, func(f *faults) { f.failAlways = on })
}

// SetLatency delays every terminate call for the VM (vmID "": for any VM of the node) by d.
// The VM's and the node's latencies add up. d = 0 clears it.
func (s *Sim) SetLatency(nodeID, vmID string, d time.Duration) {
	s.setFaults(nodeID, vmID, func(f *faults) { f.latency = max(d, 0) })
}

// SetFaultRate fails a share rate (0..1) of the terminate calls for the VM (vmID "": for any
// VM of the node) at random, half with 500 and half by dropping the connection, never more
// than MaxFaultsInARow in a row for one VM. rate = 0 clears it.
func (s *Sim) SetFaultRate(nodeID, vmID string, rate float64) {
	s.setFaults(nodeID, vmID, func(f *faults) { f.rate = min(max(rate, 0), 1) })
}

// RandomFaults counts the calls failed by a fault rate (SetFaultRate).
func (s *Sim) RandomFaults() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.random
}

// ClearFaults turns every fault knob off, keeping VMs and counters.
func (s *Sim) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		n.faults = faults{}
		for _, v := range n.vms {
			v.faults = faults{}
		}
	}
}

// Reset forgets every VM, counter and fault.
func (s *Sim) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes = make(map[string]*node)
	s.refused = 0
	s.random = 0
}

func (s *Sim) setFaults(nodeID, vmID string, set func(*faults)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if vmID == "" {
		set(&s.node(nodeID).faults)
		return
	}
	set(&s.vm(nodeID, vmID).faults)
}

// node returns the node, creating it. s.mu must be held.
func (s *Sim) node(nodeID string) *node {
	n := s.nodes[nodeID]
	if n == nil {
		n = &node{vms: make(map[string]*vm)}
		s.nodes[nodeID] = n
	}
	return n
}

// vm returns the VM's record, creating it (unknown to the node). s.mu must be held.
func (s *Sim) vm(nodeID, vmID string) *vm {
	n := s.node(nodeID)
	v := n.vms[vmID]
	if v == nil {
		v = &vm{}
		n.vms[vmID] = v
	}
	return v
}

// lookup returns the VM's record or nil, creating nothing. s.mu must be held.
func (s *Sim) lookup(nodeID, vmID string) *vm {
	if n := s.nodes[nodeID]; n != nil {
		return n.vms[vmID]
	}
	return nil
}

// takeFault picks the fault for one call and uses it up, the VM's knobs before the node's.
// s.mu must be held.
func (s *Sim) takeFault(n *node, v *vm) fault {
	f := countedFault(n, v)
	if f != noFault {
		return f
	}
	rate := n.faults.rate
	if v.faults.rate > 0 {
		rate = v.faults.rate
	}
	if rate > 0 && v.inARow < MaxFaultsInARow && s.rnd.Float64() < rate {
		v.inARow++
		s.random++
		if s.rnd.IntN(2) == 0 {
			return faultDrop
		}
		return faultFail
	}
	v.inARow = 0
	return noFault
}

// countedFault is the fault of the knobs other than the rate, if any, used up.
func countedFault(n *node, v *vm) fault {
	for _, f := range []*faults{&v.faults, &n.faults} {
		if f.dropNext > 0 {
			f.dropNext--
			return faultDrop
		}
	}
	for _, f := range []*faults{&v.faults, &n.faults} {
		if f.failAlways {
			return faultFail
		}
	}
	for _, f := range []*faults{&v.faults, &n.faults} {
		if f.failNext > 0 {
			f.failNext--
			return faultFail
		}
	}
	return noFault
}

func validNodeID(id string) bool { return agent.ValidVMID(id) && id != adminPrefix }
