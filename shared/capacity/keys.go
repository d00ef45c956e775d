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

// CreateKey creates an API key for an org: operators holding key.manage only (anyone else:
// 404), and never with more than the caller holds (CheckGrant: 403). The secret is
// in the answer and nowhere else: the store keeps its hash, and the Idempotency-Key record
// keeps the answer without it.
func (s *Service) CreateKey(ctx context.Context, p Principal, req KeyRequest, meta RequestMeta) (*KeyResult, error) {
	if err := AdmitKeyManagement(p); err != nil {
		return nil, err
	}
	store, err := s.keyStore()
	if err != nil {
		return nil, err
	}
	now := s.now()
	req, err = req.validate(now)
	if err != nil {
		return nil, err
	}
	// Before anything is read or written, so a refused grant changes nothing, not even an
	// idempotency record.
	// A key's own limit only narrows the environment's (which is sized for what one key may
	// take of the service): one above it would be no limit at all, so it is refused.
	if l, env := req.RateLimit, s.RateLimit; l != nil && env != nil && !l.Within(*env) {
		return nil, Errorf(CodeInvalidRequest, "rateLimit: at most this environment's per-key limit, %s", describeRate(*env))
	}
	if err := CheckGrant(p, APIKey{OrgID: req.OrgID, Permissions: req.Permissions, Operator: req.Operator, ExpiresAt: req.ExpiresAt, RateLimit: req.RateLimit}); err != nil {
		return nil, err
	}
	key, err := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionKeyCreate, req))
	if err != nil {
		return nil, err
	}
	// pending is set once a round's write was ambiguous: that write may still land (on AWS a
	// read may not yet see a transaction in flight), so every later round puts the SAME key,
	// idempotency record and audit record again. The conditional puts let at most one of them
	// land, and its secret is the one answered. A new key (new secret) is made only after a
	// definite refusal with nothing in flight.
	var pending *KeyResult
	var pendingAudit AuditRecord
	var last error
	for range s.attempts() {
		if key.scope != "" {
			rec, err := store.KeyIdempotency(ctx, key.scope)
			if err != nil {
				return nil, fmt.Errorf("read idempotency record: %w", err)
			}
			var res KeyResult
			if replayed, err := replay(rec, key.fingerprint, now, &res); replayed || err != nil {
				if err != nil {
					return nil, err
				}
				if pending != nil && res.Key.KeyID == pending.Key.KeyID {
					return pending, nil // our own earlier write landed: its secret is ours to show
				}
				res.SecretShown, res.Replayed = true, true
				s.appendKeyAudit(ctx, *replayAudit(s.keyAudit(p, meta, ActionKeyCreate, res.Key, "", now)))
				return &res, nil
			}
		}
		res, audit := pending, pendingAudit
		if res == nil {
			if res, err = s.newKey(p, req, meta, key, now); err != nil {
				return nil, err
			}
			audit = s.keyAudit(p, meta, ActionKeyCreate, res.Key, "", now)
		}
		stored := *res
		stored.Key.Hash = "" // the answer as replayed: neither secret nor hash
		stored.SecretShown = true
		idem, err := s.idempotencyRecord(key, "", stored, now)
		if err != nil {
			return nil, err
		}
		err = store.CreateKey(ctx, res.Key, idem, audit)
		// A timeout after the write may have landed, and a conflict on a key put before may
		// be that very write: the key's id tells.
		if errors.Is(err, ErrAmbiguous) || (pending != nil && errors.Is(err, ErrConflict)) {
			landed, lerr := s.keyLanded(ctx, store, res.Key.KeyID)
			if lerr != nil {
				return nil, fmt.Errorf("create key %s: %w (and checking it: %v)", res.Key.KeyID, err, lerr)
			}
			if landed {
				err = nil
			}
		}
		if errors.Is(err, ErrAmbiguous) {
			pending, pendingAudit = res, audit
		}
		last = err
		switch {
		case err == nil:
			return res, nil
		case errors.Is(err, ErrThrottled):
			if pending != nil {
				s.logger().WarnContext(ctx, "key creation throttled after an ambiguous write; the key may still appear (revoke it)", "key_id", pending.Key.KeyID)
			}
			return nil, errThrottled()
		case errors.Is(err, ErrConflict), errors.Is(err, ErrAmbiguous):
			// Another request under the same key won (the next round replays it), a write
			// that did not land, or one whose outcome is unknown: go again.
			s.logger().InfoContext(ctx, "key creation did not land; trying again", "key_id", res.Key.KeyID, "err", err)
			continue
		default:
			return nil, fmt.Errorf("create key: %w", err)
		}
	}
	if pending != nil {
		s.logger().WarnContext(ctx, "key creation outcome unknown; the key may still appear (revoke it)", "key_id", pending.Key.KeyID, "err", last)
		return nil, fmt.Errorf("create key %s: outcome still unknown after %d rounds: %w", pending.Key.KeyID, s.attempts(), last)
	}
	s.logger().WarnContext(ctx, "key creation kept losing races", "err", last)
	return nil, Errorf(CodeConcurrentModification, "key management kept changing while the key was created; retrying is safe")
}

