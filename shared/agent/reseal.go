package agent

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// ResealInfo is the HKDF info of the reseal key, derived from the agent master secret. Apart
// from KeyInfoPrefix, so that no node key is ever a reseal key.
const ResealInfo = "capacity-agent-key-reseal/v1"

// resealNonceBytes is AES-GCM's standard nonce length; a random nonce per seal is safe for
// far more seals than a master secret sees (one per node and key generation).
const resealNonceBytes = 12

// ErrResealed: a resealed key did not open (another node's or generation's, made from another
// KMS-sealed form, under a master secret no longer current or previous, or tampered with).
var ErrResealed = errors.New("resealed agent key does not open")

// Resealer opens the terminating function's node keys with one KMS Decrypt per node and key
// generation, not one per Lambda instance: the first open of a generation's KMS-sealed key
// reseals it under a key derived from the agent master secret (which the internet-facing api
// function cannot read) and stores that (Store); any later open, in any instance, opens the
// resealed form locally. A resealed form that does not open, or a store that fails, costs a
// KMS Decrypt and never the key: the KMS-sealed form stays the source of truth.
type Resealer struct {
	KMS     Opener        // opens the KMS-sealed form (shared/kmsseal)
	Masters MasterSecrets // the agent master secrets the reseal key is derived from
	Store   capacity.ResealedAgentKeyStore
	Logger  *slog.Logger     // nil: slog.Default()
	Now     func() time.Time // nil: time.Now

	// mu serialises the opens that miss the cache: one instance runs one node's task at a
	// time, and its calls to that node's agent all need the same key, so the first opens it
	// (and stores it resealed) and the others take it from the cache.
	mu     sync.Mutex
	opened map[string][]byte // openedKey(node, gen, sealed) -> key
}

// Open returns generation gen of node nodeID's key, sealed under KMS as sealed: from resealed
// when that is of this generation and opens, else by KMS, then resealed under the current
// master secret and stored. A form that opened under a previous master is resealed under the
// current one.
func (r *Resealer) Open(ctx context.Context, nodeID string, gen int64, sealed []byte, resealed *capacity.ResealedAgentKey) ([]byte, error) {
	if len(sealed) == 0 || gen < 1 {
		return nil, fmt.Errorf("open agent key of node %s: nothing sealed at generation %d", nodeID, gen)
	}
	ck := openedKey(nodeID, gen, sealed)
	if key, ok := r.cached(ck); ok {
		return key, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if key, ok := r.opened[ck]; ok {
		return bytes.Clone(key), nil
	}
	key, err := r.open(ctx, nodeID, gen, sealed, resealed)
	if err != nil {
		return nil, err
	}
	if r.opened == nil || len(r.opened) >= maxOpened {
		r.opened = map[string][]byte{}
	}
	r.opened[ck] = key
	return bytes.Clone(key), nil
}

// maxOpened bounds the keys a Resealer keeps (one per node and generation in use).
const maxOpened = 4096

func openedKey(nodeID string, gen int64, sealed []byte) string {
	return nodeID + "\n" + strconv.FormatInt(gen, 10) + "\n" + string(sealed)
}

func (r *Resealer) cached(ck string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key, ok := r.opened[ck]
	return bytes.Clone(key), ok
}

func (r *Resealer) open(ctx context.Context, nodeID string, gen int64, sealed []byte, resealed *capacity.ResealedAgentKey) ([]byte, error) {
	log := r.logger().With("node", nodeID, "agent_key_gen", gen)
	current, previous, merr := r.Masters.Secrets(ctx)
	if merr != nil {
		log.WarnContext(ctx, "agent master secret unreadable: agent key opened with KMS, not resealed", "error", merr)
	}
	if merr == nil && resealed != nil {
		switch key, under, err := OpenResealed(current, previous, nodeID, gen, sealed, resealed); {
		case err == nil && under == 0:
			return key, nil
		case err == nil:
			// Opened under a previous master secret: reseal under the current one, which
			// the next rotation of the secret keeps as a previous one.
			r.store(ctx, log, current, nodeID, gen, sealed, key)
			return key, nil
		case resealed.Gen == gen:
			log.WarnContext(ctx, "resealed agent key does not open: opening with KMS", "error", err)
		default:
			// A rotation since it was resealed: expected once per generation.
			log.InfoContext(ctx, "resealed agent key is of another generation: opening with KMS", "resealed_gen", resealed.Gen)
		}
	}
	key, err := r.KMS.OpenAgentKey(ctx, nodeID, sealed)
	if err != nil {
		return nil, err
	}
	if merr == nil {
		r.store(ctx, log, current, nodeID, gen, sealed, key)
	}
	return key, nil
}

// store reseals key under master and stores it; a failure is logged, never returned: the key
// is opened already, and the next open goes to KMS again.
func (r *Resealer) store(ctx context.Context, log *slog.Logger, master []byte, nodeID string, gen int64, sealed, key []byte) {
	blob, err := Reseal(master, nodeID, gen, sealed, key)
	if err == nil && r.Store != nil {
		err = r.Store.PutResealedAgentKey(ctx, nodeID, capacity.ResealedAgentKey{Gen: gen, Sealed: blob, At: r.now()})
	}
	switch {
	case errors.Is(err, capacity.ErrConflict):
		// This task read the node before a rotation: the new generation's form stays.
		log.InfoContext(ctx, "resealed agent key not stored: a later generation's is", "error", err)
	case err != nil:
		log.WarnContext(ctx, "resealed agent key not stored: the next open uses KMS again", "error", err)
	}
}

func (r *Resealer) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}

