package agentsim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/agent"
)

var master = []byte("sim-test-master-secret-0123456789abcdef")

// keyOf is node's key, as the service derives it.
func keyOf(t *testing.T, node string) []byte {
	t.Helper()
	k, err := agent.NodeKey(master, node)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// start starts a simulator whose agents get their keys derived from master, and a client that
// derives them too, as the terminate-node function does.
func start(t *testing.T) (*Sim, *agent.Client) {
	t.Helper()
	s, err := Start(DerivedKeys(master), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, &agent.Client{Keys: agent.Derived{Masters: agent.StaticMasters{Current: master}}, AllowHTTP: true}
}

func mustAdd(t *testing.T, s *Sim, node, vm, state string) {
	t.Helper()
	if err := s.AddVM(node, vm, state); err != nil {
		t.Fatal(err)
	}
}

// outcome of one terminate call.
type outcome int

const (
	terminated outcome = iota // 200, alreadyGone false
	gone                      // 200 alreadyGone or 404
	retryable
	permanent
)

func outcomeOf(res agent.Result, err error) outcome {
	switch {
	case err == nil && res.AlreadyGone:
		return gone
	case err == nil:
		return terminated
	case agent.IsRetryable(err):
		return retryable
	}
	return permanent
}

func TestTerminateWithFaults(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(s *Sim)
		timeout   time.Duration
		calls     []outcome
		wantState string
		wantTerms int
		// other VM on the same node and a VM on another node, to show where a knob applies
		wantOtherVM, wantOtherNode outcome
	}{
		{name: "no fault", setup: func(*Sim) {},
			calls: []outcome{terminated, gone, gone}, wantState: agent.StateTerminated, wantTerms: 1},
		{name: "fail next 2 on the vm", setup: func(s *Sim) { s.FailNext("node-a", "vm-1", 2) },
			calls: []outcome{retryable, retryable, terminated, gone}, wantState: agent.StateTerminated, wantTerms: 1},
		{name: "fail next 1 on the node", setup: func(s *Sim) { s.FailNext("node-a", "", 1) },
			calls: []outcome{retryable, terminated}, wantState: agent.StateTerminated, wantTerms: 1,
			wantOtherVM: terminated},
		{name: "fail always", setup: func(s *Sim) { s.FailAlways("node-a", "vm-1", true) },
			calls: []outcome{retryable, retryable, retryable, retryable}, wantState: agent.StateRunning, wantTerms: 0},
		{name: "fail always on the node", setup: func(s *Sim) { s.FailAlways("node-a", "", true) },
			calls: []outcome{retryable, retryable}, wantState: agent.StateRunning, wantTerms: 0,
			wantOtherVM: retryable},
		{name: "drop next 2", setup: func(s *Sim) { s.DropNext("node-a", "vm-1", 2) },
			calls: []outcome{retryable, retryable, terminated}, wantState: agent.StateTerminated, wantTerms: 1},
		{name: "drop beats fail", setup: func(s *Sim) { s.DropNext("node-a", "vm-1", 1); s.FailNext("node-a", "vm-1", 1) },
			calls: []outcome{retryable, retryable, terminated}, wantState: agent.StateTerminated, wantTerms: 1},
		{name: "latency under the timeout", setup: func(s *Sim) { s.SetLatency("node-a", "vm-1", 30*time.Millisecond) },
			timeout: 2 * time.Second, calls: []outcome{terminated, gone}, wantState: agent.StateTerminated, wantTerms: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, c := start(t)
			c.Timeout = tc.timeout
			mustAdd(t, s, "node-a", "vm-1", agent.StateRunning)
			mustAdd(t, s, "node-a", "vm-2", agent.StateRunning)
			mustAdd(t, s, "node-b", "vm-1", agent.StateRunning)
			tc.setup(s)
			ctx := context.Background()
			before := time.Now()
			for i, want := range tc.calls {
				res, err := c.Terminate(ctx, s.Endpoint("node-a"), "node-a", "vm-1")
				if got := outcomeOf(res, err); got != want {
					t.Fatalf("call %d: outcome %d (%+v, %v), want %d", i+1, got, res, err, want)
				}
			}
			if got := s.State("node-a", "vm-1"); got != tc.wantState {
				t.Errorf("state = %q, want %q", got, tc.wantState)
			}
			if got := s.TerminateCalls("node-a", "vm-1"); got != len(tc.calls) {
				t.Errorf("TerminateCalls = %d, want %d", got, len(tc.calls))
			}
			if got := s.Terminations("node-a", "vm-1"); got != tc.wantTerms {
				t.Errorf("Terminations = %d, want %d", got, tc.wantTerms)
			}
			if at := s.TerminatedAt("node-a", "vm-1"); at.IsZero() != (tc.wantTerms == 0) || (!at.IsZero() && (at.Before(before) || at.After(time.Now()))) {
				t.Errorf("TerminatedAt = %v with %d terminations", at, tc.wantTerms)
			}
			if got := outcomeOf(c.Terminate(ctx, s.Endpoint("node-a"), "node-a", "vm-2")); got != tc.wantOtherVM {
				t.Errorf("other vm on the node: outcome %d, want %d", got, tc.wantOtherVM)
			}
			if got := outcomeOf(c.Terminate(ctx, s.Endpoint("node-b"), "node-b", "vm-1")); got != tc.wantOtherNode {
				t.Errorf("same vm id on another node: outcome %d, want %d", got, tc.wantOtherNode)
			}
		})
	}
}

