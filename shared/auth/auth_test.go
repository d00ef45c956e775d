package auth_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// keysOf is an in-memory KeyStore holding each key under its secret's hash.
func keysOf(secrets map[string]capacity.APIKey) *capacitytest.Keys {
	keys := &capacitytest.Keys{}
	for secret, k := range secrets {
		keys.Put(auth.Hash(secret), k)
	}
	return keys
}

func ptr[T any](v T) *T { return &v }

var (
	secretValid    = capacity.FixedKeySecret("valid")
	secretOperator = capacity.FixedKeySecret("operator")
	secretRevoked  = capacity.FixedKeySecret("revoked")
	secretExpiring = capacity.FixedKeySecret("expiring") // expires at t0
	secretLater    = capacity.FixedKeySecret("later")    // expires 1ns after t0
	// secretLegacy is a key of the retired unchecksummed format, still in the store.
	secretLegacy = "ork_legacy"
)

func standardKeys() *capacitytest.Keys {
	return keysOf(map[string]capacity.APIKey{
		secretValid: {KeyID: "key-1", OrgID: "org-1",
			Permissions: []string{capacity.PermCapacity, capacity.PermRead}},
		secretOperator: {KeyID: "key-op", OrgID: "platform", Operator: true,
			Permissions: []string{capacity.PermPlace}},
		secretRevoked:  {KeyID: "key-rev", OrgID: "org-1", Permissions: []string{capacity.PermCapacity}, Revoked: true},
		secretExpiring: {KeyID: "key-exp", OrgID: "org-1", ExpiresAt: ptr(t0)},
		secretLater:    {KeyID: "key-later", OrgID: "org-2", ExpiresAt: ptr(t0.Add(time.Nanosecond))},
		secretLegacy:   {KeyID: "key-legacy", OrgID: "org-1", Permissions: []string{capacity.PermCapacity}},
	})
}

func assertUnauthenticated(t *testing.T, p capacity.Principal, err error) {
	t.Helper()
	var e *capacity.Error
	if !errors.As(err, &e) || e.Code != capacity.CodeUnauthenticated {
		t.Fatalf("err = %v, want a %q *capacity.Error", err, capacity.CodeUnauthenticated)
	}
	if e.Message == "" {
		t.Error("unauthenticated error has no message")
	}
	if !reflect.DeepEqual(p, capacity.Principal{}) {
		t.Errorf("principal = %+v alongside an error, want zero", p)
	}
}

