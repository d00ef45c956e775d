package capacity_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// memKeys is an in-memory KeyStore; each method can be made to fail once.
type memKeys struct {
	mu     sync.Mutex
	keys   map[string]capacity.APIKey // by id
	idem   map[string]capacity.IdempotencyRecord
	audits []capacity.AuditRecord
	// createErr, if set, is returned by the next CreateKey; landed says whether that create
	// is applied anyway (a timeout after the write).
	createErr error
	landed    bool
	// beforeCreate runs inside the next CreateKey, before its conditions are checked.
	beforeCreate func(m *memKeys)
	// beforeRevoke runs inside the next RevokeKey, before its condition is checked.
	beforeRevoke func(m *memKeys)
	reads        int
	// hidden makes the next GetKey calls answer not found (a read that does not yet see a
	// write in flight).
	hidden int
}

func newMemKeys() *memKeys {
	return &memKeys{keys: map[string]capacity.APIKey{}, idem: map[string]capacity.IdempotencyRecord{}}
}

func (m *memKeys) KeyIdempotency(_ context.Context, scope string) (*capacity.IdempotencyRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.idem[scope]
	if !ok {
		return nil, nil
	}
	return &r, nil
}

func (m *memKeys) CreateKey(_ context.Context, k capacity.APIKey, idem *capacity.IdempotencyRecord, audit capacity.AuditRecord) error {
	if f := m.beforeCreate; f != nil {
		m.beforeCreate = nil
		f(m)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.createErr
	m.createErr = nil
	if err != nil && !m.landed {
		return err
	}
	if _, ok := m.keys[k.KeyID]; ok {
		return fmt.Errorf("key id: %w", capacity.ErrConflict)
	}
	if idem != nil {
		if _, ok := m.idem[idem.Scope]; ok {
			return fmt.Errorf("idempotency: %w", capacity.ErrConflict)
		}
		m.idem[idem.Scope] = *idem
	}
	m.keys[k.KeyID] = k
	m.audits = append(m.audits, audit)
	return err
}

func (m *memKeys) AppendAudit(_ context.Context, rec capacity.AuditRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.audits = append(m.audits, rec)
	return nil
}

func (m *memKeys) GetKey(_ context.Context, id string) (*capacity.APIKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	k, ok := m.keys[id]
	if m.hidden > 0 {
		m.hidden--
		ok = false
	}
	if !ok {
		return nil, capacity.Errorf(capacity.CodeNotFound, "no key %s", id)
	}
	return &k, nil
}

func (m *memKeys) ListKeys(context.Context, int, string) ([]capacity.APIKey, bool, error) {
	return nil, false, errors.New("not used")
}

func (m *memKeys) RevokeKey(_ context.Context, k capacity.APIKey, at time.Time, audit capacity.AuditRecord) error {
	if f := m.beforeRevoke; f != nil {
		m.beforeRevoke = nil
		f(m)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.keys[k.KeyID]
	if cur.Revoked {
		return fmt.Errorf("key %s: %w", k.KeyID, capacity.ErrConflict)
	}
	cur.Revoked, cur.RevokedAt = true, &at
	m.keys[k.KeyID] = cur
	m.audits = append(m.audits, audit)
	return nil
}

var (
	keyT0    = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	operator = withKeyID(capacity.Bootstrap("platform"), "key-op") // holds every permission
)

func withKeyID(p capacity.Principal, id string) capacity.Principal { p.KeyID = id; return p }

func keyService(store *memKeys) *capacity.Service {
	n := 0
	return &capacity.Service{Keys: store, Now: func() time.Time { return keyT0 },
		NewID: func() string { n++; return fmt.Sprintf("id%d", n) }}
}

func wantCode(t *testing.T, err error, code capacity.Code) {
	t.Helper()
	if got := capacity.ErrorCode(err); got != code {
		t.Fatalf("err = %v (code %q), want %q", err, got, code)
	}
}

func TestKeyCallsAreOperatorOnly(t *testing.T) {
	store := newMemKeys()
	store.keys["key-x"] = capacity.APIKey{KeyID: "key-x", OrgID: "org-1"}
	svc := keyService(store)
	ctx := context.Background()
	for _, p := range []capacity.Principal{
		{KeyID: "key-1", OrgID: "org-1", Permissions: []string{capacity.PermCapacity, capacity.PermRead, capacity.PermPlace}},
		{KeyID: "key-x", OrgID: "org-1"},
	} {
		_, err := svc.CreateKey(ctx, p, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}}, capacity.RequestMeta{})
		wantCode(t, err, capacity.CodeNotFound)
		_, err = svc.RevokeKey(ctx, p, capacity.KeyRevocation{KeyID: "key-x"}, capacity.RequestMeta{})
		wantCode(t, err, capacity.CodeNotFound)
		_, err = svc.ListKeys(ctx, p, capacity.PageRequest{})
		wantCode(t, err, capacity.CodeNotFound)
		_, err = svc.GetKey(ctx, p, "key-x")
		wantCode(t, err, capacity.CodeNotFound)
	}
	if store.reads != 0 {
		t.Errorf("refused calls read the store %d times", store.reads)
	}
	if len(store.audits) != 0 || store.keys["key-x"].Revoked || len(store.keys) != 1 {
		t.Errorf("refused calls changed the store: %+v", store)
	}
}

