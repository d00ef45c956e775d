package capacity

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// AuditRecordJSON is an audit record in its JSON form: the API's (shared/wire serves it as
// wire.AuditRecordJSON), with every member present but grants and start, lists [] when empty
// and times RFC 3339 with nanoseconds in UTC. Less its hash it is also the text the record's
// hash covers (canonicalAudit), so that a client recomputes the hash from exactly what it was
// shown: AuditRecordJSON.Record, then HashAuditRecord.
type AuditRecordJSON struct {
	ID             string       `json:"id"`
	Seq            int64        `json:"seq"`
	PrevHash       string       `json:"prevHash"`
	Hash           string       `json:"hash"`
	Time           string       `json:"time"`
	RequestID      string       `json:"requestId"`
	ActorKeyID     string       `json:"actorKeyId"`
	CallerOrgID    string       `json:"callerOrgId"`
	ActingFor      string       `json:"actingFor"`
	Action         string       `json:"action"`
	NodeID         string       `json:"nodeId"`
	ReservationID  string       `json:"reservationId"`
	UnitIDs        []string     `json:"unitIds"`
	DryRun         bool         `json:"dryRun"`
	Reason         string       `json:"reason"`
	ReclaimID      string       `json:"reclaimId"`
	Terminated     []string     `json:"terminated"`
	Skipped        []string     `json:"skipped"`
	ReleasedBefore []string     `json:"releasedBefore"`
	ReleasedAfter  []string     `json:"releasedAfter"`
	TopologyGen    int64        `json:"topologyGen"`
	VMID           string       `json:"vmId"`
	Outcome        string       `json:"outcome"`
	Via            string       `json:"via"`
	EventID        string       `json:"eventId"`
	Victims        []VictimJSON `json:"victims"`
	TargetKeyID    string       `json:"targetKeyId"`
	// Grants is on key-management records only (absent elsewhere, and on key records
	// written before it existed).
	Grants *GrantsJSON `json:"grants,omitempty"`
	// Start is on the one record whose append pinned the chain's start.
	Start *ChainStartJSON `json:"start,omitempty"`
}

// VictimJSON is a VM a reclaim evicted, with its buyer org and units.
type VictimJSON struct {
	VMID    string   `json:"vmId"`
	OrgID   string   `json:"orgId"`
	UnitIDs []string `json:"unitIds"`
}

// GrantsJSON is what a key grants, as its audit records show it.
type GrantsJSON struct {
	OrgID       string   `json:"orgId"`
	Permissions []string `json:"permissions"`
	Operator    bool     `json:"operator"`
	ExpiresAt   string   `json:"expiresAt,omitempty"`
	// RateLimit is the key's own rate limit (absent: its environment's). The hash covers it.
	RateLimit *RateLimitJSON `json:"rateLimit,omitempty"`
}

// ChainStartJSON pins the unchained records before a chain: their number and digest.
type ChainStartJSON struct {
	Unchained int64  `json:"unchained"`
	Digest    string `json:"digest"`
}

// RateLimitJSON is a key's own rate limit in JSON: the key's, and its audit records' grants.
type RateLimitJSON struct {
	PerSecond float64 `json:"perSecond"`
	Burst     int     `json:"burst"`
}

// JSON is l in its JSON form (nil: none).
func (l *RateLimit) JSON() *RateLimitJSON {
	if l == nil {
		return nil
	}
	return &RateLimitJSON{PerSecond: l.PerSecond, Burst: l.Burst}
}

// Limit is j as the domain has it (nil: none).
func (j *RateLimitJSON) Limit() *RateLimit {
	if j == nil {
		return nil
	}
	return &RateLimit{PerSecond: j.PerSecond, Burst: j.Burst}
}

// JSON is r in its JSON form.
func (r AuditRecord) JSON() AuditRecordJSON {
	out := AuditRecordJSON{
		ID: r.ID, Seq: r.Seq, PrevHash: r.PrevHash, Hash: r.Hash, Time: r.Time.UTC().Format(time.RFC3339Nano),
		RequestID: r.RequestID, ActorKeyID: r.ActorKeyID, CallerOrgID: r.CallerOrgID, ActingFor: r.ActingFor,
		Action: r.Action, NodeID: r.NodeID, ReservationID: r.ReservationID, UnitIDs: list(r.UnitIDs),
		DryRun: r.DryRun, Reason: r.Reason, ReclaimID: r.ReclaimID, Terminated: list(r.Terminated),
		Skipped: list(r.Skipped), ReleasedBefore: list(r.ReleasedBefore), ReleasedAfter: list(r.ReleasedAfter),
		TopologyGen: r.TopologyGen, VMID: r.VMID, Outcome: r.Outcome, Via: r.Via, EventID: r.EventID,
		Victims: make([]VictimJSON, 0, len(r.Victims)), TargetKeyID: r.TargetKeyID,
	}
	for _, v := range r.Victims {
		out.Victims = append(out.Victims, VictimJSON{VMID: v.VMID, OrgID: v.OrgID, UnitIDs: list(v.UnitIDs)})
	}
	if st := r.Start; st != nil {
		out.Start = &ChainStartJSON{Unchained: st.Unchained, Digest: st.Digest}
	}
	if g := r.Grants; g != nil {
		out.Grants = &GrantsJSON{OrgID: g.OrgID, Permissions: list(g.Permissions), Operator: g.Operator, RateLimit: g.RateLimit.JSON()}
		if g.ExpiresAt != nil {
			out.Grants.ExpiresAt = g.ExpiresAt.UTC().Format(time.RFC3339Nano)
		}
	}
	return out
}

