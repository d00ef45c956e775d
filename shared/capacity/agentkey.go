package capacity

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"
)

// Node agent keys. Each node's agent holds a random key of its own, of a generation that
// moves on when the key is rotated (by an operator, or because the node changed owner). The
// service stores it sealed: the internet-facing api function seals a key it has just made and
// hands it out once, but can open no stored key, so compromising it yields no existing node's
// key; only the terminating function opens them (see shared/kmsseal), with KMS once per key
// generation, and then from the copy it resealed under the agent master secret (ResealedAgentKey).

// AgentKeyBytes is the length of a node agent's key.
const AgentKeyBytes = 32

// AgentKeyOverlap is how long after a rotation the previous generation's key still works:
// the terminating function signs with it only after the agent refused the new key (the
// operator has not installed it yet), and an agent given the new key keeps accepting the old
// one for as long (agent.DefaultKeyOverlap, the same length). After it, only the new key works.
const AgentKeyOverlap = 10 * time.Minute

// AgentKeySealer seals a node agent's key for storage, bound to the node: a key sealed for
// one node never opens as another's.
type AgentKeySealer interface {
	SealAgentKey(ctx context.Context, nodeID string, key []byte) ([]byte, error)
}

// AgentKeyOpener opens what AgentKeySealer sealed for the same node.
type AgentKeyOpener interface {
	OpenAgentKey(ctx context.Context, nodeID string, sealed []byte) ([]byte, error)
}

// ResealedAgentKey is a node's agent key of generation Gen as the terminating function keeps
// it after its first KMS Decrypt: Sealed again under a key derived from the agent master
// secret, which only that function can read, and bound to the node, the generation and the
// KMS-sealed form it was opened from (shared/agent.Resealer). Opening it costs no KMS call; a
// rotation (a new KMS-sealed form) makes it useless. At is when it was made.
type ResealedAgentKey struct {
	Gen    int64
	Sealed []byte
	At     time.Time
}

// ResealedAgentKeyStore keeps one resealed agent key per node: the latest generation's.
// Only the terminating function writes it; LoadNode returns it to that function alone.
type ResealedAgentKeyStore interface {
	// PutResealedAgentKey stores r as node nodeID's resealed key, replacing one of the same or
	// an earlier generation; one of a later generation stays (an error wrapping ErrConflict).
	PutResealedAgentKey(ctx context.Context, nodeID string, r ResealedAgentKey) error
}

// AgentKeyRotation asks for a new key for a node's agent.
type AgentKeyRotation struct {
	NodeID, Reason, IdempotencyKey string
}

// Validate checks the request on its own (the node id is checked by the gate).
func (r AgentKeyRotation) Validate() error {
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// AgentKeyResult is the answer to RotateAgentKey: the new generation and, once, its key
// (never stored: a replay carries SecretShown instead); the previous generation works until
// PreviousValidUntil.
type AgentKeyResult struct {
	NodeID             string
	Gen                int64
	AgentKey           []byte `json:"-"`
	PreviousValidUntil time.Time
	SecretShown        bool
	Replayed           bool `json:"-"`
	Node               Node
}

func (r *AgentKeyResult) setHead(h AuditHead) { r.Node.AuditHead = h }

// newAgentKey is a fresh random key and its sealed form for the node, made once per call.
type newAgentKey struct {
	plain, sealed []byte
}

// issueAgentKey makes a random key for the node and seals it, or returns the one this call
// already made (a call's rounds hand out one key). Nil without a sealer: the node keeps its
// key (generation 0, derived from the master secret, handed out by nobody).
func (s *Service) issueAgentKey(ctx context.Context, nodeID string, k **newAgentKey) (*newAgentKey, error) {
	if *k != nil || s.AgentKeySealer == nil {
		return *k, nil
	}
	plain := make([]byte, AgentKeyBytes)
	// crypto/rand.Read never fails on supported platforms (it crashes instead).
	_, _ = rand.Read(plain)
	sealed, err := s.AgentKeySealer.SealAgentKey(ctx, nodeID, plain)
	if err != nil {
		return nil, fmt.Errorf("seal agent key of node %s: %w", nodeID, err)
	}
	*k = &newAgentKey{plain: plain, sealed: sealed}
	return *k, nil
}

// rotateAgentKey moves n to the next key generation, key, at now: the current key becomes
// the previous one (the one before it is dropped at once).
func rotateAgentKey(n *Node, key []byte, now time.Time) {
	n.PrevAgentKey, n.AgentKey = n.AgentKey, key
	n.AgentKeyGen++
	n.AgentKeyRotatedAt = now
}

// RotateAgentKey gives a node's agent a new key (the next generation) and answers it once.
// The previous key keeps working for AgentKeyOverlap, so that the operator can install the
// new one on the agent while terminations run; after that only the new one does. Operators
// holding node.manage only (anyone else: the node's 404).
func (s *Service) RotateAgentKey(ctx context.Context, p Principal, req AgentKeyRotation, meta RequestMeta) (*AgentKeyResult, error) {
	if !p.CanOperate(PermNodeManage) || !ValidID(req.NodeID) {
		return nil, nodeNotFound()
	}
	var agentKey *newAgentKey
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionAgentKeyRotate, req))
	return runOp(s, ctx, opCall[AgentKeyResult]{
		rec:     s.opAudit(p, meta, ActionAgentKeyRotate, req.NodeID, "", nil, req.Reason),
		invalid: cmp.Or(req.Validate(), kerr),
		key:     key,
		missing: nodeNotFound,
		decide: func(st *NodeState, audit *AuditRecord, now time.Time) (*OperatorCommit, *AgentKeyResult, error) {
			if s.AgentKeySealer == nil {
				// A deployment fault, not the caller's: the stack always wires one.
				return nil, nil, errors.New("no agent key sealer is configured: node agent keys cannot be rotated")
			}
			k, err := s.issueAgentKey(ctx, req.NodeID, &agentKey)
			if err != nil {
				return nil, nil, err
			}
			c, r := DecideAgentKeyRotate(st, k.sealed, now)
			r.AgentKey = k.plain
			return c, r, nil
		},
		stored: func(r *AgentKeyResult) *AgentKeyResult {
			stored := *r
			stored.AgentKey, stored.SecretShown = nil, true
			return &stored
		},
	})
}

