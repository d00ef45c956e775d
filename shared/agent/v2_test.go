package agent

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestNodeKey(t *testing.T) {
	a, b := mustNodeKey(master, "node-a"), mustNodeKey(master, "node-b")
	if bytes.Equal(a, b) {
		t.Fatal("node-a and node-b have the same key")
	}
	if !bytes.Equal(a, mustNodeKey(master, "node-a")) || len(a) != KeyBytes {
		t.Fatal("a node's key is not a stable 32-byte value")
	}
	if bytes.Equal(a, mustNodeKey(oldMaster, "node-a")) {
		t.Fatal("two masters give node-a the same key")
	}
	for _, tc := range []struct {
		master []byte
		node   string
	}{{master[:MinMasterBytes-1], "node-a"}, {nil, "node-a"}, {master, ""}, {master, "node\na"}} {
		if _, err := NodeKey(tc.master, tc.node); err == nil {
			t.Errorf("NodeKey(%d-byte master, %q) accepted", len(tc.master), tc.node)
		}
	}
	set, err := Derived{StaticMasters{Current: master, Previous: [][]byte{oldMaster}}}.NodeKeys(context.Background(), "node-a")
	if err != nil || !bytes.Equal(set.Current, a) || len(set.Previous) != 1 || !bytes.Equal(set.Previous[0], mustNodeKey(oldMaster, "node-a")) || set.Fallback != nil {
		t.Fatalf("Derived.NodeKeys = %+v, %v", set, err)
	}
}

// TestNodeKeyCannotActOnAnotherNode: the owner of node-a holds node-a's key; whatever it signs,
// node-b's agent refuses it.
func TestNodeKeyCannotActOnAnotherNode(t *testing.T) {
	keyA := mustNodeKey(master, "node-a")
	agentB := &Verifier{NodeID: "node-b", Keys: [][]byte{mustNodeKey(master, "node-b")}, Now: fixedNow(t0)}
	const url = "https://node-b.agents.test/v1/vms/vm-1/terminate"
	tests := []struct {
		name   string
		signAs string // the node id signed and sent in X-Agent-Node
		want   error
	}{
		{"signed for node-a", "node-a", ErrWrongNode},
		{"signed with node-a's key, claiming node-b", "node-b", ErrBadSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, url, nil)
			if err := Sign(r, tc.signAs, keyA, nil, t0); err != nil {
				t.Fatal(err)
			}
			if err := agentB.Verify(r, nil); !errors.Is(err, tc.want) {
				t.Fatalf("node-b's agent: Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestReplayToAnotherNodeIsRefused: a request captured on its way to node-a, replayed to
// node-b at the same path, is refused even when both agents were given the same key by
// mistake (each agent has its own nonce cache, so only the node id in the signature stops it).
func TestReplayToAnotherNodeIsRefused(t *testing.T) {
	shared := mustNodeKey(master, "node-a")
	agentA := &Verifier{NodeID: "node-a", Keys: [][]byte{shared}, Now: fixedNow(t0)}
	agentB := &Verifier{NodeID: "node-b", Keys: [][]byte{shared}, Now: fixedNow(t0)}
	captured := httptest.NewRequest(http.MethodPost, "https://agent.test/v1/vms/vm-1/terminate", nil)
	if err := Sign(captured, "node-a", shared, nil, t0); err != nil {
		t.Fatal(err)
	}
	if err := agentA.Verify(captured, nil); err != nil {
		t.Fatalf("node-a refused its own request: %v", err)
	}
	if err := agentB.Verify(captured, nil); !errors.Is(err, ErrWrongNode) {
		t.Fatalf("replayed as is to node-b: %v, want %v", err, ErrWrongNode)
	}
	captured.Header.Set(HeaderNode, "node-b")
	if err := agentB.Verify(captured, nil); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("replayed to node-b with the node header rewritten: %v, want %v", err, ErrBadSignature)
	}
}

// tamperServer is node-a's agent answering with h, whose signed answer tamper may change
// before it is sent (nonce: the request's).
func tamperServer(t *testing.T, h http.HandlerFunc, tamper func(nonce string, status *int, hdr http.Header, body *[]byte)) *httptest.Server {
	t.Helper()
	mw := NewVerifier(testNode, secret).Middleware(h)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, r)
		status, hdr, body := rec.Code, rec.Header(), rec.Body.Bytes()
		if tamper != nil {
			tamper(r.Header.Get(HeaderNonce), &status, hdr, &body)
		}
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(status)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// terminated answers that the VM (vm-1 when not routed by a pattern) is terminated.
func terminated(w http.ResponseWriter, r *http.Request) {
	vm := r.PathValue("vm")
	if vm == "" {
		vm = "vm-1"
	}
	WriteJSON(w, 200, TerminateResponse{VMID: vm, State: StateTerminated})
}

// TestClientRefusesUnsignedOrTamperedAnswers: a "terminated" or a 404 the node's agent did not
// sign, exactly as received, is refused and retryable: the VM is never taken as done on it.
func TestClientRefusesUnsignedOrTamperedAnswers(t *testing.T) {
	unsigned := func(_ string, _ *int, h http.Header, _ *[]byte) { h.Del(HeaderSignature); h.Del(HeaderTimestamp) }
	tests := []struct {
		name    string
		handler http.HandlerFunc
		tamper  func(nonce string, status *int, hdr http.Header, body *[]byte)
		want    error // nil: accepted
	}{
		{name: "signed terminated", handler: terminated},
		{name: "signed 404", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 404, StatusResponse{VMID: r.PathValue("vm"), State: StateUnknown})
		}},
		{name: "unsigned terminated", handler: terminated, tamper: unsigned, want: ErrUnsigned},
		{name: "unsigned 404", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 404, StatusResponse{VMID: r.PathValue("vm"), State: StateUnknown})
		}, tamper: unsigned, want: ErrUnsigned},
		{name: "body tampered", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, TerminateResponse{VMID: r.PathValue("vm"), State: StateTerminated, AlreadyGone: true})
		}, tamper: func(_ string, _ *int, _ http.Header, b *[]byte) {
			*b = bytes.Replace(*b, []byte(`"alreadyGone":true`), []byte(`"alreadyGone":false`), 1)
		}, want: ErrBadSignature},
		{name: "500 turned into a 200", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 500, TerminateResponse{VMID: r.PathValue("vm"), State: StateTerminated})
		}, tamper: func(_ string, s *int, _ http.Header, _ *[]byte) { *s = 200 }, want: ErrBadSignature},
		{name: "signature version stripped", handler: terminated, tamper: func(_ string, _ *int, h http.Header, _ *[]byte) {
			h.Set(HeaderSignature, h.Get(HeaderSignature)[len(signaturePrefix):])
		}, want: ErrBadSignature},
		{name: "signed by node-b's agent", handler: terminated, tamper: func(nonce string, s *int, h http.Header, b *[]byte) {
			SignAnswer(h, "node-b", mustNodeKey(master, "node-b"), *s, nonce, *b, time.Now())
		}, want: ErrBadSignature},
		{name: "signed with node-a's key for node-b", handler: terminated, tamper: func(nonce string, s *int, h http.Header, b *[]byte) {
			SignAnswer(h, "node-b", secret, *s, nonce, *b, time.Now())
		}, want: ErrBadSignature},
		{name: "stale answer", handler: terminated, tamper: func(nonce string, s *int, h http.Header, b *[]byte) {
			SignAnswer(h, testNode, secret, *s, nonce, *b, time.Now().Add(-DefaultMaxSkew-time.Minute))
		}, want: ErrStale},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			srv := tamperServer(t, func(w http.ResponseWriter, r *http.Request) { mux.ServeHTTP(w, r) }, tc.tamper)
			mux.HandleFunc("POST /v1/vms/{vm}/terminate", tc.handler)
			_, err := (&Client{Keys: testKeys, AllowHTTP: true}).Terminate(context.Background(), srv.URL, testNode, "vm-1")
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Terminate = %v, want success", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !IsRetryable(err) {
				t.Fatalf("Terminate = %v (retryable %v), want a retryable %v", err, IsRetryable(err), tc.want)
			}
		})
	}
}

