package capacitytest

import (
	"context"
	"slices"
	"sync"

	"github.com/openrelay/capacity/shared/capacity"
)

// Keys is the API keys' lookup in memory (auth.KeyStore), by the hash of the secret; it
// counts lookups, and fails every one while Err is set.
type Keys struct {
	mu      sync.Mutex
	keys    map[string]capacity.APIKey
	lookups map[string]int
	// consistent counts the strongly consistent lookups (of lookups) by hash.
	consistent map[string]int
	err        error
}

// Put stores k under hash (k.Hash is set to it).
func (s *Keys) Put(hash string, k capacity.APIKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]capacity.APIKey{}
	}
	k.Hash = hash
	s.keys[hash] = k
}

// Get returns the key stored under hash.
func (s *Keys) Get(hash string) (capacity.APIKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[hash]
	return k, ok
}

// Update changes the key stored under hash.
func (s *Keys) Update(hash string, change func(*capacity.APIKey)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[hash]
	change(&k)
	s.keys[hash] = k
}

// SetErr makes every lookup fail with err (nil: none).
func (s *Keys) SetErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Lookups returns how often the hash was looked up.
func (s *Keys) Lookups(hash string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups[hash]
}

// AllLookups returns how many lookups there were, of any hash.
func (s *Keys) AllLookups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sum(s.lookups)
}

// ConsistentLookups returns how many of the hash's lookups were strongly consistent.
func (s *Keys) ConsistentLookups(hash string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.consistent[hash]
}

func (s *Keys) LookupKey(ctx context.Context, hash string) (*capacity.APIKey, error) {
	return s.lookup(ctx, hash, false)
}

// LookupKeyConsistent is LookupKey, counted apart too (memory is always consistent).
func (s *Keys) LookupKeyConsistent(ctx context.Context, hash string) (*capacity.APIKey, error) {
	return s.lookup(ctx, hash, true)
}

func (s *Keys) lookup(_ context.Context, hash string, consistent bool) (*capacity.APIKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lookups == nil {
		s.lookups, s.consistent = map[string]int{}, map[string]int{}
	}
	s.lookups[hash]++
	if consistent {
		s.consistent[hash]++
	}
	if s.err != nil {
		return nil, s.err
	}
	k, ok := s.keys[hash]
	if !ok {
		return nil, nil
	}
	k.Permissions = slices.Clone(k.Permissions)
	return &k, nil
}