// EndAgentKeyOverlap ends the overlap of the node's current key generation now: from then on
// the previous generation is never tried again (terminate-node signs only with the current
// key), as after a leak of the previous key. It is recorded in the node's audit trail; ending
// an overlap that is over (or was never begun) changes no key and is recorded all the same.
// Operators holding node.manage only (anyone else: the node's 404).
func (s *Service) EndAgentKeyOverlap(ctx context.Context, p Principal, req AgentKeyRotation, meta RequestMeta) (*AgentKeyResult, error) {
	if !p.CanOperate(PermNodeManage) || !ValidID(req.NodeID) {
		return nil, nodeNotFound()
	}
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionAgentKeyOverlapEnd, req))
	return runOp(s, ctx, opCall[AgentKeyResult]{
		rec:     s.opAudit(p, meta, ActionAgentKeyOverlapEnd, req.NodeID, "", nil, req.Reason),
		invalid: cmp.Or(req.Validate(), kerr),
		key:     key,
		missing: nodeNotFound,
		decide: func(st *NodeState, _ *AuditRecord, now time.Time) (*OperatorCommit, *AgentKeyResult, error) {
			c, r := DecideAgentKeyOverlapEnd(st, now)
			return c, r, nil
		},
	})
}

// DecideAgentKeyOverlapEnd marks the node read's current generation as one whose overlap is
// over; the answer's PreviousValidUntil is when it ended (now, or earlier if it had).
func DecideAgentKeyOverlapEnd(st *NodeState, now time.Time) (*OperatorCommit, *AgentKeyResult) {
	n := st.Node
	until := now
	if end := n.AgentKeyRotatedAt.Add(AgentKeyOverlap); n.AgentKeyOverlapEndedGen != n.AgentKeyGen && end.Before(now) {
		until = end
	}
	n.AgentKeyOverlapEndedGen = n.AgentKeyGen
	n.Version++
	return &OperatorCommit{Node: st.Node, NewNode: &n},
		&AgentKeyResult{NodeID: n.ID, Gen: n.AgentKeyGen, PreviousValidUntil: until, Node: n}
}

// DecideAgentKeyRotate moves the node read to the next key generation, sealed.
func DecideAgentKeyRotate(st *NodeState, sealed []byte, now time.Time) (*OperatorCommit, *AgentKeyResult) {
	n := st.Node
	rotateAgentKey(&n, sealed, now)
	n.Version++
	return &OperatorCommit{Node: st.Node, NewNode: &n},
		&AgentKeyResult{NodeID: n.ID, Gen: n.AgentKeyGen, PreviousValidUntil: now.Add(AgentKeyOverlap), Node: n}
}
