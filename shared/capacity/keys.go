package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Audit actions of key management. Their records have no node: they form the keys chain.
const (
	ActionKeyCreate = "key.create"
	ActionKeyRevoke = "key.revoke"
)

// MaxKeyDescription bounds a key's description (characters); expiresAt is at most two
// years ahead.
const MaxKeyDescription = 200

// KeyStore keeps API keys for key management (the api function's lookups go through
// auth.KeyStore). Implementations: shared/dynamo.Store.
type KeyStore interface {
	// KeyIdempotency returns the record of a key creation made under the Idempotency-Key
	// scope, or nil.
	KeyIdempotency(ctx context.Context, scope string) (*IdempotencyRecord, error)
	// CreateKey puts the new key, its idempotency record (nil: none) and its audit record in
	// one transaction. ErrConflict: the key's id or hash, or the idempotency record, exists.
	// ErrAmbiguous: the outcome is unknown (GetKey tells).
	CreateKey(ctx context.Context, key APIKey, idem *IdempotencyRecord, audit AuditRecord) error
	// GetKey returns the key with the id (strongly consistent), or an *Error CodeNotFound.
	GetKey(ctx context.Context, keyID string) (*APIKey, error)
	// ListKeys returns up to limit keys in the store's order, starting after the key
	// afterKeyID ("" from the first), and whether more may follow (a page may be short). An
	// afterKeyID that names no key is an *Error CodeInvalidRequest "invalid cursor".
	ListKeys(ctx context.Context, limit int, afterKeyID string) ([]APIKey, bool, error)
	// RevokeKey marks the key (as read, not revoked) revoked at `at` and appends the audit
	// record, in one transaction. ErrConflict: the key changed (was revoked) since read.
	RevokeKey(ctx context.Context, key APIKey, at time.Time, audit AuditRecord) error
}

// KeyRequest asks for a new API key.
type KeyRequest struct {
	OrgID          string
	Permissions    []string
	Operator       bool
	ExpiresAt      *time.Time
	Description    string
	IdempotencyKey string
	// RateLimit is the key's own rate limit (nil: the environment's), at most the
	// environment's and, from a calling key with a limit of its own, at most that.
	RateLimit *RateLimit
}

// KeyResult is a created key. Secret is set only in the answer that created it; a replay of
// the same Idempotency-Key answers without it and with SecretShown.
type KeyResult struct {
	Key         APIKey
	Secret      string `json:"-"`
	SecretShown bool
	Replayed    bool `json:"-"`
}

// KeyPage is a page of keys.
type KeyPage struct {
	Keys       []APIKey
	NextCursor string
}

// keysNotFound is the answer of key management to a caller who is not an operator holding
// key.manage: the routes do not exist for it.
func keysNotFound() *Error { return Errorf(CodeNotFound, "not found") }

// AdmitKeyManagement is the first gate of every key-management call, before anything is read
// (the HTTP layer calls it before the body or query): anyone but an operator holding
// key.manage gets the routes' 404.
func AdmitKeyManagement(p Principal) error {
	if !p.CanOperate(PermKeyManage) {
		return keysNotFound()
	}
	return nil
}

// CheckGrant refuses (403 forbidden) a key that would grant more than the principal holds:
// a permission it lacks, the operator flag it lacks, an operator key for another org, or an
// expiry later than its own (a key that never expires, from a key that does). Nobody mints
// a key more powerful or longer-lived than the one it calls with.
func CheckGrant(p Principal, k APIKey) error {
	if err := checkHolds(p, k); err != nil {
		return err
	}
	switch {
	case k.Operator && k.OrgID != p.OrgID:
		return Errorf(CodeForbidden, "operator: an operator key is for the operator's own org (%s), not %s", p.OrgID, k.OrgID)
	case p.ExpiresAt != nil && k.ExpiresAt == nil:
		return Errorf(CodeForbidden, "expiresAt: the calling key expires at %s, so the key must expire by then", p.ExpiresAt.UTC().Format(time.RFC3339))
	case p.ExpiresAt != nil && k.ExpiresAt.After(*p.ExpiresAt):
		return Errorf(CodeForbidden, "expiresAt: the calling key expires at %s; the key may not outlive it", p.ExpiresAt.UTC().Format(time.RFC3339))
	case p.RateLimit != nil && k.RateLimit == nil:
		return Errorf(CodeForbidden, "rateLimit: the calling key is limited to %s, so the key needs a rateLimit within it", describeRate(*p.RateLimit))
	case p.RateLimit != nil && !k.RateLimit.Within(*p.RateLimit):
		return Errorf(CodeForbidden, "rateLimit: the calling key is limited to %s; the key may not call faster", describeRate(*p.RateLimit))
	}
	return nil
}