func (s *Service) newKey(p Principal, req KeyRequest, meta RequestMeta, key idempotency, now time.Time) (*KeyResult, error) {
	secret, err := NewKeySecret()
	if err != nil {
		return nil, err
	}
	k := APIKey{
		KeyID: "key-" + s.newID(), Hash: HashKeySecret(secret), OrgID: req.OrgID, Permissions: req.Permissions,
		Operator: req.Operator, ExpiresAt: req.ExpiresAt, Description: req.Description,
		CreatedAt: now, CreatedByKeyID: p.KeyID, RateLimit: req.RateLimit,
	}
	return &KeyResult{Key: k, Secret: secret}, nil
}

// keyLanded reads whether a key exists, retrying a failed read a few times: the answer of a
// create hangs on it.
func (s *Service) keyLanded(ctx context.Context, store KeyStore, keyID string) (bool, error) {
	var err error
	for try := range 4 {
		if try > 0 {
			if serr := sleep(ctx, time.Duration(50<<try)*time.Millisecond); serr != nil {
				return false, serr
			}
		}
		_, err = store.GetKey(ctx, keyID)
		if err == nil {
			return true, nil
		}
		if ErrorCode(err) == CodeNotFound {
			return false, nil
		}
	}
	return false, err
}

// keyAudit is the record of a key change: no node (the keys chain), the key's org as the
// one acted for, the key in TargetKeyID, what it grants, and the caller's reason, if any.
// The grants are in the record (and so in its hash) so that a key item whose grants are
// changed in place no longer matches its records (VerifyKeyGrants).
func (s *Service) keyAudit(p Principal, meta RequestMeta, action string, k APIKey, reason string, now time.Time) AuditRecord {
	g := GrantsOf(k)
	return AuditRecord{
		ID: s.newID(), Time: now, RequestID: meta.RequestID, ActorKeyID: p.KeyID, CallerOrgID: p.OrgID,
		ActingFor: k.OrgID, Action: action, TargetKeyID: k.KeyID, Reason: reason, Outcome: "ok",
		Via: meta.via(), EventID: meta.EventID, Grants: &g,
	}
}

// KeyGrants is what an API key may do: the org it acts as, its permissions, the operator
// flag and its expiry. Every field of APIKey that widens or narrows what a key may do belongs
// here (GrantsOf), so that the key's audit records cover all of it.
type KeyGrants struct {
	OrgID       string
	Permissions []string
	Operator    bool
	ExpiresAt   *time.Time
	// RateLimit: the key's own rate limit (nil: its environment's).
	RateLimit *RateLimit
}

// GrantsOf returns what k grants.
func GrantsOf(k APIKey) KeyGrants {
	return KeyGrants{OrgID: k.OrgID, Permissions: slices.Clone(k.Permissions), Operator: k.Operator, ExpiresAt: k.ExpiresAt, RateLimit: k.RateLimit}
}

// Equal reports whether g and o grant the same (permissions in any order, expiry as an
// instant).
func (g KeyGrants) Equal(o KeyGrants) bool {
	a, b := canonicalGrantsOf(&g), canonicalGrantsOf(&o)
	return a.OrgID == b.OrgID && slices.Equal(a.Permissions, b.Permissions) && a.Operator == b.Operator && a.ExpiresAt == b.ExpiresAt &&
		(a.RateLimit == nil) == (b.RateLimit == nil) && (a.RateLimit == nil || *a.RateLimit == *b.RateLimit)
}

// KeyReport is the outcome of checking the keys against the key-management chain: OK, or the
// first problem (Problem altered or inserted, naming KeyID and the record's Seq).
type KeyReport struct {
	OK bool
	// Checked counts the keys whose grants and revocation match their latest record.
	Checked int
	// Legacy names the keys whose records were written before records carried grants: their
	// grants cannot be checked. Unrecorded names the keys no chained record names: created
	// outside the API (seeded, or put straight into the table). Both are reported, never
	// passed silently.
	Legacy     []string
	Unrecorded []string

	Problem string
	KeyID   string
	Seq     int64
	Detail  string
}