func TestCreateKeyValidation(t *testing.T) {
	soon, far, past := keyT0.Add(time.Hour), keyT0.AddDate(2, 0, 1), keyT0.Add(-time.Second)
	twoYears := keyT0.AddDate(2, 0, 0)
	read := []string{capacity.PermRead}
	tests := []struct {
		name string
		req  capacity.KeyRequest
		want string // "" valid, else part of the message
	}{
		{"valid", capacity.KeyRequest{OrgID: "org-1", Permissions: read, ExpiresAt: &soon, Description: "ci"}, ""},
		{"operator with an operator permission", capacity.KeyRequest{OrgID: "platform", Operator: true, Permissions: []string{capacity.PermAuditRead}}, ""},
		{"expiry exactly two years ahead", capacity.KeyRequest{OrgID: "org-1", Permissions: read, ExpiresAt: &twoYears}, ""},
		{"every tenant permission", capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermPlace, capacity.PermCapacity, capacity.PermRead}}, ""},
		{"every permission, operator", capacity.KeyRequest{OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions}, ""},
		{"description of 200 characters", capacity.KeyRequest{OrgID: "org-1", Permissions: read, Description: strings.Repeat("é", 200)}, ""},
		{"no org", capacity.KeyRequest{Permissions: read}, "orgId"},
		{"bad org", capacity.KeyRequest{OrgID: "org#1", Permissions: read}, "orgId"},
		{"unknown permission", capacity.KeyRequest{OrgID: "org-1", Permissions: []string{"admin"}}, `"admin"`},
		{"duplicate permission", capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead, capacity.PermRead}}, "twice"},
		{"no permission, not operator", capacity.KeyRequest{OrgID: "org-1"}, "at least one"},
		{"operator without permissions (the flag alone grants nothing)", capacity.KeyRequest{OrgID: "platform", Operator: true}, "at least one"},
		{"operator permission on a tenant key", capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead, capacity.PermKeyManage}}, "operator keys only"},
		{"expiry in the past", capacity.KeyRequest{OrgID: "org-1", Permissions: read, ExpiresAt: &past}, "future"},
		{"expiry now", capacity.KeyRequest{OrgID: "org-1", Permissions: read, ExpiresAt: &keyT0}, "future"},
		{"expiry too far", capacity.KeyRequest{OrgID: "org-1", Permissions: read, ExpiresAt: &far}, "2 years"},
		{"description too long", capacity.KeyRequest{OrgID: "org-1", Permissions: read, Description: strings.Repeat("a", 201)}, "200"},
		{"description with a newline", capacity.KeyRequest{OrgID: "org-1", Permissions: read, Description: "a\nb"}, "control"},
		{"description not UTF-8", capacity.KeyRequest{OrgID: "org-1", Permissions: read, Description: "\xff"}, "UTF-8"},
		{"Idempotency-Key too long", capacity.KeyRequest{OrgID: "org-1", Permissions: read, IdempotencyKey: strings.Repeat("k", 5001)}, "Idempotency-Key"},
		{"Idempotency-Key with a control character", capacity.KeyRequest{OrgID: "org-1", Permissions: read, IdempotencyKey: "k\x01"}, "Idempotency-Key"},
		{"Idempotency-Key with a space", capacity.KeyRequest{OrgID: "org-1", Permissions: read, IdempotencyKey: "a b"}, "Idempotency-Key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newMemKeys()
			res, err := keyService(store).CreateKey(context.Background(), operator, tt.req, capacity.RequestMeta{})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("err = %v, want a key", err)
				}
				if len(store.keys) != 1 || res.Secret == "" {
					t.Fatalf("result %+v, store %d keys", res, len(store.keys))
				}
				return
			}
			wantCode(t, err, capacity.CodeInvalidRequest)
			if !strings.Contains(capacity.ErrorMessage(err), tt.want) {
				t.Errorf("message %q does not mention %q", capacity.ErrorMessage(err), tt.want)
			}
			if len(store.keys)+len(store.audits) != 0 {
				t.Errorf("a refused request wrote %d keys, %d audit records", len(store.keys), len(store.audits))
			}
		})
	}
}

