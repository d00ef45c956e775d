package agent

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestRotateKeyOverlap: an agent given a new key with RotateKey accepts the key it replaced
// for KeyOverlap, then refuses it; a key rotated away before is refused at once; the new key
// is accepted throughout.
func TestRotateKeyOverlap(t *testing.T) {
	gen1, gen2, gen3 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32), bytes.Repeat([]byte{3}, 32)
	const url = "http://agent.test/node-a/v1/vms/vm-1/terminate"
	tests := []struct {
		name    string
		rotate  [][]byte      // keys given with RotateKey, in order, at t0
		after   time.Duration // when the request comes, after t0
		signKey []byte
		want    error
	}{
		{"new key", [][]byte{gen2}, time.Minute, gen2, nil},
		{"old key within the overlap", [][]byte{gen2}, DefaultKeyOverlap - time.Second, gen1, nil},
		{"old key after the overlap", [][]byte{gen2}, DefaultKeyOverlap, gen1, ErrBadSignature},
		{"new key after the overlap", [][]byte{gen2}, DefaultKeyOverlap + time.Hour, gen2, nil},
		{"two rotations: the middle key within the overlap", [][]byte{gen2, gen3}, time.Minute, gen2, nil},
		{"two rotations: the first key at once", [][]byte{gen2, gen3}, time.Second, gen1, ErrBadSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			now := t0
			v := &Verifier{NodeID: testNode, Keys: [][]byte{gen1}, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}
			for _, k := range tc.rotate {
				v.RotateKey(k)
			}
			mu.Lock()
			now = t0.Add(tc.after)
			mu.Unlock()
			err := v.Verify(signed(t, tc.signKey, http.MethodPost, url, nil, now), nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestClientFallsBackOnlyWithinTheOverlap: a client whose node key was rotated signs with the
// new key; an agent that refuses it with a 401 signed with the old key (it holds only that
// one) is asked once more under the Fallback key, and only when there is one. A 401 that does
// not prove the agent holds the old key (unsigned, or signed with another key) is not a reason
// to sign with it: the call fails for good at once, as any 401 does. The fallback's answer
// must be signed with the fallback key: an answer signed with the new key to it is not taken.
func TestClientFallsBackOnlyWithinTheOverlap(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	tests := []struct {
		name      string
		agentKeys [][]byte
		unsigned  bool // the agent's 401s carry no signature (an agent before signed refusals, or a forger)
		set       KeySet
		wantCalls int
		wantErr   bool
		wantFinal bool
	}{
		{"agent has the new key", [][]byte{newKey}, false, KeySet{Current: newKey, Fallback: oldKey}, 1, false, false},
		{"agent has only the old key, within the overlap", [][]byte{oldKey}, false, KeySet{Current: newKey, Fallback: oldKey}, 2, false, false},
		{"agent has only the old key, after the overlap", [][]byte{oldKey}, false, KeySet{Current: newKey}, 1, true, true},
		{"agent has neither", [][]byte{bytes.Repeat([]byte{9}, 32)}, false, KeySet{Current: newKey, Fallback: oldKey}, 1, true, true},
		{"unsigned 401 within the overlap", [][]byte{oldKey}, true, KeySet{Current: newKey, Fallback: oldKey}, 1, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			calls := 0
			v := NewVerifier(testNode, tc.agentKeys...)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				calls++
				mu.Unlock()
				if tc.unsigned && v.Verify(r, nil) != nil {
					WriteError(w, http.StatusUnauthorized, "unauthorized")
					return
				}
				v.Middleware(http.HandlerFunc(terminated)).ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			c := &Client{Keys: tc.set, AllowHTTP: true}
			_, err := c.Terminate(context.Background(), srv.URL, testNode, "vm-1")
			if (err != nil) != tc.wantErr {
				t.Fatalf("Terminate: %v, want error %v", err, tc.wantErr)
			}
			if err != nil && IsRetryable(err) == tc.wantFinal {
				t.Errorf("error %v: retryable %v, want final %v", err, IsRetryable(err), tc.wantFinal)
			}
			if calls != tc.wantCalls {
				t.Errorf("%d calls reached the agent, want %d", calls, tc.wantCalls)
			}
		})
	}

	// Someone on the path who holds the old key (a former owner) refuses the new key's request
	// with a 401 signed with it, and answers the fallback's with a "terminated" signed under
	// the new key: not taken.
	forger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if NewVerifier(testNode, oldKey).Verify(r, nil) != nil {
			body := []byte(`{"error":"unauthorized"}`)
			SignAnswer(w.Header(), testNode, oldKey, http.StatusUnauthorized, r.Header.Get(HeaderNonce), body, time.Now())
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write(body)
			return
		}
		body := []byte(`{"vmId":"vm-1","state":"terminated","alreadyGone":false}`)
		SignAnswer(w.Header(), testNode, newKey, http.StatusOK, r.Header.Get(HeaderNonce), append(body, '\n'), time.Now())
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(append(body, '\n'))
	}))
	t.Cleanup(forger.Close)
	c := &Client{Keys: KeySet{Current: newKey, Fallback: oldKey}, AllowHTTP: true}
	if _, err := c.Terminate(context.Background(), forger.URL, testNode, "vm-1"); err == nil || !IsRetryable(err) {
		t.Fatalf("an answer to the fallback signed with another key: %v, want a retryable refusal", err)
	}
}

