package agent

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
)

// KeyInfoPrefix is the HKDF info of a node key, followed by the node id. It names the version,
// so a v3 can derive unrelated keys from the same master.
const KeyInfoPrefix = "capacity-agent-v2/node/"

// KeyBytes is the length of a node key; MinMasterBytes the shortest master secret accepted.
const (
	KeyBytes       = 32
	MinMasterBytes = 32
)

// Keys gives the service the keys of any node's agent: current signs requests; an answer is
// accepted under current or any of previous (the rotation window).
type Keys interface {
	NodeKeys(ctx context.Context, nodeID string) (current []byte, previous [][]byte, err error)
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
func (d Derived) NodeKeys(ctx context.Context, nodeID string) ([]byte, [][]byte, error) {
	cur, prev, err := d.Masters.Secrets(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read agent master secret: %w", err)
	}
	current, err := NodeKey(cur, nodeID)
	if err != nil {
		return nil, nil, err
	}
	previous := make([][]byte, 0, len(prev))
	for _, m := range prev {
		k, err := NodeKey(m, nodeID)
		if err != nil {
			return nil, nil, fmt.Errorf("previous master: %w", err)
		}
		previous = append(previous, k)
	}
	return current, previous, nil
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