func describeRate(l RateLimit) string {
	return fmt.Sprintf("%g calls a second, burst %d", l.PerSecond, l.Burst)
}

// checkHolds refuses (403) a key with a permission or the operator flag the principal lacks.
func checkHolds(p Principal, k APIKey) error {
	var missing []string
	for _, perm := range k.Permissions {
		if !p.Can(perm) {
			missing = append(missing, perm)
		}
	}
	switch {
	case len(missing) > 0:
		return Errorf(CodeForbidden, "permissions: the calling key does not hold %s", strings.Join(missing, ", "))
	case k.Operator && !p.Operator:
		return Errorf(CodeForbidden, "operator: the calling key is not an operator key")
	}
	return nil
}

func keyNotFound() *Error { return Errorf(CodeNotFound, "API key not found") }

func (s *Service) keyStore() (KeyStore, error) {
	if s.Keys == nil {
		return nil, errors.New("key management is not configured (Service.Keys)")
	}
	return s.Keys, nil
}

// appendKeyAudit appends a key-management record outside a transaction (a replayed
// creation) to the keys chain: through the key store when it appends records itself (the
// DynamoDB store does both), else through Store. A failure is logged, as for s.append.
func (s *Service) appendKeyAudit(ctx context.Context, rec AuditRecord) {
	a, ok := s.Keys.(interface {
		AppendAudit(ctx context.Context, rec AuditRecord) error
	})
	if !ok {
		s.append(ctx, rec)
		return
	}
	if err := a.AppendAudit(ctx, rec); err != nil {
		s.logger().ErrorContext(ctx, "audit append failed", "err", err, "audit_id", rec.ID, "action", rec.Action)
	}
}

// WithoutOperatorPermission reports whether k is a live operator key that holds no operator
// permission: one issued before they existed, which now reaches no operator route.
func WithoutOperatorPermission(k APIKey, now time.Time) bool {
	live := !k.Revoked && (k.ExpiresAt == nil || now.Before(*k.ExpiresAt))
	return live && k.Operator && !slices.ContainsFunc(k.Permissions, func(p string) bool { return slices.Contains(OperatorPermissions, p) })
}

// validate checks a key request as of now and returns it normalised (permissions sorted).
func (r KeyRequest) validate(now time.Time) (KeyRequest, error) {
	if !ValidID(r.OrgID) {
		return r, Errorf(CodeInvalidRequest, "orgId must be 1 to %d characters of letters, digits, '.', '_' or '-'", MaxIDLen)
	}
	perms := slices.Sorted(slices.Values(r.Permissions))
	for i, p := range perms {
		if !slices.Contains(AllPermissions, p) {
			return r, Errorf(CodeInvalidRequest, "permissions: %q is not one of %s", p, strings.Join(AllPermissions, ", "))
		}
		if i > 0 && perms[i-1] == p {
			return r, Errorf(CodeInvalidRequest, "permissions: %q is listed twice", p)
		}
		if !r.Operator && slices.Contains(OperatorPermissions, p) {
			return r, Errorf(CodeInvalidRequest, "permissions: %q is for operator keys only (operator: true)", p)
		}
	}
	// The operator flag alone grants nothing: it only widens what the permissions reach.
	if len(perms) == 0 {
		return r, Errorf(CodeInvalidRequest, "permissions: a key needs at least one permission")
	}
	r.Permissions = perms
	if r.ExpiresAt != nil {
		// Whole seconds, as the API shows it: the key's audit records carry the same instant.
		at := r.ExpiresAt.UTC().Truncate(time.Second)
		if !at.After(now) {
			return r, Errorf(CodeInvalidRequest, "expiresAt must be in the future")
		}
		if at.After(now.AddDate(2, 0, 0)) {
			return r, Errorf(CodeInvalidRequest, "expiresAt must be at most 2 years ahead")
		}
		r.ExpiresAt = &at
	}
	if l := r.RateLimit; l != nil {
		if err := l.Validate(); err != nil {
			return r, Errorf(CodeInvalidRequest, "rateLimit: %v", err)
		}
	}
	if !utf8.ValidString(r.Description) || utf8.RuneCountInString(r.Description) > MaxKeyDescription {
		return r, Errorf(CodeInvalidRequest, "description must be at most %d characters of UTF-8", MaxKeyDescription)
	}
	if err := validateText("description", r.Description); err != nil {
		return r, err
	}
	// The key is part of the idempotency record's partition key, which the store bounds.
	if err := ValidateIdempotencyKey(r.IdempotencyKey); err != nil {
		return r, err
	}
	return r, nil
}