func TestAuthenticate(t *testing.T) {
	valid := capacity.Principal{KeyID: "key-1", OrgID: "org-1",
		Permissions: []string{capacity.PermCapacity, capacity.PermRead}}
	tests := []struct {
		name       string
		header     string
		want       *capacity.Principal // nil: unauthenticated
		wantLookup bool                // whether the store is asked at all
	}{
		{"valid key", "Bearer " + secretValid, &valid, true},
		{"lower-case scheme", "bearer " + secretValid, &valid, true},
		{"upper-case scheme", "BEARER " + secretValid, &valid, true},
		{"mixed-case scheme", "bEaReR " + secretValid, &valid, true},
		{"spaces around the key", "Bearer   " + secretValid + "  ", &valid, true},
		{"operator key", "Bearer " + secretOperator, &capacity.Principal{KeyID: "key-op", OrgID: "platform",
			Operator: true, Permissions: []string{capacity.PermPlace}}, true},
		{"not yet expired", "Bearer " + secretLater, &capacity.Principal{KeyID: "key-later", OrgID: "org-2", ExpiresAt: ptr(t0.Add(time.Nanosecond))}, true},

		{"missing header", "", nil, false},
		{"missing scheme", secretValid, nil, false},
		{"scheme only", "Bearer", nil, false},
		{"empty key", "Bearer ", nil, false},
		{"blank key", "Bearer \t  ", nil, false},
		{"basic scheme with a valid secret", "Basic " + secretValid, nil, false},
		{"basic credentials", "Basic dXNlcjpwYXNz", nil, false},
		{"other scheme", "Token " + secretValid, nil, false},
		{"scheme glued to key", "Bearer" + secretValid, nil, false},
		{"unknown well-formed key", "Bearer " + capacity.FixedKeySecret("unknown"), nil, true},
		{"key differing in case (OCAP_: no known prefix)", "Bearer " + strings.ToUpper(secretValid), nil, false},
		{"no known prefix", "Bearer nope", nil, false},
		{"prefix not at the start", "Bearer x" + secretValid, nil, false},
		{"key with a suffix", "Bearer " + secretValid + "x", nil, false},
		{"two keys", "Bearer " + secretValid + " " + secretValid, nil, false},
		// Junk bearers with a well-formed prefix: no table read for any of them.
		{"ocap_ prefix only", "Bearer " + capacity.KeyPrefix, nil, false},
		{"ocap_ key with a wrong checksum", "Bearer " + secretValid[:len(secretValid)-1] + "x", nil, false},
		{"ocap_ key truncated", "Bearer " + secretValid[:len(secretValid)-1], nil, false},
		{"ocap_ prefix and random junk of the right length", "Bearer " + capacity.KeyPrefix + strings.Repeat("Z", 49), nil, false},
		{"ork_ prefix only", "Bearer ork_", nil, false},
		{"ork_ junk", "Bearer ork_" + strings.Repeat("a", 40), nil, false},
		{"ork_ key that is in the store (retired format)", "Bearer " + secretLegacy, nil, false},
		{"revoked", "Bearer " + secretRevoked, nil, true},
		{"expired at exactly ExpiresAt", "Bearer " + secretExpiring, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := standardKeys()
			a := &auth.Authenticator{Keys: keys, TTL: time.Minute, Now: func() time.Time { return t0 }}
			p, err := a.Authenticate(context.Background(), tt.header)
			if tt.want == nil {
				assertUnauthenticated(t, p, err)
			} else {
				if err != nil {
					t.Fatalf("err = %v, want principal %+v", err, *tt.want)
				}
				if !reflect.DeepEqual(p, *tt.want) {
					t.Errorf("principal = %+v, want %+v", p, *tt.want)
				}
			}
			total := keys.AllLookups()
			if gotLookup := total > 0; gotLookup != tt.wantLookup {
				t.Errorf("store lookups = %d, want lookup: %v", total, tt.wantLookup)
			}
		})
	}
}

func TestExpiryIsJudgedAtEachCall(t *testing.T) {
	keys := standardKeys()
	clk := capacitytest.NewClock(t0.Add(-time.Second))
	a := &auth.Authenticator{Keys: keys, TTL: time.Hour, Now: clk.Now}
	if _, err := a.Authenticate(context.Background(), "Bearer "+secretExpiring); err != nil {
		t.Fatalf("a second before expiry: %v", err)
	}
	clk.Advance(time.Second) // now == ExpiresAt, and the key is cached
	p, err := a.Authenticate(context.Background(), "Bearer "+secretExpiring)
	assertUnauthenticated(t, p, err)
	if n := keys.Lookups(auth.Hash(secretExpiring)); n != 1 {
		t.Errorf("store lookups = %d, want 1 (expiry must not need a fresh lookup)", n)
	}
}

func TestStoreErrorIsNotUnauthenticated(t *testing.T) {
	storeErr := errors.New("dynamodb: throttled")
	keys := standardKeys()
	keys.SetErr(storeErr)
	a := &auth.Authenticator{Keys: keys, TTL: time.Minute, Now: func() time.Time { return t0 }}

	_, err := a.Authenticate(context.Background(), "Bearer "+secretValid)
	if err == nil {
		t.Fatal("no error from a failing store")
	}
	if !errors.Is(err, storeErr) {
		t.Errorf("err = %v, want it to wrap the store's error", err)
	}
	if code := capacity.ErrorCode(err); code != capacity.CodeInternal {
		t.Errorf("code = %q, want %q: a store outage must not tell the caller its key is bad", code, capacity.CodeInternal)
	}

	// Failures are not cached: once the store is back the key works, within the TTL.
	keys.SetErr(nil)
	if _, err := a.Authenticate(context.Background(), "Bearer "+secretValid); err != nil {
		t.Fatalf("after the store recovered: %v", err)
	}
	if n := keys.Lookups(auth.Hash(secretValid)); n != 2 {
		t.Errorf("store lookups = %d, want 2", n)
	}
}

