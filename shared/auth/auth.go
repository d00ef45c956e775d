// Package auth turns a bearer API key into a capacity.Principal.
package auth

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// KeyStore finds a stored key by the hash of its secret (nil when there is none). In the
// functions it is dynamo.Keys: a table the api function may only read.
type KeyStore interface {
	LookupKey(ctx context.Context, hash string) (*capacity.APIKey, error)
	// LookupKeyConsistent is LookupKey with a strongly consistent read (AuthenticateFresh).
	LookupKeyConsistent(ctx context.Context, hash string) (*capacity.APIKey, error)
}

// Toucher records that a key was used (dynamo.Keys: an UpdateItem of its LastUsedAt that
// moves it at most once a minute whichever instance asks).
type Toucher interface {
	TouchKey(ctx context.Context, keyHash string, at time.Time) error
}

// legacyKeyPrefix started the unchecksummed keys of before the ocap_ format: they are
// refused (without a read) with a message saying so.
const legacyKeyPrefix = "ork_"

// Hash returns the stored form of a key secret: hex SHA-256 (capacity.HashKeySecret).
func Hash(secret string) string { return capacity.HashKeySecret(secret) }

// NewSecret returns a new random key secret in the checksummed ocap_ format.
func NewSecret() string {
	s, err := capacity.NewKeySecret()
	if err != nil {
		panic(err) // crypto/rand.Read never fails (Go 1.24+)
	}
	return s
}

// Authenticator resolves bearer keys, caching lookups (hits and misses) for TTL. A revoked
// key therefore keeps working for up to TTL in a warm function instance (except on the
// granting routes: AuthenticateFresh).
//
// Hits and misses are cached apart, each bounded: the checksum of a key is public (CRC32), so
// anyone can make well-formed bearers that name no key, and each new one costs a read. Kept
// apart, such bearers fill only the miss cache, never evicting a real key (whose next call
// would cost a read too), and a junk bearer repeated costs no read within TTL.
type Authenticator struct {
	Keys KeyStore
	TTL  time.Duration
	Now  func() time.Time
	// Touch, if set, records a key's use after it authenticated: at most once per TouchEvery
	// per key from this instance, in a goroutine the answer never waits for.
	Touch Toucher
	// TouchEvery is how often this instance records one key's use (default a minute).
	TouchEvery time.Duration
	// TouchTimeout bounds one recording (default 2s).
	TouchTimeout time.Duration
	Logger       *slog.Logger

	mu    sync.Mutex
	cache map[string]cached // keys found, by hash
	// misses: when a lookup of the hash (found nothing) was made, by hash.
	misses  map[string]time.Time
	touched map[string]time.Time // by hash: when this instance last recorded the key's use
}

type cached struct {
	key     *capacity.APIKey
	fetched time.Time
}

// maxCached bounds the cache of keys found, and of misses; past it that cache (only) is
// cleared: keys are few per instance, and misses can only push out misses.
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
	return a.authenticate(ctx, header, false)
}

// AuthenticateFresh is Authenticate past the cache: the key is read strongly consistently,
// and the cache takes what was read. The routes that grant (a key's creation, an agent key
// handed out) use it, so that a key revoked a moment ago cannot mint what would outlive it
// while this instance still caches it as valid.
func (a *Authenticator) AuthenticateFresh(ctx context.Context, header string) (capacity.Principal, error) {
	return a.authenticate(ctx, header, true)
}