// TestClientRefusesAnAnswerReplayedFromAnotherCall: an answer is bound to its request's nonce.
func TestClientRefusesAnAnswerReplayedFromAnotherCall(t *testing.T) {
	var mu sync.Mutex
	var first *httptest.ResponseRecorder
	mw := NewVerifier(testNode, secret).Middleware(http.HandlerFunc(terminated))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = httptest.NewRecorder()
			mw.ServeHTTP(first, r)
		}
		// Every call gets the first call's signed answer.
		for k, v := range first.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(first.Code)
		w.Write(first.Body.Bytes())
	}))
	defer srv.Close()
	c := &Client{Keys: testKeys, AllowHTTP: true}
	if _, err := c.Terminate(context.Background(), srv.URL, testNode, "vm-1"); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if _, err := c.Terminate(context.Background(), srv.URL, testNode, "vm-1"); !errors.Is(err, ErrBadSignature) || !IsRetryable(err) {
		t.Fatalf("replayed answer: %v, want a retryable %v", err, ErrBadSignature)
	}
}

// masters is a master secret source an operator can rotate.
type masters struct {
	mu   sync.Mutex
	cur  []byte
	prev [][]byte
}

func (m *masters) Secrets(context.Context) ([]byte, [][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur, m.prev, nil
}

func (m *masters) set(cur []byte, prev ...[]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur, m.prev = cur, prev
}

// TestRotation walks the documented rotation: the agent gets its new key next to the old one;
// the master is rotated (the service signs with the new, accepts answers under either); the old
// master is dropped (answers under it are refused from then on).
func TestRotation(t *testing.T) {
	newMaster := []byte("test-master-secret-next-0123456789abc")
	oldKey, newKey := mustNodeKey(master, testNode), mustNodeKey(newMaster, testNode)
	src := &masters{cur: master}
	c := &Client{Keys: Derived{src}, AllowHTTP: true}

	var agentKeys atomic.Pointer[[][]byte] // what node-a's agent holds, current first
	var signWith atomic.Pointer[[]byte]    // an agent that signs answers with a key of its choice
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := &Verifier{NodeID: testNode, Keys: *agentKeys.Load()}
		h := v.Middleware(http.HandlerFunc(terminated))
		if k := signWith.Load(); k != nil {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			SignAnswer(rec.Header(), testNode, *k, rec.Code, r.Header.Get(HeaderNonce), rec.Body.Bytes(), time.Now())
			for name, vals := range rec.Header() {
				w.Header()[name] = vals
			}
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	terminate := func() error {
		_, err := c.Terminate(context.Background(), srv.URL, testNode, "vm-1")
		return err
	}

	agentKeys.Store(&[][]byte{oldKey})
	if err := terminate(); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	// 1. The agent is given its new key next to the old one; the service still signs with the old.
	agentKeys.Store(&[][]byte{newKey, oldKey})
	if err := terminate(); err != nil {
		t.Fatalf("agent holds both keys, service on the old master: %v", err)
	}
	// 2. The master is rotated: AWSCURRENT new, AWSPREVIOUS old.
	src.set(newMaster, master)
	if err := terminate(); err != nil {
		t.Fatalf("service on the new master: %v", err)
	}
	// An agent that still signs its answers with the old key is accepted within the window...
	signWith.Store(&oldKey)
	if err := terminate(); err != nil {
		t.Fatalf("answer under the previous key within the window: %v", err)
	}
	// 3. ... and refused once the old master is gone.
	src.set(newMaster)
	if err := terminate(); !errors.Is(err, ErrBadSignature) || !IsRetryable(err) {
		t.Fatalf("answer under a dropped key: %v, want a retryable %v", err, ErrBadSignature)
	}
	signWith.Store(nil)
	agentKeys.Store(&[][]byte{newKey})
	if err := terminate(); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	// An agent never given the new key refuses the service's requests.
	agentKeys.Store(&[][]byte{oldKey})
	var ae *Error
	if err := terminate(); !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized {
		t.Fatalf("agent with only the old key: %v, want its 401", err)
	}
}

func TestClientRequiresHTTPS(t *testing.T) {
	var calls atomic.Int32
	h := NewVerifier(testNode, secret).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		WriteJSON(w, 200, TerminateResponse{VMID: "vm-1", State: StateTerminated})
	}))
	plain, tlsSrv := httptest.NewServer(h), httptest.NewTLSServer(h)
	defer plain.Close()
	defer tlsSrv.Close()

	_, err := (&Client{Keys: testKeys}).Terminate(context.Background(), plain.URL, testNode, "vm-1")
	var ae *Error
	if !errors.As(err, &ae) || ae.Retryable() || calls.Load() != 0 {
		t.Fatalf("http:// endpoint: %v (calls %d), want a final error and no request sent", err, calls.Load())
	}
	if _, err := (&Client{Keys: testKeys, HTTP: tlsSrv.Client()}).Terminate(context.Background(), tlsSrv.URL, testNode, "vm-1"); err != nil {
		t.Fatalf("https:// endpoint: %v", err)
	}
	if _, err := (&Client{Keys: testKeys, AllowHTTP: true}).Terminate(context.Background(), plain.URL, testNode, "vm-1"); err != nil {
		t.Fatalf("http:// endpoint with AllowHTTP: %v", err)
	}
}

