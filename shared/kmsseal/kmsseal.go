// Package kmsseal seals node agent keys under a KMS key (capacity.AgentKeySealer and
// capacity.AgentKeyOpener): Encrypt and Decrypt with the node id in the encryption context,
// so that IAM can let the internet-facing api function seal keys (kms:Encrypt) while only the
// terminating function may open them (kms:Decrypt), and a key sealed for one node never opens
// as another's.
//
// The node id is also sealed inside the plaintext and checked after Decrypt: AWS refuses a
// Decrypt whose encryption context differs from the Encrypt's, but the local emulator ignores
// the context altogether, so this check is what binds a sealed key to its node there (and a
// second lock on AWS).
package kmsseal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"

	"github.com/openrelay/capacity/shared/capacity"
)

// Encryption context of every sealed agent key. The IAM grants condition on ContextPurpose.
const (
	ContextPurposeKey = "purpose"
	ContextPurpose    = "capacity-agent-key"
	ContextNodeKey    = "nodeId"
)

// plaintextLabel opens every sealed plaintext: label, node id, '\n', key.
const plaintextLabel = "capacity-agent-key/v1\n"

// maxCached bounds the opened keys a Sealer keeps (one per node and generation in use).
const maxCached = 4096

// API is the part of the KMS client used.
type API interface {
	Encrypt(ctx context.Context, in *kms.EncryptInput, optFns ...func(*kms.Options)) (*kms.EncryptOutput, error)
	Decrypt(ctx context.Context, in *kms.DecryptInput, optFns ...func(*kms.Options)) (*kms.DecryptOutput, error)
}

// Sealer seals and opens node agent keys under one KMS key. Opened keys are cached by their
// sealed form (which changes with every rotation), so a termination round costs no Decrypt
// after the node's first. Safe for concurrent use.
type Sealer struct {
	API   API
	KeyID string // key id, ARN or alias

	mu     sync.Mutex
	opened map[string][]byte // sealed -> key
}

var (
	_ capacity.AgentKeySealer = (*Sealer)(nil)
	_ capacity.AgentKeyOpener = (*Sealer)(nil)
)

// New returns a Sealer for the KMS key.
func New(api API, keyID string) *Sealer { return &Sealer{API: api, KeyID: keyID} }

func encryptionContext(nodeID string) map[string]string {
	return map[string]string{ContextPurposeKey: ContextPurpose, ContextNodeKey: nodeID}
}

// SealAgentKey encrypts key for node nodeID.
func (s *Sealer) SealAgentKey(ctx context.Context, nodeID string, key []byte) ([]byte, error) {
	if len(key) == 0 || !capacity.ValidID(nodeID) {
		return nil, fmt.Errorf("seal agent key of node %q: no key or invalid node id", nodeID)
	}
	out, err := s.API.Encrypt(ctx, &kms.EncryptInput{
		KeyId:             aws.String(s.KeyID),
		Plaintext:         append([]byte(plaintextLabel+nodeID+"\n"), key...),
		EncryptionContext: encryptionContext(nodeID),
	})
	if err != nil {
		return nil, fmt.Errorf("seal agent key of node %s: kms encrypt: %w", nodeID, err)
	}
	return out.CiphertextBlob, nil
}

// OpenAgentKey decrypts what SealAgentKey sealed for node nodeID; a key sealed for another
// node is refused.
func (s *Sealer) OpenAgentKey(ctx context.Context, nodeID string, sealed []byte) ([]byte, error) {
	if len(sealed) == 0 {
		return nil, fmt.Errorf("open agent key of node %s: nothing sealed", nodeID)
	}
	s.mu.Lock()
	key, ok := s.opened[string(sealed)]
	s.mu.Unlock()
	if ok {
		// The cache is by sealed form alone: check the node again (a key copied to another
		// node's item must not open there).
		return s.checkNode(nodeID, key)
	}
	out, err := s.API.Decrypt(ctx, &kms.DecryptInput{
		KeyId:             aws.String(s.KeyID),
		CiphertextBlob:    sealed,
		EncryptionContext: encryptionContext(nodeID),
	})
	if err != nil {
		return nil, fmt.Errorf("open agent key of node %s: kms decrypt: %w", nodeID, err)
	}
	s.mu.Lock()
	if s.opened == nil || len(s.opened) >= maxCached {
		s.opened = map[string][]byte{}
	}
	s.opened[string(sealed)] = out.Plaintext
	s.mu.Unlock()
	return s.checkNode(nodeID, out.Plaintext)
}

// checkNode returns the key in plaintext if it was sealed for nodeID.
func (s *Sealer) checkNode(nodeID string, plaintext []byte) ([]byte, error) {
	prefix := []byte(plaintextLabel + nodeID + "\n")
	key, ok := bytes.CutPrefix(plaintext, prefix)
	if !ok || len(key) == 0 {
		return nil, fmt.Errorf("open agent key of node %s: %w", nodeID, ErrOtherNode)
	}
	return bytes.Clone(key), nil
}

// ErrOtherNode: the sealed key is not this node's.
var ErrOtherNode = errors.New("sealed key was not sealed for this node")