// opener opens "sealed:<key>" for node-a only.
type opener struct{}

func (opener) OpenAgentKey(_ context.Context, nodeID string, sealed []byte) ([]byte, error) {
	k, ok := bytes.CutPrefix(sealed, []byte("sealed:"))
	if !ok || nodeID != testNode {
		return nil, errors.New("not this node's")
	}
	return k, nil
}

// TestStoredKeys: a node's keys as stored: generation 0 is derived from the master; a sealed
// key is opened; the previous generation is the fallback only until the overlap is over.
func TestStoredKeys(t *testing.T) {
	legacy := Derived{StaticMasters{Current: master}}
	at := func(d time.Duration) func() time.Time { return fixedNow(t0.Add(d)) }
	tests := []struct {
		name         string
		s            Stored
		wantCurrent  []byte
		wantFallback []byte
		wantErr      bool
	}{
		{"generation 0", Stored{Legacy: legacy, Now: at(0)}, secret, nil, false},
		{"generation 1, never rotated", Stored{Opener: opener{}, Legacy: legacy, Gen: 1, Sealed: []byte("sealed:k1"), Now: at(0)}, []byte("k1"), nil, false},
		{"generation 2 within the overlap", Stored{Opener: opener{}, Gen: 2, Sealed: []byte("sealed:k2"), PrevSealed: []byte("sealed:k1"), RotatedAt: t0, Now: at(DefaultKeyOverlap - time.Second)},
			[]byte("k2"), []byte("k1"), false},
		{"generation 2 after the overlap", Stored{Opener: opener{}, Gen: 2, Sealed: []byte("sealed:k2"), PrevSealed: []byte("sealed:k1"), RotatedAt: t0, Now: at(DefaultKeyOverlap)},
			[]byte("k2"), nil, false},
		{"generation 1 from a derived key, within the overlap", Stored{Opener: opener{}, Legacy: legacy, Gen: 1, Sealed: []byte("sealed:k1"), RotatedAt: t0, Now: at(time.Minute)},
			[]byte("k1"), secret, false},
		{"a shorter overlap", Stored{Opener: opener{}, Gen: 2, Sealed: []byte("sealed:k2"), PrevSealed: []byte("sealed:k1"), RotatedAt: t0, Overlap: time.Minute, Now: at(time.Minute)},
			[]byte("k2"), nil, false},
		{"no opener", Stored{Legacy: legacy, Gen: 1, Sealed: []byte("sealed:k1")}, nil, nil, true},
		{"unopenable", Stored{Opener: opener{}, Gen: 1, Sealed: []byte("garbage")}, nil, nil, true},
		{"generation 0 without a master", Stored{}, nil, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			set, err := tc.s.NodeKeys(context.Background(), testNode)
			if (err != nil) != tc.wantErr {
				t.Fatalf("NodeKeys: %v, want error %v", err, tc.wantErr)
			}
			if !bytes.Equal(set.Current, tc.wantCurrent) || !bytes.Equal(set.Fallback, tc.wantFallback) {
				t.Fatalf("NodeKeys = current %q fallback %q, want %q %q", set.Current, set.Fallback, tc.wantCurrent, tc.wantFallback)
			}
		})
	}
}