// A timeout against injected latency: the agent still acts, so the retry finds the VM gone.
func TestLatencyPastTheTimeout(t *testing.T) {
	s, c := start(t)
	c.Timeout = 50 * time.Millisecond
	mustAdd(t, s, "node-a", "vm-1", agent.StateRunning)
	s.SetLatency("node-a", "", 300*time.Millisecond)

	_, err := c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-1")
	if !agent.IsRetryable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Terminate = %v, want a retryable timeout", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.State("node-a", "vm-1") != agent.StateTerminated {
		if time.Now().After(deadline) {
			t.Fatal("the agent never finished the termination")
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.SetLatency("node-a", "", 0)
	res, err := c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-1")
	if err != nil || !res.AlreadyGone {
		t.Fatalf("retry = %+v, %v; want already gone", res, err)
	}
	if calls, terms := s.TerminateCalls("node-a", "vm-1"), s.Terminations("node-a", "vm-1"); calls != 2 || terms != 1 {
		t.Fatalf("calls %d, terminations %d; want 2, 1", calls, terms)
	}
}

func TestStatesAndUnknownVMs(t *testing.T) {
	s, c := start(t)
	ctx := context.Background()
	tests := []struct {
		node, vm, state string // state "" = not added
		wantOutcome     outcome
		wantTerms       int
	}{
		{"node-a", "vm-run", agent.StateRunning, terminated, 1},
		{"node-a", "vm-ing", agent.StateTerminating, terminated, 1},
		{"node-a", "vm-done", agent.StateTerminated, gone, 0},
		{"node-a", "vm-none", "", gone, 0},
		{"node-never-seen", "vm-1", "", gone, 0},
		{"node a/b", "vm/1", agent.StateRunning, terminated, 1},
	}
	for _, tc := range tests {
		if tc.state != "" {
			mustAdd(t, s, tc.node, tc.vm, tc.state)
		}
		st, err := c.Status(ctx, s.Endpoint(tc.node), tc.node, tc.vm)
		want := tc.state
		if want == "" {
			want = agent.StateUnknown
		}
		if err != nil || st != want {
			t.Errorf("%s/%s: Status = %q, %v; want %q", tc.node, tc.vm, st, err, want)
		}
		if got := outcomeOf(c.Terminate(ctx, s.Endpoint(tc.node), tc.node, tc.vm)); got != tc.wantOutcome {
			t.Errorf("%s/%s: outcome %d, want %d", tc.node, tc.vm, got, tc.wantOutcome)
		}
		if s.TerminateCalls(tc.node, tc.vm) != 1 || s.Terminations(tc.node, tc.vm) != tc.wantTerms {
			t.Errorf("%s/%s: calls %d, terminations %d; want 1, %d", tc.node, tc.vm,
				s.TerminateCalls(tc.node, tc.vm), s.Terminations(tc.node, tc.vm), tc.wantTerms)
		}
		if tc.state != "" && s.State(tc.node, tc.vm) != agent.StateTerminated {
			t.Errorf("%s/%s: state %q after terminate", tc.node, tc.vm, s.State(tc.node, tc.vm))
		}
	}
	for _, bad := range [][3]string{{"", "vm", "running"}, {"_admin", "vm", "running"}, {"n", "..", "running"}, {"n", "vm", "paused"}, {"n", "vm", "unknown"}} {
		if err := s.AddVM(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("AddVM%q accepted", bad)
		}
	}
}

func TestUnsignedRequestsTerminateNothing(t *testing.T) {
	s, _ := start(t)
	mustAdd(t, s, "node-a", "vm-1", agent.StateRunning)
	url := s.Endpoint("node-a") + agent.TerminatePath("vm-1")

	unsigned, _ := http.NewRequest(http.MethodPost, url, nil)
	wrongKey, _ := http.NewRequest(http.MethodPost, url, nil)
	if err := agent.Sign(wrongKey, "node-a", keyOf(t, "node-b"), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	stale, _ := http.NewRequest(http.MethodPost, url, nil)
	if err := agent.Sign(stale, "node-a", keyOf(t, "node-a"), nil, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	otherVM, _ := http.NewRequest(http.MethodPost, url, nil)
	if err := agent.Sign(otherVM, "node-a", keyOf(t, "node-a"), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Signed for vm-2, sent for vm-1.
	otherVM.Header.Set(agent.HeaderSignature, signatureFor(t, s.Endpoint("node-a")+agent.TerminatePath("vm-2"), otherVM))

	for name, req := range map[string]*http.Request{"unsigned": unsigned, "node-b's key": wrongKey, "stale": stale, "signed for another vm": otherVM} {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var er agent.ErrorResponse
		json.NewDecoder(resp.Body).Decode(&er)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || er.Error == "" {
			t.Errorf("%s: status %d, error %q; want 401 with an error", name, resp.StatusCode, er.Error)
		}
	}
	// A client with the wrong master gets a permanent error naming the 401.
	wrongMaster := agent.Derived{Masters: agent.StaticMasters{Current: []byte("not-the-master-secret-0123456789abcdef")}}
	_, err := (&agent.Client{Keys: wrongMaster, AllowHTTP: true}).Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-1")
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized || ae.Retryable() {
		t.Errorf("wrong-secret client: %v, want a permanent 401", err)
	}
	if st := s.State("node-a", "vm-1"); st != agent.StateRunning {
		t.Errorf("state %q after refused calls, want running", st)
	}
	if n := s.TerminateCalls("node-a", "vm-1"); n != 0 {
		t.Errorf("TerminateCalls = %d, want 0: refused calls never reach the agent", n)
	}
	if n := s.Refused(); n != 5 {
		t.Errorf("Refused = %d, want 5", n)
	}
}

// signatureFor returns the signature header req would have if sent to rawURL.
func signatureFor(t *testing.T, rawURL string, req *http.Request) string {
	t.Helper()
	r, _ := http.NewRequest(req.Method, rawURL, nil)
	if err := agent.Sign(r, "node-a", keyOf(t, "node-a"), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Re-sign with req's timestamp and nonce is not possible through Sign, so take all three.
	req.Header.Set(agent.HeaderTimestamp, r.Header.Get(agent.HeaderTimestamp))
	req.Header.Set(agent.HeaderNonce, r.Header.Get(agent.HeaderNonce))
	return r.Header.Get(agent.HeaderSignature)
}

func TestConcurrentTerminateTerminatesOnce(t *testing.T) {
	s, c := start(t)
	mustAdd(t, s, "node-a", "vm-1", agent.StateRunning)
	const n = 20
	var wg sync.WaitGroup
	results := make([]agent.Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-1")
		})
	}
	wg.Wait()
	fresh := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if !results[i].AlreadyGone {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d calls report terminating the VM, want 1", fresh)
	}
	if got := s.TerminateCalls("node-a", "vm-1"); got != n {
		t.Errorf("TerminateCalls = %d, want %d", got, n)
	}
	if got := s.Terminations("node-a", "vm-1"); got != 1 {
		t.Errorf("Terminations = %d, want 1", got)
	}
}

// A fault rate fails about that share of calls, changes nothing on a failed call, and never
// fails one VM more than MaxFaultsInARow times in a row, so every VM ends terminated within
// MaxFaultsInARow+1 calls.
func TestFaultRate(t *testing.T) {
	for _, rate := range []float64{0, 0.3, 1} {
		t.Run(fmt.Sprint(rate), func(t *testing.T) {
			s, c := start(t)
			const vms = 200
			for i := range vms {
				mustAdd(t, s, "node-a", fmt.Sprintf("vm-%d", i), agent.StateRunning)
			}
			mustAdd(t, s, "node-b", "vm-0", agent.StateRunning)
			s.SetFaultRate("node-a", "", rate)
			ctx := context.Background()
			calls, failed := 0, 0
			for i := range vms {
				vm := fmt.Sprintf("vm-%d", i)
				inARow := 0
				for {
					res, err := c.Terminate(ctx, s.Endpoint("node-a"), "node-a", vm)
					calls++
					if err == nil {
						if res.AlreadyGone {
							t.Fatalf("%s: first success reports already gone: a failed call terminated it", vm)
						}
						break
					}
					if !agent.IsRetryable(err) {
						t.Fatalf("%s: %v, want a retryable failure", vm, err)
					}
					if s.State("node-a", vm) != agent.StateRunning {
						t.Fatalf("%s: a failed call changed its state", vm)
					}
					failed++
					if inARow++; inARow > MaxFaultsInARow {
						t.Fatalf("%s: %d faults in a row, want at most %d", vm, inARow, MaxFaultsInARow)
					}
				}
			}
			if got := s.RandomFaults(); got != failed {
				t.Errorf("RandomFaults = %d, want %d", got, failed)
			}
			share := float64(failed) / float64(calls)
			// rate 1 is capped by MaxFaultsInARow: 2 of every 3 calls.
			want := min(rate, float64(MaxFaultsInARow)/float64(MaxFaultsInARow+1))
			if share < want-0.07 || share > want+0.07 {
				t.Errorf("%d of %d calls failed (%.2f), want about %.2f", failed, calls, share, want)
			}
			if res, err := c.Terminate(ctx, s.Endpoint("node-b"), "node-b", "vm-0"); err != nil || res.AlreadyGone {
				t.Errorf("another node's VM: %+v, %v; want terminated (the rate is per node)", res, err)
			}
		})
	}
}

func TestAdminAPI(t *testing.T) {
	s, c := start(t)
	admin := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	steps := []struct {
		method, path, body string
		wantStatus         int
		wantBody           string // exact, when not empty
	}{
		{"POST", "/_admin/vms", `{"node":"node-a","vmId":"vm-1","state":"running"}`, 204, ""},
		{"POST", "/_admin/vms", `{"node":"node-a","vmId":"vm-1","state":"paused"}`, 400, ""},
		{"POST", "/_admin/vms", `{"node":"node-a","vmId":"vm-1","state":"running","extra":1}`, 400, ""},
		{"POST", "/_admin/faults", `{"node":"node-a","vmId":"vm-1","failNext":1,"dropNext":1,"latencyMs":1}`, 204, ""},
		{"POST", "/_admin/faults", `{"node":"node-a","failNext":-1}`, 400, ""},
		{"POST", "/_admin/faults", `{"failNext":1}`, 400, ""},
		{"GET", "/_admin/vms?node=node-a&vmId=vm-1", "", 200, `{"node":"node-a","vmId":"vm-1","state":"running"}`},
		{"GET", "/_admin/vms?node=node-a", "", 200, `[{"node":"node-a","vmId":"vm-1","state":"running"}]`},
		{"GET", "/_admin/vms", "", 400, ""},
	}
	for _, st := range steps {
		code, body := admin(st.method, st.path, st.body)
		if code != st.wantStatus || (st.wantBody != "" && body != st.wantBody) {
			t.Fatalf("%s %s %s: %d %s; want %d %s", st.method, st.path, st.body, code, body, st.wantStatus, st.wantBody)
		}
	}
	// The knobs set over HTTP apply: a drop, a 500, then the termination.
	for i, want := range []outcome{retryable, retryable, terminated} {
		if got := outcomeOf(c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-1")); got != want {
			t.Fatalf("call %d: outcome %d, want %d", i+1, got, want)
		}
	}
	if code, body := admin("GET", "/_admin/vms?node=node-a&vmId=vm-1", ""); code != 200 ||
		body != `{"node":"node-a","vmId":"vm-1","state":"terminated","terminateCalls":3,"terminations":1}` {
		t.Fatalf("after terminate: %d %s", code, body)
	}
	if code, _ := admin("POST", "/_admin/faults", `{"node":"node-a","vmId":"vm-1","failAlways":true}`); code != 204 {
		t.Fatalf("failAlways: %d", code)
	}
	if got := outcomeOf(c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-1")); got != retryable {
		t.Fatalf("with failAlways: outcome %d", got)
	}
	if code, _ := admin("POST", "/_admin/reset", ""); code != 204 {
		t.Fatalf("reset: %d", code)
	}
	if st, n := s.State("node-a", "vm-1"), s.TerminateCalls("node-a", "vm-1"); st != agent.StateUnknown || n != 0 {
		t.Fatalf("after reset: state %q, calls %d", st, n)
	}
}

func TestAdminIsLoopbackOnly(t *testing.T) {
	s, _ := start(t)
	h := s.srv.Handler
	for _, tt := range []struct {
		remote string
		want   int
	}{
		{"10.0.0.7:5000", http.StatusForbidden},
		{"[2001:db8::1]:5000", http.StatusForbidden},
		{"garbage", http.StatusForbidden},
		{"127.0.0.1:5000", http.StatusNoContent},
		{"[::1]:5000", http.StatusNoContent},
	} {
		req := httptest.NewRequest(http.MethodPost, "/_admin/reset", bytes.NewReader(nil))
		req.RemoteAddr = tt.remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.want {
			t.Errorf("admin from %s: %d, want %d", tt.remote, rec.Code, tt.want)
		}
	}
}

func TestCloseEndsLatency(t *testing.T) {
	s, c := start(t)
	mustAdd(t, s, "node-a", "vm-1", agent.StateRunning)
	s.SetLatency("node-a", "vm-1", time.Minute)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-1")
		errc <- err
	}()
	for s.TerminateCalls("node-a", "vm-1") == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	begin := time.Now()
	s.Close()
	if err := <-errc; !agent.IsRetryable(err) {
		t.Fatalf("call during Close = %v, want retryable", err)
	}
	if time.Since(begin) > 3*time.Second || s.State("node-a", "vm-1") != agent.StateRunning {
		t.Fatalf("Close took %s, state %q", time.Since(begin), s.State("node-a", "vm-1"))
	}
}

// oneKey signs for every node with the same key: what the owner of one node could do with
// its own agent's key.
type oneKey []byte

func (k oneKey) NodeKeys(context.Context, string) (agent.KeySet, error) {
	return agent.KeySet{Current: k}, nil
}

// TestNodeKeyCannotActOnAnotherNode: node-a's key terminates nothing on node-b; each
// simulated agent verifies with its own node's key only.
func TestNodeKeyCannotActOnAnotherNode(t *testing.T) {
	s, c := start(t)
	mustAdd(t, s, "node-a", "vm-a", agent.StateRunning)
	mustAdd(t, s, "node-b", "vm-b", agent.StateRunning)
	stolen := &agent.Client{Keys: oneKey(keyOf(t, "node-a")), AllowHTTP: true}
	if got := outcomeOf(stolen.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", "vm-a")); got != terminated {
		t.Fatalf("node-a's key on node-a: outcome %d, want terminated", got)
	}
	_, err := stolen.Terminate(context.Background(), s.Endpoint("node-b"), "node-b", "vm-b")
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized {
		t.Fatalf("node-a's key on node-b: %v, want 401", err)
	}
	if st, n := s.State("node-b", "vm-b"), s.TerminateCalls("node-b", "vm-b"); st != agent.StateRunning || n != 0 {
		t.Fatalf("node-b's vm: state %q, calls %d; want running, 0", st, n)
	}
	// The service's own client still reaches node-b.
	if got := outcomeOf(c.Terminate(context.Background(), s.Endpoint("node-b"), "node-b", "vm-b")); got != terminated {
		t.Fatalf("service on node-b: outcome %d", got)
	}
}

// TestRotationOfANodesKeys: an agent given its new key next to the old one serves services on
// either master; once it drops the old key, a service still on the old master is refused.
func TestRotationOfANodesKeys(t *testing.T) {
	s, _ := start(t)
	newMaster := []byte("sim-test-master-secret-next-0123456789")
	newKey, err := agent.NodeKey(newMaster, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	onOld := &agent.Client{Keys: agent.Derived{Masters: agent.StaticMasters{Current: master}}, AllowHTTP: true}
	onNew := &agent.Client{Keys: agent.Derived{Masters: agent.StaticMasters{Current: newMaster, Previous: [][]byte{master}}}, AllowHTTP: true}
	for i := range 4 {
		mustAdd(t, s, "node-a", fmt.Sprintf("vm-%d", i), agent.StateRunning)
	}
	terminate := func(c *agent.Client, vm string) error {
		_, err := c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", vm)
		return err
	}
	if err := terminate(onOld, "vm-0"); err != nil { // provisions node-a with the old key
		t.Fatal(err)
	}
	if err := s.SetNodeKeys("node-a", newKey, keyOf(t, "node-a")); err != nil {
		t.Fatal(err)
	}
	if err := terminate(onOld, "vm-1"); err != nil {
		t.Fatalf("service on the old master, agent holding both: %v", err)
	}
	if err := terminate(onNew, "vm-2"); err != nil {
		t.Fatalf("service on the new master, agent holding both: %v", err)
	}
	if err := s.SetNodeKeys("node-a", newKey); err != nil {
		t.Fatal(err)
	}
	if err := terminate(onOld, "vm-3"); err == nil || s.State("node-a", "vm-3") != agent.StateRunning {
		t.Fatalf("service on the old master after the agent dropped the old key: %v, state %q", err, s.State("node-a", "vm-3"))
	}
	if err := terminate(onNew, "vm-3"); err != nil {
		t.Fatalf("service on the new master: %v", err)
	}
}

// TestInstalledKeysAndTheirOverlap: a key installed over the admin API replaces the node's
// derived key; one installed with rotate keeps the key it replaces for the overlap only.
func TestInstalledKeysAndTheirOverlap(t *testing.T) {
	s, _ := start(t)
	s.SetKeyOverlap(300 * time.Millisecond)
	gen1, gen2 := []byte(strings.Repeat("1", 32)), []byte(strings.Repeat("2", 32))
	install := func(body string) {
		t.Helper()
		resp, err := http.Post(s.URL()+"/_admin/keys", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("install %s: %d", body, resp.StatusCode)
		}
	}
	b64 := func(k []byte) string { return base64.StdEncoding.EncodeToString(k) }
	for i := range 5 {
		mustAdd(t, s, "node-a", fmt.Sprintf("vm-%d", i), agent.StateRunning)
	}
	with := func(key []byte, vm string) outcome {
		c := &agent.Client{Keys: agent.KeySet{Current: key}, AllowHTTP: true}
		return outcomeOf(c.Terminate(context.Background(), s.Endpoint("node-a"), "node-a", vm))
	}
	install(`{"node":"node-a","key":"` + b64(gen1) + `"}`)
	steps := []struct {
		name string
		do   func()
		key  []byte
		want outcome
	}{
		{"the derived key is gone", nil, keyOf(t, "node-a"), permanent},
		{"the installed key", nil, gen1, terminated},
		{"rotated: the new key", func() { install(`{"node":"node-a","key":"` + b64(gen2) + `","rotate":true}`) }, gen2, terminated},
		{"rotated: the old key within the overlap", nil, gen1, terminated},
		{"rotated: the old key after the overlap", func() { time.Sleep(400 * time.Millisecond) }, gen1, permanent},
	}
	for i, st := range steps {
		if st.do != nil {
			st.do()
		}
		if got := with(st.key, fmt.Sprintf("vm-%d", i)); got != st.want {
			t.Fatalf("%s: outcome %d, want %d", st.name, got, st.want)
		}
	}
	if code := func() int {
		resp, err := http.Post(s.URL()+"/_admin/keys", "application/json", strings.NewReader(`{"node":"node-a"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}(); code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", code)
	}
}

// TestStartOn: the simulator serves on the address asked for, so make run's agent URL is the
// same at every run, and on another port of the host when that one is taken.
func TestStartOn(t *testing.T) {
	free := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		return addr
	}
	taken := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln.Addr().String()
	}
	for _, tt := range []struct {
		name     string
		addr     func(*testing.T) string
		sameAddr bool
	}{
		{"free address: served there", free, true},
		{"taken address: another port", taken, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.addr(t)
			s, err := StartOn(addr, DerivedKeys(master), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			if got := s.URL() == "http://"+addr; got != tt.sameAddr {
				t.Errorf("URL %s on %s: same address %v, want %v", s.URL(), addr, got, tt.sameAddr)
			}
			resp, err := http.Get(s.URL() + "/_admin/vms?node=n")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("admin call: %d", resp.StatusCode)
			}
		})
	}
}
