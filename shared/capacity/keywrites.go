package capacity

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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
	var answer *KeyResult  // a replay's, or the pending key's found under the record
	var inFlight *keyWrite // a write of unknown outcome, to name in the log if it stays so
	w := writer[IdempotencyRecord, keyWrite]{
		kind: "key create", subject: "key management",
		read: func(ctx context.Context) (*IdempotencyRecord, error) {
			if key.scope == "" {
				return nil, nil
			}
			rec, err := store.KeyIdempotency(ctx, key.scope)
			if err != nil {
				return nil, fmt.Errorf("read idempotency record: %w", err)
			}
			return rec, nil
		},
		commit: func(ctx context.Context, c *keyWrite) error {
			err := store.CreateKey(ctx, c.res.Key, c.idem, c.audit)
			if errors.Is(err, ErrAmbiguous) {
				inFlight = c
			}
			return err
		},
		audit: func(c *keyWrite) AuditRecord { return c.audit },
		// The key's id tells: it is put by that write alone.
		landed: func(ctx context.Context, c *keyWrite) (bool, error) {
			_, err := store.GetKey(ctx, c.res.Key.KeyID)
			if ErrorCode(err) == CodeNotFound {
				return false, nil
			}
			return err == nil, err
		},
	}
	// The decision is made with the call's now (its expiry was checked against it). While a
	// round's write is of unknown outcome, every later round puts the SAME key, idempotency
	// record and audit record again (on AWS a read may not yet see a transaction in flight):
	// the conditional puts let at most one of them land, and its secret is the one answered.
	// A new key (new secret) is made only when nothing is in flight.
	landed, err := commitRounds(s, ctx, w, func(rec *IdempotencyRecord, _ time.Time, pending *keyWrite) (*keyWrite, error) {
		var res KeyResult
		if replayed, err := replay(rec, key.fingerprint, now, &res); replayed || err != nil {
			if err != nil {
				return nil, err
			}
			if pending != nil && res.Key.KeyID == pending.res.Key.KeyID {
				answer = pending.res // our own earlier write landed: its secret is ours to show
				return nil, nil
			}
			res.SecretShown, res.Replayed = true, true
			s.appendKeyAudit(ctx, *replayAudit(s.keyAudit(p, meta, ActionKeyCreate, res.Key, "", now)))
			answer = &res
			return nil, nil
		}
		if pending != nil {
			return pending, nil
		}
		created, err := s.newKey(p, req, meta, key, now)
		if err != nil {
			return nil, err
		}
		stored := *created
		stored.Key.Hash = "" // the answer as replayed: neither secret nor hash
		stored.SecretShown = true
		idem, err := s.idempotencyRecord(key, "", stored, now)
		if err != nil {
			return nil, err
		}
		return &keyWrite{res: created, idem: idem, audit: s.keyAudit(p, meta, ActionKeyCreate, created.Key, "", now)}, nil
	})
	switch {
	case err != nil:
		if inFlight != nil {
			s.logger().WarnContext(ctx, "key creation outcome unknown; the key may still appear (revoke it)", "key_id", inFlight.res.Key.KeyID, "err", err)
		}
		return nil, err
	case landed != nil:
		return landed.res, nil
	}
	return answer, nil
}

// keyWrite is one round's creation of a key: the key with its secret (the answer), its
// idempotency record (nil: none) and its audit record.
type keyWrite struct {
	res   *KeyResult
	idem  *IdempotencyRecord
	audit AuditRecord
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
	var answer *APIKey // the key revoked: by the write that landed, or as read already revoked
	w := writer[APIKey, keyRevoke]{
		kind: "key revoke", subject: "the key", logAttrs: []any{"key_id", keyID},
		read: func(ctx context.Context) (*APIKey, error) {
			k, err := store.GetKey(ctx, keyID)
			if ErrorCode(err) == CodeNotFound {
				return nil, keyNotFound()
			}
			if err != nil {
				return nil, fmt.Errorf("read key %s: %w", keyID, err)
			}
			return k, nil
		},
		commit: func(ctx context.Context, c *keyRevoke) error {
			err := store.RevokeKey(ctx, c.key, c.audit.Time, c.audit)
			if err == nil {
				at := c.audit.Time
				answer = &c.key
				answer.Revoked, answer.RevokedAt = true, &at
			}
			return err
		},
		audit: func(c *keyRevoke) AuditRecord { return c.audit },
		// Revoked by this call or by another: either way the key is answered as stored.
		landed: func(ctx context.Context, c *keyRevoke) (bool, error) {
			k, err := store.GetKey(ctx, keyID)
			if ErrorCode(err) == CodeNotFound {
				return false, nil // gone: the next read answers so
			}
			if err != nil || !k.Revoked {
				return false, err
			}
			answer = k
			return true, nil
		},
	}
	_, err = commitRounds(s, ctx, w, anew(func(k *APIKey, now time.Time) (*keyRevoke, error) {
		if k.Revoked {
			answer = k // repeat-safe: a second revoke, or one that won meanwhile
			return nil, nil
		}
		// A key may revoke itself, or a key that holds nothing it lacks (org and expiry
		// aside, so a stray operator key of another org can still be revoked): a narrower
		// key manager cannot lock out the keys above it.
		if k.KeyID != p.KeyID {
			if err := checkHolds(p, *k); err != nil {
				return nil, Errorf(CodeForbidden, "the key %s grants more than the calling key holds, so it cannot revoke it (%s)", k.KeyID, ErrorMessage(err))
			}
		}
		return &keyRevoke{key: *k, audit: s.keyAudit(p, meta, ActionKeyRevoke, *k, req.Reason, now)}, nil
	}))
	if err != nil {
		return nil, err
	}
	return answer, nil
}

// keyRevoke is one round's revocation: the key as read and the audit record, whose time is
// the revocation's.
type keyRevoke struct {
	key   APIKey
	audit AuditRecord
}