func TestCreateKey(t *testing.T) {
	store := newMemKeys()
	svc := keyService(store)
	exp := keyT0.Add(24 * time.Hour)
	req := capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead, capacity.PermCapacity},
		ExpiresAt: &exp, Description: "ci deploys", IdempotencyKey: "k1"}
	meta := capacity.RequestMeta{RequestID: "req-1"}
	res, err := svc.CreateKey(context.Background(), operator, req, meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := capacity.CheckKeySecret(res.Secret); err != nil {
		t.Errorf("secret %q: %v", res.Secret, err)
	}
	want := capacity.APIKey{KeyID: res.Key.KeyID, Hash: capacity.HashKeySecret(res.Secret), OrgID: "org-1",
		Permissions: []string{capacity.PermCapacity, capacity.PermRead}, ExpiresAt: &exp, Description: "ci deploys",
		CreatedAt: keyT0, CreatedByKeyID: "key-op"}
	if !strings.HasPrefix(res.Key.KeyID, "key-") || !reflect.DeepEqual(res.Key, want) || !reflect.DeepEqual(store.keys[res.Key.KeyID], want) {
		t.Errorf("key = %+v\nstored %+v\nwant %+v", res.Key, store.keys[res.Key.KeyID], want)
	}
	if res.SecretShown || res.Replayed {
		t.Errorf("first answer: %+v", res)
	}
	if len(store.audits) != 1 {
		t.Fatalf("audit records: %+v", store.audits)
	}
	a := store.audits[0]
	if a.Action != capacity.ActionKeyCreate || a.NodeID != "" || a.ActorKeyID != "key-op" || a.ActingFor != "org-1" ||
		a.RequestID != "req-1" || a.Outcome != "ok" || a.Via != capacity.ViaHTTP || a.TargetKeyID != res.Key.KeyID || a.Reason != "" {
		t.Errorf("audit record %+v", a)
	}
	// Neither the secret nor its hash is in the idempotency record.
	for _, r := range store.idem {
		if strings.Contains(string(r.Result), res.Secret) || strings.Contains(string(r.Result), want.Hash) {
			t.Errorf("idempotency record holds the secret or its hash: %s", r.Result)
		}
	}

	// A replay answers the key without the secret.
	again, err := svc.CreateKey(context.Background(), operator, req, meta)
	if err != nil {
		t.Fatal(err)
	}
	if again.Secret != "" || !again.SecretShown || !again.Replayed || again.Key.KeyID != res.Key.KeyID || again.Key.Hash != "" {
		t.Errorf("replay = %+v", again)
	}
	if b, _ := json.Marshal(again); strings.Contains(string(b), "ocap_") {
		t.Errorf("replay's JSON holds a secret: %s", b)
	}
	// The same key for another request is refused.
	other := req
	other.Description = "other"
	_, err = svc.CreateKey(context.Background(), operator, other, meta)
	wantCode(t, err, capacity.CodeIdempotencyKeyReused)
	// The replay is on record (nothing created); the refusal is not.
	if len(store.keys) != 1 || len(store.audits) != 2 || store.audits[1].Outcome != capacity.OutcomeReplayed ||
		store.audits[1].TargetKeyID != res.Key.KeyID || store.audits[1].ActorKeyID != "key-op" {
		t.Errorf("store holds %d keys, audit records %+v; want 1 key, its creation and the replay", len(store.keys), store.audits)
	}
}