func TestCache(t *testing.T) {
	const ttl = 30 * time.Second
	secretNew := capacity.FixedKeySecret("new")
	ctx := context.Background()
	type step struct {
		advance  time.Duration
		change   func(*capacitytest.Keys) // applied to the store before the call
		secret   string
		wantOK   bool
		wantHits int // store lookups for the secret so far
	}
	tests := []struct {
		name  string
		ttl   time.Duration
		steps []step
	}{
		{"second lookup within the TTL is served from the cache", ttl, []step{
			{secret: secretValid, wantOK: true, wantHits: 1},
			{advance: ttl - time.Nanosecond, secret: secretValid, wantOK: true, wantHits: 1},
		}},
		{"lookup at the TTL goes to the store again", ttl, []step{
			{secret: secretValid, wantOK: true, wantHits: 1},
			{advance: ttl, secret: secretValid, wantOK: true, wantHits: 2},
			{advance: time.Second, secret: secretValid, wantOK: true, wantHits: 2},
		}},
		{"a key revoked in the store keeps working within the TTL, then stops", ttl, []step{
			{secret: secretValid, wantOK: true, wantHits: 1},
			{advance: time.Second, change: func(k *capacitytest.Keys) {
				k.Update(auth.Hash(secretValid), func(a *capacity.APIKey) { a.Revoked = true })
			}, secret: secretValid, wantOK: true, wantHits: 1},
			{advance: ttl - time.Second - time.Nanosecond, secret: secretValid, wantOK: true, wantHits: 1},
			{advance: time.Nanosecond, secret: secretValid, wantOK: false, wantHits: 2},
			{advance: time.Second, secret: secretValid, wantOK: false, wantHits: 2},
		}},
		{"misses are cached too", ttl, []step{
			{secret: secretNew, wantOK: false, wantHits: 1},
			{advance: time.Second, change: func(k *capacitytest.Keys) {
				k.Put(auth.Hash(secretNew), capacity.APIKey{KeyID: "key-new", OrgID: "org-3"})
			}, secret: secretNew, wantOK: false, wantHits: 1},
			{advance: ttl, secret: secretNew, wantOK: true, wantHits: 2},
		}},
		{"keys are cached separately", ttl, []step{
			{secret: secretValid, wantOK: true, wantHits: 1},
			{secret: secretOperator, wantOK: true, wantHits: 1},
			{secret: secretValid, wantOK: true, wantHits: 1},
			{secret: secretOperator, wantOK: true, wantHits: 1},
		}},
		{"no TTL: every call looks the key up", 0, []step{
			{secret: secretValid, wantOK: true, wantHits: 1},
			{secret: secretValid, wantOK: true, wantHits: 2},
			{change: func(k *capacitytest.Keys) {
				k.Update(auth.Hash(secretValid), func(a *capacity.APIKey) { a.Revoked = true })
			}, secret: secretValid, wantOK: false, wantHits: 3},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := standardKeys()
			clk := capacitytest.NewClock(t0.Add(-time.Hour))
			a := &auth.Authenticator{Keys: keys, TTL: tt.ttl, Now: clk.Now}
			for i, s := range tt.steps {
				clk.Advance(s.advance)
				if s.change != nil {
					s.change(keys)
				}
				_, err := a.Authenticate(ctx, "Bearer "+s.secret)
				if ok := err == nil; ok != s.wantOK {
					t.Errorf("step %d: err = %v, want ok=%v", i, err, s.wantOK)
				}
				if err != nil && capacity.ErrorCode(err) != capacity.CodeUnauthenticated {
					t.Errorf("step %d: code = %q", i, capacity.ErrorCode(err))
				}
				if n := keys.Lookups(auth.Hash(s.secret)); n != s.wantHits {
					t.Errorf("step %d: store lookups = %d, want %d", i, n, s.wantHits)
				}
			}
		})
	}
}

