package capacity

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// idempotency identifies a request made under an Idempotency-Key.
type idempotency struct {
	scope       string // "" when the request carries no key
	fingerprint string
}

// idempotencyRecord is the record that replays result for a request made with a key (nil for
// a request without one). Every write that honours Idempotency-Key stores it with its commit.
func (s *Service) idempotencyRecord(key idempotency, nodeID string, result any, now time.Time) (*IdempotencyRecord, error) {
	if key.scope == "" {
		return nil, nil
	}
	body, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("encode result for idempotency record: %w", err)
	}
	return &IdempotencyRecord{
		Scope: key.scope, NodeID: nodeID, Fingerprint: key.fingerprint, Result: body,
		CreatedAt: now, ExpiresAt: now.Add(s.idempotencyTTL()),
	}, nil
}

// OutcomeReplayed is the audit outcome of a call answered from its Idempotency-Key record:
// nothing was applied, but who asked again for the stored answer is on record.
const OutcomeReplayed = "replayed"

// replayAudit is the audit record of a replayed call: the call's own facts, with nothing
// moved.
func replayAudit(rec AuditRecord) *AuditRecord {
	rec.Outcome = OutcomeReplayed
	return &rec
}

// replay decodes a stored result into out when the record matches the request. An expired
// record (TTL deletion lags expiry by up to days) no longer binds the key.
func replay(rec *IdempotencyRecord, fingerprint string, now time.Time, out any) (bool, error) {
	if rec == nil || !now.Before(rec.ExpiresAt) {
		return false, nil
	}
	if rec.Fingerprint != fingerprint {
		return false, Errorf(CodeIdempotencyKeyReused, "Idempotency-Key was already used for a different request")
	}
	if err := json.Unmarshal(rec.Result, out); err != nil {
		return false, fmt.Errorf("decode stored idempotent result: %w", err)
	}
	switch r := out.(type) {
	case *CapacityResult:
		r.Replayed = true
	case *PlacementResult:
		r.Replayed = true
	case *NodeResult:
		r.Replayed = true
	case *ReservationResult:
		r.Replayed = true
	case *TopologyResult:
		r.Replayed = true
	case *ForceEndResult:
		r.Replayed = true
	case *AgentKeyResult:
		r.Replayed = true
	}
	return true, nil
}

// Prefixes of the Idempotency-Keys the service chooses itself: a scheduled reclaim fires
// under "scheduled:<id>" (FireIdempotencyKey), an event without a key of its own runs under
// "event:<event id>". A client may not choose them.
const (
	ScheduledKeyPrefix = "scheduled:"
	EventKeyPrefix     = "event:"
)

// keyed is the idempotency of a request made with Idempotency-Key key (none when ""). A key
// with one of the service's own prefixes is refused unless the service chose it: were a
// client to take "scheduled:<id>" first, the scheduled reclaim's firing would replay the
// client's answer (or be refused as a reuse) instead of running.
func keyed(p Principal, meta RequestMeta, key, fingerprint string) (idempotency, error) {
	reserved := false
	switch {
	case strings.HasPrefix(key, ScheduledKeyPrefix):
		reserved = meta.via() != ViaSchedule
	case strings.HasPrefix(key, EventKeyPrefix):
		reserved = meta.via() != ViaEvent || key != EventKeyPrefix+meta.EventID
	}
	if reserved {
		return idempotency{}, Errorf(CodeInvalidRequest, "Idempotency-Key may not start with %q or %q: the service keys its own scheduled reclaims and events with them",
			ScheduledKeyPrefix, EventKeyPrefix)
	}
	return idempotency{scope: idempotencyScope(p, key), fingerprint: fingerprint}, nil
}

// ValidateClientIdempotencyKey checks an Idempotency-Key a client sent to a call that keeps
// no record of it (a key revocation): its form, and that it is none of the service's own.
func ValidateClientIdempotencyKey(key string) error {
	if err := ValidateIdempotencyKey(key); err != nil {
		return err
	}
	_, err := keyed(Principal{}, RequestMeta{}, key, "")
	return err
}

// idempotencyScope keys a caller's Idempotency-Key by the calling key and its org: a retry
// by the same key replays, and the same Idempotency-Key sent with another key (of the same
// org or not) is another request, which neither replays nor is refused by the first one's
// record. Events act as "event:<source>" for an org, scheduled reclaims as the key that
// created them. The "@" that starts it is no first character of an org id, so a scope never
// equals one written before keys were in it (LegacyIdempotencyScope).
func idempotencyScope(p Principal, key string) string {
	if key == "" {
		return ""
	}
	return "@" + scopePart.Replace(p.KeyID) + "#" + scopePart.Replace(p.OrgID) + "#" + key
}

// scopePart escapes the separator (and the escape) in a scope's key id and org id, so that
// no two (key, org, Idempotency-Key) share a scope.
var scopePart = strings.NewReplacer("%", "%25", "#", "%23")

// LegacyIdempotencyScope is the scope that the same call had before scopes named the calling
// key (org "#" Idempotency-Key), "" for a scope of no such form. Records under it are still
// honoured until they expire (24 h after they were written), so that a retry across the
// change replays rather than applies again; the store reads them alongside.
func LegacyIdempotencyScope(scope string) string {
	rest, ok := strings.CutPrefix(scope, "@")
	if !ok {
		return ""
	}
	_, rest, ok = strings.Cut(rest, "#")
	if !ok {
		return ""
	}
	org, key, ok := strings.Cut(rest, "#")
	if !ok {
		return ""
	}
	org = strings.NewReplacer("%23", "#", "%25", "%").Replace(org)
	return org + "#" + key
}

// fingerprintOf hashes what a request asks for, to tell a retry from a reuse of its key.
// Unit ids are a set (validation refuses duplicates): their order does not make a request
// different.
func fingerprintOf(action string, req any) string {
	switch r := req.(type) {
	case CapacityRequest:
		r.UnitIDs = slices.Sorted(slices.Values(r.UnitIDs))
		req = r
	case PlacementRequest:
		r.UnitIDs = slices.Sorted(slices.Values(r.UnitIDs))
		req = r
	}
	b, _ := json.Marshal(struct {
		Action  string
		Request any
	}{action, req})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
