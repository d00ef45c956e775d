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