// failingKeys is a key source that is down.
type failingKeys struct{}

func (failingKeys) NodeKeys(context.Context, string) (KeySet, error) {
	return KeySet{}, errors.New("secrets manager: throttled")
}

func TestClientKeysUnavailableIsRetryable(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	_, err := (&Client{Keys: failingKeys{}, AllowHTTP: true}).Terminate(context.Background(), srv.URL, testNode, "vm-1")
	if !IsRetryable(err) || calls.Load() != 0 {
		t.Fatalf("Terminate = %v (calls %d), want retryable and nothing sent", err, calls.Load())
	}
}

func TestVerifierSignsEveryAnswerOfAVerifiedRequest(t *testing.T) {
	for _, status := range []int{200, 404, 500} {
		h := NewVerifier(testNode, oldSecret, secret).Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			WriteError(w, status, "x")
		}))
		r := httptest.NewRequest(http.MethodGet, "/v1/vms/vm-1", nil)
		if err := Sign(r, testNode, secret, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		// Signed with the key that signed the request (the second listed), which the signer holds.
		err := VerifyAnswer(rec.Header(), testNode, [][]byte{secret}, rec.Code, r.Header.Get(HeaderNonce), rec.Body.Bytes(), time.Now(), time.Minute)
		if rec.Code != status || err != nil {
			t.Errorf("status %d: got %d, VerifyAnswer = %v", status, rec.Code, err)
		}
		if rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("status %d: the handler's headers were lost: %v", status, rec.Header())
		}
	}
}