// ListKeys lists API keys in the store's order, to operators holding key.manage only (anyone
// else: 404).
func (s *Service) ListKeys(ctx context.Context, p Principal, page PageRequest) (*KeyPage, error) {
	if err := AdmitKeyManagement(p); err != nil {
		return nil, err
	}
	store, err := s.keyStore()
	if err != nil {
		return nil, err
	}
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	var after string
	if parts, err := parseCursor(page.Cursor, "keys", 1); err != nil {
		return nil, err
	} else if parts != nil {
		after = parts[0]
	}
	keys, more, err := store.ListKeys(ctx, limit, after)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	out := &KeyPage{Keys: keys}
	if out.Keys == nil {
		out.Keys = []APIKey{}
	}
	if more && len(keys) > 0 {
		// The next page starts after the last key shown: the cursor names its id, never the
		// hash it is stored under.
		out.NextCursor = listCursor("keys", keys[len(keys)-1].KeyID)
	}
	return out, nil
}

// GetKey returns one API key (never its hash), to operators holding key.manage only (anyone
// else, or an id that names nothing: 404).
func (s *Service) GetKey(ctx context.Context, p Principal, keyID string) (*APIKey, error) {
	if err := AdmitKeyManagement(p); err != nil {
		return nil, err
	}
	if !ValidID(keyID) {
		return nil, keyNotFound()
	}
	store, err := s.keyStore()
	if err != nil {
		return nil, err
	}
	k, err := store.GetKey(ctx, keyID)
	if ErrorCode(err) == CodeNotFound {
		return nil, keyNotFound()
	}
	if err != nil {
		return nil, fmt.Errorf("read key %s: %w", keyID, err)
	}
	k.Hash = "" // the stored form of the secret is nobody's business outside the store
	return k, nil
}

// CallerKey is what a key may learn of itself (GET /v1/keys/self): its id, org, grants,
// expiry and own rate limit. Its own type, not an APIKey with fields blanked, so that neither
// the secret's hash nor anything recorded about the key (its description, creator, last use)
// can reach a caller through it.
type CallerKey struct {
	KeyID       string
	OrgID       string
	Permissions []string
	Operator    bool
	ExpiresAt   *time.Time
	RateLimit   *RateLimit
}

// SelfKey answers the authenticated caller's own key from its principal. Nothing is read:
// authentication has just read the key and refused it if revoked or expired, so any key may
// ask, with no permission, and learns nothing of other keys. A principal that no key
// authenticated (the zero one, a bootstrap or event principal) gets unauthenticated.
func (s *Service) SelfKey(_ context.Context, p Principal) (*CallerKey, error) {
	if p.KeyID == "" || p.KeyID == BootstrapKeyID || strings.HasPrefix(p.KeyID, "event:") || p.OrgID == "" {
		return nil, Errorf(CodeUnauthenticated, "no API key authenticated this call")
	}
	return &CallerKey{
		KeyID: p.KeyID, OrgID: p.OrgID, Permissions: slices.Clone(p.Permissions), Operator: p.Operator,
		ExpiresAt: p.ExpiresAt, RateLimit: p.RateLimit,
	}, nil
}