func TestConcurrentAuthenticate(t *testing.T) {
	keys := standardKeys()
	clk := capacitytest.NewClock(t0.Add(-time.Hour))
	a := &auth.Authenticator{Keys: keys, TTL: time.Second, Now: clk.Now}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 200 {
				secret := secretValid
				if (i+j)%3 == 0 {
					secret = capacity.FixedKeySecret(fmt.Sprintf("unknown%d", j%5))
				}
				if j%50 == 0 {
					clk.Advance(time.Second)
				}
				_, err := a.Authenticate(context.Background(), "Bearer "+secret)
				if (secret == secretValid) != (err == nil) {
					t.Errorf("secret %s: err = %v", secret, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestHash(t *testing.T) {
	tests := []struct{ secret, want string }{
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{secretValid, func() string { s := sha256.Sum256([]byte(secretValid)); return hex.EncodeToString(s[:]) }()},
	}
	for _, tt := range tests {
		if got := auth.Hash(tt.secret); got != tt.want {
			t.Errorf("Hash(%q) = %s, want %s", tt.secret, got, tt.want)
		}
	}
	if auth.Hash("a") == auth.Hash("A") {
		t.Error("Hash is case-insensitive")
	}
}

func TestNewSecret(t *testing.T) {
	const n = 1000
	seen := make(map[string]bool, n)
	for range n {
		s := auth.NewSecret()
		if !strings.HasPrefix(s, capacity.KeyPrefix) || len(s) != 54 {
			t.Fatalf("secret %q: want %s and 49 base62 characters", s, capacity.KeyPrefix)
		}
		if err := capacity.CheckKeySecret(s); err != nil {
			t.Fatalf("secret %q does not check: %v", s, err)
		}
		if seen[s] {
			t.Fatalf("secret %q generated twice", s)
		}
		seen[s] = true
	}

	// A new secret works as a bearer key once its hash is stored.
	s := auth.NewSecret()
	keys := keysOf(map[string]capacity.APIKey{s: {KeyID: "k", OrgID: "o"}})
	a := &auth.Authenticator{Keys: keys, Now: func() time.Time { return t0 }}
	if p, err := a.Authenticate(context.Background(), "Bearer "+s); err != nil || p.KeyID != "k" {
		t.Fatalf("Authenticate(new secret) = %+v, %v", p, err)
	}
}

// failingKeys fails the test if it is asked anything.
type failingKeys struct{ t *testing.T }

func (f failingKeys) LookupKey(context.Context, string) (*capacity.APIKey, error) {
	f.t.Error("the key store was asked about a malformed key")
	return nil, errors.New("unexpected lookup")
}

func (f failingKeys) LookupKeyConsistent(ctx context.Context, h string) (*capacity.APIKey, error) {
	return f.LookupKey(ctx, h)
}

// A mistyped, truncated or otherwise malformed ocap_ key, and any key of the retired ork_
// format, is refused without a table read.
func TestMalformedKeyIsRefusedWithoutLookup(t *testing.T) {
	good := auth.NewSecret()
	swapped := []byte(good)
	i := len(capacity.KeyPrefix) + 3
	for swapped[i] == swapped[i+1] {
		i++
	}
	swapped[i], swapped[i+1] = swapped[i+1], swapped[i]
	changed := []byte(good)
	changed[20] = map[bool]byte{true: 'x', false: 'y'}[changed[20] != 'x']
	for _, tt := range []struct{ name, secret string }{
		{"one char changed", string(changed)},
		{"two chars swapped", string(swapped)},
		{"truncated", good[:len(good)-1]},
		{"extended", good + "0"},
		{"prefix only", capacity.KeyPrefix},
		{"bad character", good[:30] + "_" + good[31:]},
		{"retired ork_ key", "ork_legacy"},
		{"retired ork_ prefix only", "ork_"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &auth.Authenticator{Keys: failingKeys{t}, TTL: time.Minute, Now: func() time.Time { return t0 }}
			p, err := a.Authenticate(context.Background(), "Bearer "+tt.secret)
			assertUnauthenticated(t, p, err)
		})
	}
	// The well-formed key is looked up (and unknown here).
	keys := standardKeys()
	a := &auth.Authenticator{Keys: keys, Now: func() time.Time { return t0 }}
	p, err := a.Authenticate(context.Background(), "Bearer "+good)
	assertUnauthenticated(t, p, err)
	if keys.Lookups(auth.Hash(good)) != 1 {
		t.Errorf("a well-formed unknown key was looked up %d times, want 1", keys.Lookups(auth.Hash(good)))
	}
}

// touch is one recorded use.
type touch struct {
	hash string
	at   time.Time
}

// chanToucher sends each touch on a channel; if block is set, it then waits for it.
type chanToucher struct {
	touches chan touch
	block   chan struct{}
	ctxErr  chan error // after block: the touch's context's error
	err     error
}

func (c *chanToucher) TouchKey(ctx context.Context, hash string, at time.Time) error {
	c.touches <- touch{hash, at}
	if c.block != nil {
		<-c.block
		c.ctxErr <- ctx.Err()
	}
	return c.err
}

func expectTouch(t *testing.T, c *chanToucher, want touch) {
	t.Helper()
	select {
	case got := <-c.touches:
		if got != want {
			t.Errorf("touch = %+v, want %+v", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no touch recorded, want %+v", want)
	}
}

func expectNoTouch(t *testing.T, c *chanToucher) {
	t.Helper()
	select {
	case got := <-c.touches:
		t.Errorf("unexpected touch %+v", got)
	default:
	}
}

// The last use is recorded at most once a minute per key from one instance.
func TestLastUsedIsRecordedOncePerMinute(t *testing.T) {
	keys := standardKeys()
	clk := capacitytest.NewClock(t0.Add(-time.Hour))
	c := &chanToucher{touches: make(chan touch, 10)}
	a := &auth.Authenticator{Keys: keys, TTL: time.Hour, Now: clk.Now, Touch: c}
	ctx := context.Background()
	mustAuth := func() {
		t.Helper()
		if _, err := a.Authenticate(ctx, "Bearer "+secretValid); err != nil {
			t.Fatal(err)
		}
	}
	start := clk.Now()
	mustAuth()
	expectTouch(t, c, touch{auth.Hash(secretValid), start})
	clk.Advance(time.Minute - time.Nanosecond)
	mustAuth()
	// A second key is recorded on its own.
	if _, err := a.Authenticate(ctx, "Bearer "+secretOperator); err != nil {
		t.Fatal(err)
	}
	expectTouch(t, c, touch{auth.Hash(secretOperator), clk.Now()})
	clk.Advance(time.Nanosecond)
	mustAuth()
	expectTouch(t, c, touch{auth.Hash(secretValid), start.Add(time.Minute)})
	// Refused calls record nothing.
	if _, err := a.Authenticate(ctx, "Bearer "+secretRevoked); err == nil {
		t.Fatal("revoked key authenticated")
	}
	expectNoTouch(t, c)
}

// A recording that blocks (or fails) delays and changes nothing in the answer.
func TestLastUsedNeverDelaysTheAnswer(t *testing.T) {
	keys := standardKeys()
	c := &chanToucher{touches: make(chan touch, 1), block: make(chan struct{}), ctxErr: make(chan error, 1),
		err: errors.New("throttled")}
	a := &auth.Authenticator{Keys: keys, Now: func() time.Time { return t0 }, Touch: c, TouchTimeout: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	type answer struct {
		p   capacity.Principal
		err error
	}
	done := make(chan answer, 1)
	go func() {
		p, err := a.Authenticate(ctx, "Bearer "+secretValid)
		done <- answer{p, err}
	}()
	expectTouch(t, c, touch{auth.Hash(secretValid), t0})
	select {
	case got := <-done: // the touch is still blocked
		if got.err != nil || got.p.KeyID != "key-1" {
			t.Fatalf("Authenticate = %+v, %v", got.p, got.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Authenticate waited for the blocked touch")
	}
	// The request's end does not cancel the touch.
	cancel()
	close(c.block)
	if err := <-c.ctxErr; err != nil {
		t.Errorf("the touch's context ended with the request: %v", err)
	}
}

// Bearers that are no key at all never reach the store, so they cannot flush the cache of
// real keys either.
func TestJunkBearersNeitherLookUpNorFlushTheCache(t *testing.T) {
	keys := standardKeys()
	a := &auth.Authenticator{Keys: keys, TTL: time.Hour, Now: func() time.Time { return t0 }}
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, "Bearer "+secretValid); err != nil {
		t.Fatal(err)
	}
	for i := range 10001 {
		p, err := a.Authenticate(ctx, fmt.Sprintf("Bearer junk-%d", i))
		if i == 0 {
			assertUnauthenticated(t, p, err)
		}
	}
	if _, err := a.Authenticate(ctx, "Bearer "+secretValid); err != nil {
		t.Fatal(err)
	}
	total := keys.AllLookups()
	if total != 1 || keys.Lookups(auth.Hash(secretValid)) != 1 {
		t.Errorf("store lookups = %d (valid key %d), want 1: junk bearers reached the store or flushed the cache", total, keys.Lookups(auth.Hash(secretValid)))
	}
}

// Well-formed bearers that name no key (the checksum is public, so anyone can make them):
// each costs one read, then no more within the TTL however often it is sent; and however many
// there are, they never push a real key out of the cache (its next call costs no read).
func TestWellFormedJunkNeitherRereadsNorFlushesRealKeys(t *testing.T) {
	const distinct = 9999 // with the 2 real keys, more than the one cache of before held
	keys := standardKeys()
	a := &auth.Authenticator{Keys: keys, TTL: time.Hour, Now: func() time.Time { return t0 }}
	ctx := context.Background()
	for _, s := range []string{secretValid, secretOperator} {
		if _, err := a.Authenticate(ctx, "Bearer "+s); err != nil {
			t.Fatal(err)
		}
	}
	junk := make([]string, distinct)
	for i := range junk {
		junk[i] = "Bearer " + capacity.FixedKeySecret(fmt.Sprintf("junk%dx", i))
	}
	for _, j := range junk {
		p, err := a.Authenticate(ctx, j)
		assertUnauthenticated(t, p, err)
	}
	// The last bearers again, as a flood repeats them: answered from the miss cache.
	for range 3 {
		for _, j := range junk[distinct-100:] {
			p, err := a.Authenticate(ctx, j)
			assertUnauthenticated(t, p, err)
		}
	}
	// Nor on a granting route, which reads past the cache of keys found.
	p, err := a.AuthenticateFresh(ctx, junk[0])
	assertUnauthenticated(t, p, err)
	if got := keys.AllLookups(); got != 2+distinct {
		t.Errorf("store reads = %d, want %d: one per real key and one per distinct junk bearer", got, 2+distinct)
	}
	for _, s := range []string{secretValid, secretOperator} {
		if _, err := a.Authenticate(ctx, "Bearer "+s); err != nil {
			t.Fatal(err)
		}
		if n := keys.Lookups(auth.Hash(s)); n != 1 {
			t.Errorf("a real key was read %d times, want 1: the junk flushed it from the cache", n)
		}
	}
}

// A recording that failed is forgotten, so the key's next use tries again within the minute
// instead of leaving a minute unrecorded.
func TestLastUsedFailedIsRetriedAtNextUse(t *testing.T) {
	keys := standardKeys()
	c := &chanToucher{touches: make(chan touch, 10), err: errors.New("context deadline exceeded")}
	a := &auth.Authenticator{Keys: keys, TTL: time.Hour, Now: func() time.Time { return t0 }, Touch: c}
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, "Bearer "+secretValid); err != nil {
		t.Fatal(err)
	}
	expectTouch(t, c, touch{auth.Hash(secretValid), t0})
	// The failure is forgotten once the goroutine has run: poll with further uses until one
	// records again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := a.Authenticate(ctx, "Bearer "+secretValid); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-c.touches:
			if got != (touch{auth.Hash(secretValid), t0}) {
				t.Errorf("touch = %+v", got)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("after a failed recording, later uses within the minute never tried again")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestExpiredKeySaysWhen: the holder of an expired key's secret learns that it expired, and
// when; an unknown key, a revoked one, and a revoked one that has also expired learn nothing
// more than "unknown, revoked or expired".
func TestExpiredKeySaysWhen(t *testing.T) {
	revokedAndExpired := capacity.FixedKeySecret("revokedExpired")
	keys := standardKeys()
	keys.Put(auth.Hash(revokedAndExpired), capacity.APIKey{KeyID: "key-re", OrgID: "org-1", Revoked: true, ExpiresAt: ptr(t0.Add(-time.Hour))})
	tests := []struct {
		name      string
		secret    string
		expiredAt *time.Time
		detail    string
	}{
		{"expired", secretExpiring, ptr(t0), "the API key expired at " + t0.UTC().Format(time.RFC3339) + ": ask an operator for a new one"},
		{"unknown", capacity.FixedKeySecret("unknown"), nil, "the API key is unknown, revoked or expired"},
		{"revoked", secretRevoked, nil, "the API key is unknown, revoked or expired"},
		{"revoked and expired", revokedAndExpired, nil, "the API key is unknown, revoked or expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &auth.Authenticator{Keys: keys, TTL: time.Minute, Now: func() time.Time { return t0 }}
			p, err := a.Authenticate(context.Background(), "Bearer "+tt.secret)
			assertUnauthenticated(t, p, err)
			var e *capacity.Error
			errors.As(err, &e)
			if e.Message != tt.detail {
				t.Errorf("detail = %q, want %q", e.Message, tt.detail)
			}
			if !reflect.DeepEqual(e.ExpiredAt, tt.expiredAt) {
				t.Errorf("expiredAt = %v, want %v", e.ExpiredAt, tt.expiredAt)
			}
		})
	}
}