// VerifyKeyGrants checks every key against the chained records of the key-management chain
// (verify the chain first: VerifyAuditChain). A key must grant what its latest record with
// grants says (altered otherwise), be revoked if a key.revoke record names it (altered), and
// be the only key with its id (inserted).
func VerifyKeyGrants(records []AuditRecord, keys []APIKey) KeyReport {
	var rep KeyReport
	latest := map[string]AuditRecord{} // key id -> its latest record with grants
	named := map[string]bool{}
	revokedBy := map[string]int64{}
	for _, r := range records {
		if r.Seq <= 0 || r.TargetKeyID == "" || !strings.HasPrefix(r.Action, "key.") {
			continue
		}
		named[r.TargetKeyID] = true
		if r.Grants != nil {
			latest[r.TargetKeyID] = r
		}
		if r.Action == ActionKeyRevoke {
			revokedBy[r.TargetKeyID] = r.Seq
		}
	}
	fail := func(problem string, k APIKey, seq int64, detail string) KeyReport {
		rep.Problem, rep.KeyID, rep.Seq, rep.Detail = problem, k.KeyID, seq, detail
		return rep
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k.KeyID] {
			return fail(ChainInserted, k, 0, "a second key item with this id")
		}
		seen[k.KeyID] = true
		if seq, ok := revokedBy[k.KeyID]; ok && !k.Revoked {
			return fail(ChainAltered, k, seq, fmt.Sprintf("record %d revoked the key, but the key is not revoked", seq))
		}
		r, ok := latest[k.KeyID]
		switch {
		case ok && !GrantsOf(k).Equal(*r.Grants):
			return fail(ChainAltered, k, r.Seq, fmt.Sprintf("the key grants %s; record %d says %s", describeGrants(GrantsOf(k)), r.Seq, describeGrants(*r.Grants)))
		case ok:
			rep.Checked++
		case named[k.KeyID]:
			rep.Legacy = append(rep.Legacy, k.KeyID)
		default:
			rep.Unrecorded = append(rep.Unrecorded, k.KeyID)
		}
	}
	rep.OK = true
	return rep
}

func describeGrants(g KeyGrants) string {
	exp := "never"
	if g.ExpiresAt != nil {
		exp = g.ExpiresAt.UTC().Format(time.RFC3339)
	}
	rate := ""
	if g.RateLimit != nil {
		rate = ", rate limit " + describeRate(*g.RateLimit)
	}
	return fmt.Sprintf("org %s, permissions [%s], operator %t, expires %s%s", g.OrgID, strings.Join(canonicalGrantsOf(&g).Permissions, " "), g.Operator, exp, rate)
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

// KeyRevocation asks to revoke the key KeyID; Reason goes to the audit record.
type KeyRevocation struct {
	KeyID  string
	Reason string
}

// RevokeKey revokes an API key, for operators holding key.manage only (anyone else: 404), and
// only a key that grants no more than the caller holds (else 403). Revoking a revoked key
// answers it as it is and writes nothing; an operator may revoke the key it calls with.
func (s *Service) RevokeKey(ctx context.Context, p Principal, req KeyRevocation, meta RequestMeta) (*APIKey, error) {
	if err := AdmitKeyManagement(p); err != nil {
		return nil, err
	}
	keyID := req.KeyID
	if !ValidID(keyID) {
		return nil, keyNotFound()
	}
	if err := validateReason(req.Reason); err != nil {
		return nil, err
	}
	store, err := s.keyStore()
	if err != nil {
		return nil, err
	}
	var last error
	for range s.attempts() + 1 {
		k, err := store.GetKey(ctx, keyID)
		if ErrorCode(err) == CodeNotFound {
			return nil, keyNotFound()
		}
		if err != nil {
			return nil, fmt.Errorf("read key %s: %w", keyID, err)
		}
		if k.Revoked {
			return k, nil // repeat-safe: a second revoke, or ours that landed after a timeout
		}
		// A key may revoke itself, or a key that holds nothing it lacks (org and expiry
		// aside, so a stray operator key of another org can still be revoked): a narrower
		// key manager cannot lock out the keys above it.
		if k.KeyID != p.KeyID {
			if err := checkHolds(p, *k); err != nil {
				return nil, Errorf(CodeForbidden, "the key %s grants more than the calling key holds, so it cannot revoke it (%s)", k.KeyID, ErrorMessage(err))
			}
		}
		now := s.now()
		err = store.RevokeKey(ctx, *k, now, s.keyAudit(p, meta, ActionKeyRevoke, *k, req.Reason, now))
		last = err
		switch {
		case err == nil:
			k.Revoked, k.RevokedAt = true, &now
			return k, nil
		case errors.Is(err, ErrThrottled):
			return nil, errThrottled()
		case errors.Is(err, ErrConflict), errors.Is(err, ErrAmbiguous):
			continue // read again: revoked by someone else, or by us after all
		default:
			return nil, fmt.Errorf("revoke key %s: %w", keyID, err)
		}
	}
	s.logger().WarnContext(ctx, "key revoke kept losing races", "key_id", keyID, "err", last)
	return nil, Errorf(CodeConcurrentModification, "the key kept changing while it was revoked; retrying is safe")
}