func TestCreateKeyStoreFaults(t *testing.T) {
	req := capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}, IdempotencyKey: "k1"}
	// Throttled every round, nothing is written and the answer is throttled
	// (TestEveryWriteGoesThroughOneLoop).
	t.Run("throttled once: created on the next round", func(t *testing.T) {
		store := newMemKeys()
		store.createErr = fmt.Errorf("create: %w", capacity.ErrThrottled)
		res, err := keyService(store).CreateKey(context.Background(), operator, req, capacity.RequestMeta{})
		if err != nil || len(store.keys) != 1 || store.keys[res.Key.KeyID].Hash != capacity.HashKeySecret(res.Secret) {
			t.Fatalf("res %+v, err %v, keys %+v", res, err, store.keys)
		}
	})
	t.Run("timeout after the write landed: the secret is answered once", func(t *testing.T) {
		store := newMemKeys()
		store.createErr, store.landed = fmt.Errorf("create: %w", capacity.ErrAmbiguous), true
		svc := keyService(store)
		res, err := svc.CreateKey(context.Background(), operator, req, capacity.RequestMeta{})
		if err != nil {
			t.Fatal(err)
		}
		if capacity.CheckKeySecret(res.Secret) != nil || store.keys[res.Key.KeyID].Hash != capacity.HashKeySecret(res.Secret) {
			t.Errorf("answer %+v does not carry the stored key's secret", res)
		}
		again, err := svc.CreateKey(context.Background(), operator, req, capacity.RequestMeta{})
		if err != nil || again.Key.KeyID != res.Key.KeyID || again.Secret != "" {
			t.Errorf("retry = %+v, %v", again, err)
		}
		if len(store.keys) != 1 {
			t.Errorf("%d keys, want 1", len(store.keys))
		}
	})
	// The write lands but answers ambiguously, and the read that checks does not see it yet:
	// the next round puts the same key again, which is refused as existing, and the call
	// answers that key with its secret; no second key is made.
	for _, idemKey := range []string{"", "k1"} {
		t.Run("timeout, landed but not seen yet, idempotency key "+strconv.Quote(idemKey), func(t *testing.T) {
			store := newMemKeys()
			store.createErr, store.landed, store.hidden = fmt.Errorf("create: %w", capacity.ErrAmbiguous), true, 1
			req := req
			req.IdempotencyKey = idemKey
			res, err := keyService(store).CreateKey(context.Background(), operator, req, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Replayed || res.SecretShown || capacity.CheckKeySecret(res.Secret) != nil {
				t.Fatalf("answer %+v: want the key with its secret", res)
			}
			if len(store.keys) != 1 || len(store.audits) != 1 {
				t.Fatalf("%d keys, %d audit records; want 1, 1", len(store.keys), len(store.audits))
			}
			if store.keys[res.Key.KeyID].Hash != capacity.HashKeySecret(res.Secret) {
				t.Errorf("answered secret is not the stored key's")
			}
		})
	}
	t.Run("timeout, not landed: created on the next round", func(t *testing.T) {
		store := newMemKeys()
		store.createErr = fmt.Errorf("create: %w", capacity.ErrAmbiguous)
		res, err := keyService(store).CreateKey(context.Background(), operator, req, capacity.RequestMeta{})
		if err != nil || len(store.keys) != 1 || store.keys[res.Key.KeyID].Hash != capacity.HashKeySecret(res.Secret) {
			t.Fatalf("res %+v, err %v, keys %+v", res, err, store.keys)
		}
	})
	t.Run("a concurrent create under the same Idempotency-Key won: replayed", func(t *testing.T) {
		// The winner's records, as its own create stored them.
		winner := newMemKeys()
		won, err := keyService(winner).CreateKey(context.Background(), operator, req, capacity.RequestMeta{})
		if err != nil {
			t.Fatal(err)
		}
		store := newMemKeys()
		store.beforeCreate = func(m *memKeys) { // lands between our read of the record and our write
			m.idem = winner.idem
			m.keys = winner.keys
		}
		res, err := keyService(store).CreateKey(context.Background(), operator, req, capacity.RequestMeta{})
		if err != nil || !res.Replayed || res.Secret != "" || res.Key.KeyID != won.Key.KeyID {
			t.Errorf("res %+v, err %v; want the winner's key, replayed", res, err)
		}
		if len(store.keys) != 1 {
			t.Errorf("%d keys, want 1", len(store.keys))
		}
	})
}

