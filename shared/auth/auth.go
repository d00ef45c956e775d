// Package auth turns a bearer API key into a capacity.Principal.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// KeyStore finds a stored key by the hash of its secret (nil when there is none). In the
// functions it is dynamo.Keys: a table the api function may only read.
type KeyStore interface {
	LookupKey(ctx context.Context, hash string) (*capacity.APIKey, error)
}

// Hash returns the stored form of a key secret: hex SHA-256. Secrets are 256-bit random
// values, so an unsalted fast hash is enough and lets a lookup be one GetItem.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// NewSecret returns a new random key secret with a recognisable prefix.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "ork_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// Authenticator resolves bearer keys, caching lookups (hits and misses) for TTL. A revoked
// key therefore keeps working for up to TTL in a warm function instance.
type Authenticator struct {
	Keys KeyStore
	TTL  time.Duration
	Now  func() time.Time

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	key     *capacity.APIKey
	fetched time.Time
}

// maxCached bounds the cache; past it the cache is cleared (keys are few per instance).
const maxCached = 10000

func (a *Authenticator) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Authenticate returns the principal for an Authorization header value, or an
// unauthenticated error.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (capacity.Principal, error) {
	scheme, secret, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
		return capacity.Principal{}, capacity.Errorf(capacity.CodeUnauthenticated, "an API key is required: Authorization: Bearer <key>")
	}
	key, err := a.lookup(ctx, Hash(strings.TrimSpace(secret)))
	if err != nil {
		return capacity.Principal{}, fmt.Errorf("authenticate: %w", err)
	}
	now := a.now()
	if key == nil || key.Revoked || (key.ExpiresAt != nil && !now.Before(*key.ExpiresAt)) {
		return capacity.Principal{}, capacity.Errorf(capacity.CodeUnauthenticated, "the API key is unknown, revoked or expired")
	}
	return capacity.Principal{KeyID: key.KeyID, OrgID: key.OrgID, Permissions: key.Permissions, Operator: key.Operator}, nil
}

func (a *Authenticator) lookup(ctx context.Context, hash string) (*capacity.APIKey, error) {
	now := a.now()
	a.mu.Lock()
	c, ok := a.cache[hash]
	a.mu.Unlock()
	if ok && now.Sub(c.fetched) < a.TTL {
		return c.key, nil
	}
	key, err := a.Keys.LookupKey(ctx, hash)
	if err != nil {
		return nil, err
	}
	if a.TTL > 0 {
		a.mu.Lock()
		if a.cache == nil || len(a.cache) >= maxCached {
			a.cache = make(map[string]cached)
		}
		a.cache[hash] = cached{key: key, fetched: now}
		a.mu.Unlock()
	}
	return key, nil
}