func (a *Authenticator) authenticate(ctx context.Context, header string, fresh bool) (capacity.Principal, error) {
	scheme, secret, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
		return capacity.Principal{}, capacity.Errorf(capacity.CodeUnauthenticated, "an API key is required: Authorization: Bearer <key>")
	}
	secret = strings.TrimSpace(secret)
	// Only a well-formed, checksummed key is looked up: a mistyped or truncated key, a legacy
	// unchecksummed ork_ key and anything that is no key at all are refused without a table
	// read. The checksum stops typos, not an attacker (it is public): a well-formed bearer
	// that names no key costs one read, then sits in the miss cache (see Authenticator).
	if err := capacity.CheckKeySecret(secret); err != nil {
		msg := "the API key is malformed (mistyped or truncated?)"
		switch {
		case strings.HasPrefix(secret, legacyKeyPrefix):
			msg = "ork_ API keys are no longer accepted: ask an operator for a new ocap_ key"
		case !strings.HasPrefix(secret, capacity.KeyPrefix):
			msg = "the API key is malformed: keys start with " + capacity.KeyPrefix
		}
		return capacity.Principal{}, capacity.Errorf(capacity.CodeUnauthenticated, "%s", msg)
	}
	hash := Hash(secret)
	key, err := a.lookup(ctx, hash, fresh)
	if err != nil {
		return capacity.Principal{}, fmt.Errorf("authenticate: %w", err)
	}
	now := a.now()
	if key != nil && !key.Revoked && key.ExpiresAt != nil && !now.Before(*key.ExpiresAt) {
		// The caller holds the secret of a key that was valid: it may learn that the key
		// expired, and when, so it asks for a new one rather than suspect a typo. A revoked
		// key (expired or not) says nothing more than an unknown one.
		at := key.ExpiresAt.UTC()
		return capacity.Principal{}, &capacity.Error{Code: capacity.CodeUnauthenticated, ExpiredAt: &at,
			Message: fmt.Sprintf("the API key expired at %s: ask an operator for a new one", at.Format(time.RFC3339))}
	}
	if key == nil || !key.Usable(now) {
		return capacity.Principal{}, capacity.Errorf(capacity.CodeUnauthenticated, "the API key is unknown, revoked or expired")
	}
	a.touch(ctx, hash, key.KeyID, now)
	return key.Principal(), nil
}

// touch records the key's use, unless this instance did within TouchEvery, in a goroutine
// with a context detached from the request's: the answer never waits for it, and a failure
// is only logged. (In Lambda the goroutine may be frozen with the instance and finish at its
// next invocation; a use it misses is recorded by the next one.)
func (a *Authenticator) touch(ctx context.Context, hash, keyID string, now time.Time) {
	if a.Touch == nil {
		return
	}
	every := a.TouchEvery
	if every <= 0 {
		every = time.Minute
	}
	a.mu.Lock()
	last, ok := a.touched[hash]
	if ok && now.Sub(last) < every && !now.Before(last) {
		a.mu.Unlock()
		return
	}
	if a.touched == nil || len(a.touched) >= maxCached {
		a.touched = make(map[string]time.Time)
	}
	a.touched[hash] = now
	a.mu.Unlock()

	timeout := a.TouchTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	logger := a.Logger
	if logger == nil {
		logger = slog.Default()
	}
	go func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if err := a.Touch.TouchKey(tctx, hash, now); err != nil {
			// Forget this attempt so the next use tries again, rather than skipping a minute
			// (in Lambda a goroutine frozen after the answer fails its deadline on thaw).
			// Unless a later attempt has taken its place since.
			a.mu.Lock()
			if at, ok := a.touched[hash]; ok && at.Equal(now) {
				delete(a.touched, hash)
			}
			a.mu.Unlock()
			logger.WarnContext(tctx, "recording the API key's last use failed", "key_id", keyID, "err", err)
		}
	}()
}

func (a *Authenticator) lookup(ctx context.Context, hash string, fresh bool) (*capacity.APIKey, error) {
	now := a.now()
	a.mu.Lock()
	c, hit := a.cache[hash]
	missed, miss := a.misses[hash]
	a.mu.Unlock()
	if miss && now.Sub(missed) < a.TTL {
		// Even past the cache: a repeated junk bearer costs no read on any route, and a
		// key that was unknown a moment ago may wait out the TTL on a granting one too.
		return nil, nil
	}
	if fresh {
		key, err := a.Keys.LookupKeyConsistent(ctx, hash)
		if err != nil {
			return nil, err
		}
		a.remember(hash, key, now)
		return key, nil
	}
	if hit && now.Sub(c.fetched) < a.TTL {
		return c.key, nil
	}
	key, err := a.Keys.LookupKey(ctx, hash)
	if err != nil {
		return nil, err
	}
	a.remember(hash, key, now)
	return key, nil
}

// remember caches what a lookup of hash found at now: a key among the keys, nothing among
// the misses.
func (a *Authenticator) remember(hash string, key *capacity.APIKey, now time.Time) {
	if a.TTL <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if key == nil {
		delete(a.cache, hash)
		if a.misses == nil || len(a.misses) >= maxCached {
			a.misses = make(map[string]time.Time)
		}
		a.misses[hash] = now
		return
	}
	delete(a.misses, hash)
	if a.cache == nil || len(a.cache) >= maxCached {
		a.cache = make(map[string]cached)
	}
	a.cache[hash] = cached{key: key, fetched: now}
}