func TestRevokeKey(t *testing.T) {
	ctx := context.Background()
	setup := func() (*memKeys, *capacity.Service) {
		store := newMemKeys()
		store.keys["key-a"] = capacity.APIKey{KeyID: "key-a", OrgID: "org-1", Permissions: []string{capacity.PermRead}}
		store.keys["key-op"] = capacity.APIKey{KeyID: "key-op", OrgID: "platform", Operator: true}
		return store, keyService(store)
	}
	t.Run("revoke, then again", func(t *testing.T) {
		store, svc := setup()
		k, err := svc.RevokeKey(ctx, operator, capacity.KeyRevocation{KeyID: "key-a", Reason: "leaked in a log"}, capacity.RequestMeta{RequestID: "r1"})
		if err != nil || !k.Revoked || k.RevokedAt == nil || !k.RevokedAt.Equal(keyT0) {
			t.Fatalf("revoke = %+v, %v", k, err)
		}
		if !store.keys["key-a"].Revoked || len(store.audits) != 1 || store.audits[0].Action != capacity.ActionKeyRevoke ||
			store.audits[0].ActingFor != "org-1" || store.audits[0].TargetKeyID != "key-a" || store.audits[0].Reason != "leaked in a log" {
			t.Errorf("store %+v, audits %+v", store.keys["key-a"], store.audits)
		}
		again, err := svc.RevokeKey(ctx, operator, capacity.KeyRevocation{KeyID: "key-a"}, capacity.RequestMeta{})
		if err != nil || !again.Revoked {
			t.Errorf("second revoke = %+v, %v", again, err)
		}
		if len(store.audits) != 1 {
			t.Errorf("a repeated revoke wrote %d audit records, want none", len(store.audits)-1)
		}
	})
	t.Run("the calling key itself", func(t *testing.T) {
		_, svc := setup()
		if k, err := svc.RevokeKey(ctx, operator, capacity.KeyRevocation{KeyID: "key-op"}, capacity.RequestMeta{}); err != nil || !k.Revoked {
			t.Errorf("revoke own key = %+v, %v", k, err)
		}
	})
	t.Run("unknown or malformed id", func(t *testing.T) {
		store, svc := setup()
		for _, id := range []string{"key-none", "", "key#a", strings.Repeat("k", 200)} {
			_, err := svc.RevokeKey(ctx, operator, capacity.KeyRevocation{KeyID: id}, capacity.RequestMeta{})
			wantCode(t, err, capacity.CodeNotFound)
		}
		if len(store.audits) != 0 {
			t.Errorf("audits %+v", store.audits)
		}
	})
	t.Run("a reason that is not UTF-8 or too long", func(t *testing.T) {
		store, svc := setup()
		for _, reason := range []string{"\xff", strings.Repeat("r", capacity.MaxReasonLen+1)} {
			_, err := svc.RevokeKey(ctx, operator, capacity.KeyRevocation{KeyID: "key-a", Reason: reason}, capacity.RequestMeta{})
			wantCode(t, err, capacity.CodeInvalidRequest)
		}
		if len(store.audits) != 0 || store.keys["key-a"].Revoked {
			t.Errorf("a refused revoke wrote: %+v, %+v", store.keys["key-a"], store.audits)
		}
	})
	t.Run("revoked by another call between read and write", func(t *testing.T) {
		store, svc := setup()
		store.beforeRevoke = func(m *memKeys) {
			at := keyT0.Add(-time.Second)
			k := m.keys["key-a"]
			k.Revoked, k.RevokedAt = true, &at
			m.keys["key-a"] = k
		}
		k, err := svc.RevokeKey(ctx, operator, capacity.KeyRevocation{KeyID: "key-a"}, capacity.RequestMeta{})
		if err != nil || !k.Revoked || !k.RevokedAt.Equal(keyT0.Add(-time.Second)) {
			t.Errorf("revoke = %+v, %v; want the other call's revocation", k, err)
		}
		if len(store.audits) != 0 {
			t.Errorf("the losing revoke wrote audit records: %+v", store.audits)
		}
	})
}

