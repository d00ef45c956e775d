package agent

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// KeyInfoPrefix is the HKDF info of a node key, followed by the node id. It names the version,
// so a v3 can derive unrelated keys from the same master.
const KeyInfoPrefix = "capacity-agent-v2/node/"

// KeyBytes is the length of a node key; MinMasterBytes the shortest master secret accepted.
const (
	KeyBytes       = 32
	MinMasterBytes = 32
)

// Keys gives the service the keys of any node's agent.
type Keys interface {
	NodeKeys(ctx context.Context, nodeID string) (KeySet, error)
}

// KeySet is what the service signs a call to one node's agent with.
type KeySet struct {
	// Current signs every request. An answer is accepted under Current or any of Previous
	// (a master secret's rotation window).
	Current  []byte
	Previous [][]byte
	// Fallback, when set, is the node's previous key generation during its overlap after a
	// rotation: a request the agent refused with 401 under Current (its operator has not
	// installed the new key yet) is signed with Fallback and sent once more, and its answer
	// is accepted under Fallback only.
	Fallback []byte
}

// NodeKeys returns the set itself, whatever the node: a KeySet is the Keys of one call.
func (k KeySet) NodeKeys(context.Context, string) (KeySet, error) {
	if len(k.Current) == 0 {
		return KeySet{}, errors.New("no current key")
	}
	return k, nil
}

// MasterSecrets is where the master secrets come from: Secrets Manager's AWSCURRENT and
// AWSPREVIOUS versions in production (shared/secrets), fixed ones in tests.
type MasterSecrets interface {
	Secrets(ctx context.Context) (current []byte, previous [][]byte, err error)
}

// Derived gives every node a key of its own, derived from the master secrets with NodeKey, so
// the service holds one secret and an agent holds only its own node's key.
type Derived struct{ Masters MasterSecrets }

// NodeKeys derives the node's current key from the current master and one previous key from
// each previous master.
func (d Derived) NodeKeys(ctx context.Context, nodeID string) (KeySet, error) {
	cur, prev, err := d.Masters.Secrets(ctx)
	if err != nil {
		return KeySet{}, fmt.Errorf("read agent master secret: %w", err)
	}
	current, err := NodeKey(cur, nodeID)
	if err != nil {
		return KeySet{}, err
	}
	previous := make([][]byte, 0, len(prev))
	for _, m := range prev {
		k, err := NodeKey(m, nodeID)
		if err != nil {
			return KeySet{}, fmt.Errorf("previous master: %w", err)
		}
		previous = append(previous, k)
	}
	return KeySet{Current: current, Previous: previous}, nil
}

// NodeKey is node nodeID's key: HKDF-SHA256 over master, no salt, info KeyInfoPrefix+nodeID,
// KeyBytes long. Only that node's agent and the service can compute it.
func NodeKey(master []byte, nodeID string) ([]byte, error) {
	if len(master) < MinMasterBytes {
		return nil, fmt.Errorf("derive key of node %q: master secret is %d bytes, want at least %d", nodeID, len(master), MinMasterBytes)
	}
	if !ValidNodeID(nodeID) {
		return nil, fmt.Errorf("derive key of node %q: invalid node id", nodeID)
	}
	k, err := hkdf.Key(sha256.New, master, nil, KeyInfoPrefix+nodeID, KeyBytes)
	if err != nil {
		return nil, fmt.Errorf("derive key of node %q: %w", nodeID, err)
	}
	return k, nil
}

// StaticMasters are fixed master secrets, for tests and tools.
type StaticMasters struct {
	Current  []byte
	Previous [][]byte
}

// Secrets returns the fixed secrets.
func (s StaticMasters) Secrets(context.Context) ([]byte, [][]byte, error) {
	if len(s.Current) == 0 {
		return nil, nil, errors.New("no current master secret")
	}
	return s.Current, s.Previous, nil
}

// DefaultKeyOverlap is how long the previous generation of a node's key still works after a
// rotation: the service falls back on it for an agent that refused the new key, and a
// Verifier given a new key by RotateKey keeps accepting the old one for as long.
const DefaultKeyOverlap = 10 * time.Minute

// Opener opens a node's key as the service stores it (sealed; shared/kmsseal).
type Opener interface {
	OpenAgentKey(ctx context.Context, nodeID string, sealed []byte) ([]byte, error)
}

// Stored is the Keys of one node as the service stores them: generation Gen of a random
// key, sealed, and the previous generation's (PrevSealed; nil when that is generation 0),
// rotated at RotatedAt. Generation 0 is the key Legacy derives from the agent master secret
// (nodes registered before per-node keys). The previous generation is the Fallback until
// Overlap after RotatedAt, and never after, nor once an operator ended the overlap
// (OverlapEnded).
type Stored struct {
	Opener             Opener
	Legacy             Keys
	Gen                int64
	Sealed, PrevSealed []byte
	RotatedAt          time.Time
	Overlap            time.Duration    // 0: DefaultKeyOverlap
	OverlapEnded       bool             // an operator ended this generation's overlap early
	Now                func() time.Time // nil: time.Now
	// Resealer, when set, opens generation Gen (from Resealed, the node's resealed key, when
	// that is of Gen): one KMS Decrypt per generation instead of one per instance. The
	// previous generation, needed only during the overlap after a rotation, is opened by
	// Opener (KMS) as before.
	Resealer *Resealer
	Resealed *capacity.ResealedAgentKey
}

// NodeKeys opens the node's current key and, within the overlap, its previous one.
func (s Stored) NodeKeys(ctx context.Context, nodeID string) (KeySet, error) {
	if s.Gen == 0 {
		if s.Legacy == nil {
			return KeySet{}, errors.New("node has no key of its own and there is no master secret")
		}
		return s.Legacy.NodeKeys(ctx, nodeID)
	}
	if s.Opener == nil && s.Resealer == nil {
		return KeySet{}, errors.New("no opener of sealed agent keys")
	}
	var cur []byte
	var err error
	if s.Resealer != nil {
		cur, err = s.Resealer.Open(ctx, nodeID, s.Gen, s.Sealed, s.Resealed)
	} else {
		cur, err = s.Opener.OpenAgentKey(ctx, nodeID, s.Sealed)
	}
	if err != nil {
		return KeySet{}, fmt.Errorf("key generation %d: %w", s.Gen, err)
	}
	set := KeySet{Current: cur}
	now, overlap := time.Now, s.Overlap
	if s.Now != nil {
		now = s.Now
	}
	if overlap <= 0 {
		overlap = DefaultKeyOverlap
	}
	if s.OverlapEnded || s.RotatedAt.IsZero() || !now().Before(s.RotatedAt.Add(overlap)) {
		return set, nil
	}
	switch {
	case len(s.PrevSealed) > 0:
		opener := s.Opener
		if opener == nil {
			opener = s.Resealer.KMS
		}
		if set.Fallback, err = opener.OpenAgentKey(ctx, nodeID, s.PrevSealed); err != nil {
			return KeySet{}, fmt.Errorf("key generation %d: %w", s.Gen-1, err)
		}
	case s.Gen == 1 && s.Legacy != nil:
		legacy, err := s.Legacy.NodeKeys(ctx, nodeID)
		if err != nil {
			return KeySet{}, fmt.Errorf("key generation 0: %w", err)
		}
		set.Fallback = legacy.Current
	}
	return set, nil
}
