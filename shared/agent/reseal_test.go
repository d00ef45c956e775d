package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

var discard = slog.New(slog.DiscardHandler)

// kmsFake opens "kms:<node>:<key>" for its node, counting the calls: the KMS Decrypts.
type kmsFake struct {
	mu    sync.Mutex
	calls int
}

func kmsSealed(node, key string) []byte { return []byte("kms:" + node + ":" + key) }

func (k *kmsFake) OpenAgentKey(_ context.Context, nodeID string, sealed []byte) ([]byte, error) {
	k.mu.Lock()
	k.calls++
	k.mu.Unlock()
	key, ok := bytes.CutPrefix(sealed, []byte("kms:"+nodeID+":"))
	if !ok {
		return nil, errors.New("not this node's")
	}
	return key, nil
}

// resealStore keeps resealed keys by node, as the state table does (no later generation
// replaced); fail makes every put fail.
type resealStore struct {
	mu    sync.Mutex
	items map[string]capacity.ResealedAgentKey
	puts  int
	fail  bool
}

func (s *resealStore) PutResealedAgentKey(_ context.Context, nodeID string, r capacity.ResealedAgentKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.puts++
	if s.fail {
		return errors.New("store down")
	}
	if old, ok := s.items[nodeID]; ok && old.Gen > r.Gen {
		return fmt.Errorf("later generation stored: %w", capacity.ErrConflict)
	}
	if s.items == nil {
		s.items = map[string]capacity.ResealedAgentKey{}
	}
	s.items[nodeID] = r
	return nil
}

func (s *resealStore) get(nodeID string) *capacity.ResealedAgentKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.items[nodeID]; ok {
		return &r
	}
	return nil
}

// failingMasters is a Secrets Manager that cannot be read.
type failingMasters struct{}

func (failingMasters) Secrets(context.Context) ([]byte, [][]byte, error) {
	return nil, nil, errors.New("secrets manager down")
}

// TestResealer: a node's key costs a KMS Decrypt the first time its KMS-sealed form is opened;
// a fresh instance then opens the stored resealed form with none. A form that does not belong
// to the node's current KMS-sealed key (a rotation since, another node's copied in, tampered
// with, under a master secret rotated away) is passed over for KMS and replaced; one under the
// previous master opens and is replaced under the current one. Neither the store nor the
// master secret failing keeps the key from opening.
func TestResealer(t *testing.T) {
	m1, m2, m3 := []byte(strings.Repeat("1", 32)), []byte(strings.Repeat("2", 32)), []byte(strings.Repeat("3", 32))
	const node, other = "node-a", "node-b"
	s1, s2 := kmsSealed(node, "key-gen-1"), kmsSealed(node, "key-gen-2")
	// resealed is what a first open stored for node at gen from sealed under master.
	resealed := func(t *testing.T, master []byte, nodeID string, gen int64, sealed []byte) *capacity.ResealedAgentKey {
		t.Helper()
		st := &resealStore{}
		r := &Resealer{Logger: discard, KMS: &kmsFake{}, Masters: StaticMasters{Current: master}, Store: st}
		if _, err := r.Open(context.Background(), nodeID, gen, sealed, nil); err != nil {
			t.Fatal(err)
		}
		return st.get(nodeID)
	}
	tests := []struct {
		name    string
		masters MasterSecrets
		gen     int64
		sealed  []byte
		// stored is the node's resealed key as the read returns it.
		stored    func(t *testing.T) *capacity.ResealedAgentKey
		storeDown bool
		wantKey   string
		wantKMS   int
		wantPuts  int
	}{
		{"no resealed key yet", StaticMasters{Current: m1}, 1, s1,
			func(*testing.T) *capacity.ResealedAgentKey { return nil }, false, "key-gen-1", 1, 1},
		{"a fresh instance opens the resealed key", StaticMasters{Current: m1}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey { return resealed(t, m1, node, 1, s1) }, false, "key-gen-1", 0, 0},
		{"rotated since: the previous generation's resealed key is useless", StaticMasters{Current: m1}, 2, s2,
			func(t *testing.T) *capacity.ResealedAgentKey { return resealed(t, m1, node, 1, s1) }, false, "key-gen-2", 1, 1},
		{"resealed from another KMS-sealed key of the same generation", StaticMasters{Current: m1}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey {
				return resealed(t, m1, node, 1, kmsSealed(node, "key-before"))
			}, false, "key-gen-1", 1, 1},
		{"another node's resealed key copied in", StaticMasters{Current: m1}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey {
				// Only the node differs: the same generation, KMS-sealed form and key.
				blob, err := Reseal(m1, other, 1, s1, []byte("key-gen-1"))
				if err != nil {
					t.Fatal(err)
				}
				return &capacity.ResealedAgentKey{Gen: 1, Sealed: blob}
			}, false, "key-gen-1", 1, 1},
		{"relabelled as another generation", StaticMasters{Current: m1}, 2, s1,
			func(t *testing.T) *capacity.ResealedAgentKey {
				r := resealed(t, m1, node, 1, s1)
				r.Gen = 2
				return r
			}, false, "key-gen-1", 1, 1},
		{"tampered with", StaticMasters{Current: m1}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey {
				r := resealed(t, m1, node, 1, s1)
				r.Sealed[len(r.Sealed)-1] ^= 1
				return r
			}, false, "key-gen-1", 1, 1},
		{"truncated", StaticMasters{Current: m1}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey {
				r := resealed(t, m1, node, 1, s1)
				r.Sealed = r.Sealed[:5]
				return r
			}, false, "key-gen-1", 1, 1},
		{"master secret rotated: opens under the previous, resealed under the current", StaticMasters{Current: m2, Previous: [][]byte{m1}}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey { return resealed(t, m1, node, 1, s1) }, false, "key-gen-1", 0, 1},
		{"master secret rotated twice", StaticMasters{Current: m3, Previous: [][]byte{m2}}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey { return resealed(t, m1, node, 1, s1) }, false, "key-gen-1", 1, 1},
		{"store down: the key is used all the same", StaticMasters{Current: m1}, 1, s1,
			func(*testing.T) *capacity.ResealedAgentKey { return nil }, true, "key-gen-1", 1, 1},
		{"master secret unreadable: KMS, nothing stored", failingMasters{}, 1, s1,
			func(t *testing.T) *capacity.ResealedAgentKey { return resealed(t, m1, node, 1, s1) }, false, "key-gen-1", 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			kms, st := &kmsFake{}, &resealStore{fail: tc.storeDown}
			stored := tc.stored(t)
			if stored != nil {
				st.items = map[string]capacity.ResealedAgentKey{node: *stored}
			}
			r := &Resealer{Logger: discard, KMS: kms, Masters: tc.masters, Store: st}
			key, err := r.Open(ctx, node, tc.gen, tc.sealed, stored)
			if err != nil || string(key) != tc.wantKey {
				t.Fatalf("Open = %q, %v; want %q", key, err, tc.wantKey)
			}
			if kms.calls != tc.wantKMS || st.puts != tc.wantPuts {
				t.Errorf("%d KMS Decrypts, %d puts; want %d, %d", kms.calls, st.puts, tc.wantKMS, tc.wantPuts)
			}
			// The instance opens it again from memory.
			if again, err := r.Open(ctx, node, tc.gen, tc.sealed, stored); err != nil || !bytes.Equal(again, key) || kms.calls != tc.wantKMS {
				t.Errorf("second open in the instance: %q, %v, %d KMS Decrypts in all", again, err, kms.calls)
			}
			if tc.wantPuts == 0 || tc.storeDown {
				return
			}
			// What was stored opens in a fresh instance under the current master alone,
			// with no KMS call.
			cur, _, _ := tc.masters.Secrets(ctx)
			fresh, freshKMS := &Resealer{Logger: discard, KMS: &kmsFake{}, Masters: StaticMasters{Current: cur}, Store: &resealStore{}}, 0
			got, err := fresh.Open(ctx, node, tc.gen, tc.sealed, st.get(node))
			if freshKMS = fresh.KMS.(*kmsFake).calls; err != nil || string(got) != tc.wantKey || freshKMS != 0 {
				t.Errorf("fresh instance: %q, %v, %d KMS Decrypts; want %q with none", got, err, freshKMS, tc.wantKey)
			}
		})
	}
}