func TestGetKey(t *testing.T) {
	ctx := context.Background()
	store := newMemKeys()
	at := keyT0.Add(-time.Hour)
	stored := capacity.APIKey{KeyID: "key-a", Hash: "abc123", OrgID: "org-1", Permissions: []string{capacity.PermRead},
		Description: "ci", CreatedAt: at, CreatedByKeyID: "key-op", LastUsedAt: &at}
	store.keys["key-a"] = stored
	svc := keyService(store)
	k, err := svc.GetKey(ctx, operator, "key-a")
	if err != nil {
		t.Fatal(err)
	}
	want := stored
	want.Hash = ""
	if !reflect.DeepEqual(*k, want) {
		t.Errorf("key = %+v, want %+v (without its hash)", *k, want)
	}
	for _, id := range []string{"key-none", "", "key#a", strings.Repeat("k", 200)} {
		_, err := svc.GetKey(ctx, operator, id)
		wantCode(t, err, capacity.CodeNotFound)
		if capacity.ErrorMessage(err) != "API key not found" {
			t.Errorf("GetKey(%q): message %q", id, capacity.ErrorMessage(err))
		}
	}
	failing := &capacity.Service{Keys: errKeys{store}}
	if _, err := failing.GetKey(ctx, operator, "key-a"); err == nil || capacity.ErrorCode(err) == capacity.CodeNotFound || !strings.Contains(err.Error(), "key-a") {
		t.Errorf("a failed read = %v, want an error naming the key", err)
	}
}

// errKeys fails every read.
type errKeys struct{ *memKeys }

func (errKeys) GetKey(context.Context, string) (*capacity.APIKey, error) {
	return nil, errors.New("throttled")
}

func TestSelfKey(t *testing.T) {
	ctx := context.Background()
	exp := keyT0.Add(time.Hour)
	limit := &capacity.RateLimit{PerSecond: 2, Burst: 4}
	store := newMemKeys()
	svc := keyService(store)
	for _, tc := range []struct {
		name string
		p    capacity.Principal
		want *capacity.CallerKey
		code capacity.Code
	}{
		{"operator", capacity.Principal{KeyID: "key-op", OrgID: "org-p", Operator: true, Permissions: []string{capacity.PermNodeManage}},
			&capacity.CallerKey{KeyID: "key-op", OrgID: "org-p", Operator: true, Permissions: []string{capacity.PermNodeManage}}, ""},
		{"tenant with expiry and limit", capacity.Principal{KeyID: "key-t", OrgID: "org-t", Permissions: []string{capacity.PermRead}, ExpiresAt: &exp, RateLimit: limit},
			&capacity.CallerKey{KeyID: "key-t", OrgID: "org-t", Permissions: []string{capacity.PermRead}, ExpiresAt: &exp, RateLimit: limit}, ""},
		{"no permissions", capacity.Principal{KeyID: "key-n", OrgID: "org-n"}, &capacity.CallerKey{KeyID: "key-n", OrgID: "org-n"}, ""},
		{"zero principal", capacity.Principal{}, nil, capacity.CodeUnauthenticated},
		{"bootstrap", capacity.Bootstrap("org-p"), nil, capacity.CodeUnauthenticated},
		{"event source", capacity.EventPrincipal{Source: "fleet", OrgID: "org-p", Permissions: []string{capacity.PermCapacity}}.Principal(), nil, capacity.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := svc.SelfKey(ctx, tc.p)
			if tc.code != "" {
				wantCode(t, err, tc.code)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("SelfKey = %+v, want %+v", got, tc.want)
			}
			if len(tc.p.Permissions) > 0 {
				got.Permissions[0] = "changed" // the answer is a copy, not the principal's list
				if tc.p.Permissions[0] == "changed" {
					t.Error("SelfKey shares the principal's permission list")
				}
			}
		})
	}
	if store.reads != 0 {
		t.Errorf("SelfKey read the key store %d times; the principal is already authenticated", store.reads)
	}
}