func (r *Resealer) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

// ResealKey is the AES-256 key resealed agent keys are sealed under: HKDF-SHA256 over the
// master secret, no salt, info ResealInfo.
func ResealKey(master []byte) ([]byte, error) {
	if len(master) < MinMasterBytes {
		return nil, fmt.Errorf("derive reseal key: master secret is %d bytes, want at least %d", len(master), MinMasterBytes)
	}
	return hkdf.Key(sha256.New, master, nil, ResealInfo, 32)
}

// resealAD is the additional data of a resealed key: it binds the node, the generation and
// the KMS-sealed form the key was opened from, so that a form copied to another node's or
// generation's item, or left over from before a rotation, does not open.
func resealAD(nodeID string, gen int64, sealed []byte) []byte {
	h := sha256.Sum256(sealed)
	ad := []byte(ResealInfo + "\n" + nodeID + "\n" + strconv.FormatInt(gen, 10) + "\n")
	return append(ad, h[:]...)
}

func resealAEAD(master []byte) (cipher.AEAD, error) {
	k, err := ResealKey(master)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Reseal seals key, generation gen of node nodeID's key opened from the KMS-sealed form
// sealed, under master: a random nonce, then the AES-256-GCM ciphertext.
func Reseal(master []byte, nodeID string, gen int64, sealed, key []byte) ([]byte, error) {
	if len(key) == 0 || !ValidNodeID(nodeID) {
		return nil, fmt.Errorf("reseal agent key of node %q: no key or invalid node id", nodeID)
	}
	aead, err := resealAEAD(master)
	if err != nil {
		return nil, fmt.Errorf("reseal agent key of node %s: %w", nodeID, err)
	}
	nonce := make([]byte, resealNonceBytes, resealNonceBytes+len(key)+aead.Overhead())
	// crypto/rand.Read never fails on supported platforms (it crashes instead).
	_, _ = rand.Read(nonce)
	return aead.Seal(nonce, nonce, key, resealAD(nodeID, gen, sealed)), nil
}

// OpenResealed opens what Reseal sealed for node nodeID at generation gen from the KMS-sealed
// form sealed, under current or one of previous: under says which (0 current, i+1 previous[i]).
// Anything else is ErrResealed.
func OpenResealed(current []byte, previous [][]byte, nodeID string, gen int64, sealed []byte, r *capacity.ResealedAgentKey) (key []byte, under int, err error) {
	if r == nil || r.Gen != gen || len(r.Sealed) < resealNonceBytes {
		return nil, 0, ErrResealed
	}
	ad := resealAD(nodeID, gen, sealed)
	for i, master := range append([][]byte{current}, previous...) {
		aead, err := resealAEAD(master)
		if err != nil {
			continue // a master too short derives no key; the current one is checked on reseal
		}
		if key, err := aead.Open(nil, r.Sealed[:resealNonceBytes], r.Sealed[resealNonceBytes:], ad); err == nil {
			return key, i, nil
		}
	}
	return nil, 0, ErrResealed
}