// TestResealerKeepsALaterGeneration: a task that read the node before a rotation opens its
// generation with KMS, and the later generation's resealed key stays stored.
func TestResealerKeepsALaterGeneration(t *testing.T) {
	ctx := context.Background()
	masters := StaticMasters{Current: []byte(strings.Repeat("1", 32))}
	st := &resealStore{}
	s1, s2 := kmsSealed("n1", "k1"), kmsSealed("n1", "k2")
	if _, err := (&Resealer{Logger: discard, KMS: &kmsFake{}, Masters: masters, Store: st}).Open(ctx, "n1", 2, s2, nil); err != nil {
		t.Fatal(err)
	}
	newer := st.get("n1")
	key, err := (&Resealer{Logger: discard, KMS: &kmsFake{}, Masters: masters, Store: st}).Open(ctx, "n1", 1, s1, newer)
	if err != nil || string(key) != "k1" {
		t.Fatalf("stale open = %q, %v", key, err)
	}
	if got := st.get("n1"); got.Gen != 2 || !bytes.Equal(got.Sealed, newer.Sealed) {
		t.Errorf("stored %+v, want generation 2's kept", got)
	}
}

// TestStoredKeysReseal: a node's Stored keys open the current generation through the
// Resealer, and the previous one, during the overlap, with KMS (the resealed key is the
// current generation's only).
func TestStoredKeysReseal(t *testing.T) {
	ctx := context.Background()
	masters := StaticMasters{Current: []byte(strings.Repeat("1", 32))}
	s1, s2 := kmsSealed(testNode, "k1"), kmsSealed(testNode, "k2")
	st := &resealStore{}
	if _, err := (&Resealer{Logger: discard, KMS: &kmsFake{}, Masters: masters, Store: st}).Open(ctx, testNode, 2, s2, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		now          func() time.Time
		wantFallback string
		wantKMS      int
	}{
		{"within the overlap", fixedNow(t0.Add(time.Minute)), "k1", 1},
		{"after it", fixedNow(t0.Add(DefaultKeyOverlap)), "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kms := &kmsFake{}
			s := Stored{Opener: kms, Gen: 2, Sealed: s2, PrevSealed: s1, RotatedAt: t0, Now: tc.now,
				Resealer: &Resealer{Logger: discard, KMS: kms, Masters: masters, Store: st}, Resealed: st.get(testNode)}
			set, err := s.NodeKeys(ctx, testNode)
			if err != nil || string(set.Current) != "k2" || string(set.Fallback) != tc.wantFallback || kms.calls != tc.wantKMS {
				t.Fatalf("NodeKeys = %q / %q, %v, %d KMS Decrypts; want k2 / %q, %d", set.Current, set.Fallback, err, kms.calls, tc.wantFallback, tc.wantKMS)
			}
		})
	}
}