// Record is the record j shows: the inverse of AuditRecord.JSON, with time in UTC and empty
// lists as nil (the record's hash treats nil and empty alike).
func (j AuditRecordJSON) Record() (AuditRecord, error) {
	at, err := time.Parse(time.RFC3339Nano, j.Time)
	if err != nil {
		return AuditRecord{}, fmt.Errorf("audit record %s: time %q: %w", j.ID, j.Time, err)
	}
	r := AuditRecord{
		ID: j.ID, Seq: j.Seq, PrevHash: j.PrevHash, Hash: j.Hash, Time: at.UTC(),
		RequestID: j.RequestID, ActorKeyID: j.ActorKeyID, CallerOrgID: j.CallerOrgID, ActingFor: j.ActingFor,
		Action: j.Action, NodeID: j.NodeID, ReservationID: j.ReservationID, UnitIDs: nilIfEmpty(j.UnitIDs),
		DryRun: j.DryRun, Reason: j.Reason, ReclaimID: j.ReclaimID, Terminated: nilIfEmpty(j.Terminated),
		Skipped: nilIfEmpty(j.Skipped), ReleasedBefore: nilIfEmpty(j.ReleasedBefore),
		ReleasedAfter: nilIfEmpty(j.ReleasedAfter), TopologyGen: j.TopologyGen, VMID: j.VMID,
		Outcome: j.Outcome, Via: j.Via, EventID: j.EventID, TargetKeyID: j.TargetKeyID,
	}
	for _, v := range j.Victims {
		r.Victims = append(r.Victims, Victim{VMID: v.VMID, OrgID: v.OrgID, UnitIDs: nilIfEmpty(v.UnitIDs)})
	}
	if st := j.Start; st != nil {
		r.Start = &ChainStart{Unchained: st.Unchained, Digest: st.Digest}
	}
	if g := j.Grants; g != nil {
		r.Grants = &KeyGrants{OrgID: g.OrgID, Permissions: nilIfEmpty(g.Permissions), Operator: g.Operator, RateLimit: g.RateLimit.Limit()}
		if g.ExpiresAt != "" {
			at, err := time.Parse(time.RFC3339Nano, g.ExpiresAt)
			if err != nil {
				return AuditRecord{}, fmt.Errorf("audit record %s: grants expiresAt %q: %w", j.ID, g.ExpiresAt, err)
			}
			at = at.UTC()
			r.Grants.ExpiresAt = &at
		}
	}
	return r, nil
}

func list(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// canonicalAudit is the fixed text a record's hash is computed over: its JSON form less its
// hash, with targetKeyId, grants and start left out when empty (they came after chains did,
// and records without them keep the hash they were written with) and grants in their
// canonical form. Changing it changes every hash.
//
// Its own fields shadow the embedded form's members of the same names (encoding/json keeps
// the shallower field, in its own place): hash, always empty here, drops out, and
// targetKeyId, grants and start follow victims in this order.
type canonicalAudit struct {
	AuditRecordJSON
	Hash        string           `json:"hash,omitempty"`
	TargetKeyID string           `json:"targetKeyId,omitempty"`
	Grants      *canonicalGrants `json:"grants,omitempty"`
	Start       *ChainStartJSON  `json:"start,omitempty"`
}

// canonicalGrants is KeyGrants in the canonical form: permissions sorted, expiry "" for none.
type canonicalGrants struct {
	OrgID       string   `json:"orgId"`
	Permissions []string `json:"permissions"`
	Operator    bool     `json:"operator"`
	ExpiresAt   string   `json:"expiresAt"`
	// RateLimit is left out when the key has none of its own: records from before keys could
	// have one hash as they did.
	RateLimit *RateLimitJSON `json:"rateLimit,omitempty"`
}

func canonicalGrantsOf(g *KeyGrants) *canonicalGrants {
	if g == nil {
		return nil
	}
	c := &canonicalGrants{OrgID: g.OrgID, Permissions: slices.Sorted(slices.Values(list(g.Permissions))), Operator: g.Operator, RateLimit: g.RateLimit.JSON()}
	if c.Permissions == nil {
		c.Permissions = []string{}
	}
	if g.ExpiresAt != nil {
		c.ExpiresAt = g.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	return c
}

// HashAuditRecord returns the hex SHA-256 of the record's canonical JSON, which includes Seq
// and PrevHash and excludes Hash.
func HashAuditRecord(r AuditRecord) string {
	j := r.JSON()
	b, err := json.Marshal(canonicalAudit{AuditRecordJSON: j, TargetKeyID: j.TargetKeyID, Grants: canonicalGrantsOf(r.Grants), Start: j.Start})
	if err != nil { // strings, numbers and bools only: cannot fail
		panic(fmt.Sprintf("encode audit record %s: %v", r.ID, err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
