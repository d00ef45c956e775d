package wire

import (
	"encoding/base64"
	"fmt"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// NodeJSON is a node as the operator routes show it.
type NodeJSON struct {
	NodeID        string        `json:"nodeId"`
	OwnerOrgID    string        `json:"ownerOrgId"`
	UnitIDs       []string      `json:"unitIds"`
	AgentEndpoint string        `json:"agentEndpoint"`
	TopologyGen   int64         `json:"topologyGen"`
	Version       int64         `json:"version"`
	AuditHead     AuditHeadJSON `json:"auditHead"`
	// AgentKeyGen is the generation of the agent's key (0: derived from the master secret);
	// AgentKeyRotatedAt when it last rotated, if it did.
	AgentKeyGen       int64  `json:"agentKeyGen"`
	AgentKeyRotatedAt string `json:"agentKeyRotatedAt,omitempty"`
}

// AuditHeadJSON is the head of an audit hash chain: the last record's seq and hash, and the
// pin of the chain's start (absent while the chain pins none).
type AuditHeadJSON struct {
	Seq   int64           `json:"seq"`
	Hash  string          `json:"hash"`
	Start *ChainStartJSON `json:"start,omitempty"`
}

// ChainStartJSON pins the unchained records before a chain: their number and digest.
type ChainStartJSON = capacity.ChainStartJSON

// Node is n as the API shows it.
func Node(n capacity.Node) NodeJSON {
	return NodeJSON{
		NodeID: n.ID, OwnerOrgID: n.OwnerOrgID, UnitIDs: list(n.UnitIDs), AgentEndpoint: n.AgentEndpoint,
		TopologyGen: n.TopologyGen, Version: n.Version, AuditHead: AuditHead(n.AuditHead),
		AgentKeyGen: n.AgentKeyGen, AgentKeyRotatedAt: optRFC3339(n.AgentKeyRotatedAt),
	}
}

// optRFC3339 is t in RFC 3339 (UTC), or "" for the zero time.
func optRFC3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// AuditHead is h as the API shows it.
func AuditHead(h capacity.AuditHead) AuditHeadJSON {
	out := AuditHeadJSON{Seq: h.Seq, Hash: h.Hash}
	if h.Start.Pinned() {
		out.Start = &ChainStartJSON{Unchained: h.Start.Unchained, Digest: h.Start.Digest}
	}
	return out
}

// AuditHeadFrom is the head j shows: the inverse of AuditHead.
func AuditHeadFrom(j AuditHeadJSON) capacity.AuditHead {
	h := capacity.AuditHead{Seq: j.Seq, Hash: j.Hash}
	if j.Start != nil {
		h.Start = capacity.ChainStart{Unchained: j.Start.Unchained, Digest: j.Start.Digest}
	}
	return h
}

// NodeAnswerJSON answers PUT /v1/nodes/{nodeId}. AgentKey (base64, standard, padded) is the
// node agent's key, only in the answer that registered the node; a replay of that answer
// carries SecretShown instead, since secrets are never stored.
type NodeAnswerJSON struct {
	Node        NodeJSON `json:"node"`
	Created     bool     `json:"created"`
	AgentKey    string   `json:"agentKey,omitempty"`
	SecretShown bool     `json:"secretShown,omitempty"`
}

// AgentKeyAnswerJSON answers POST /v1/nodes/{nodeId}/agent-key/rotate: the new generation
// and its key (base64), once; a replay carries SecretShown instead. The previous generation's
// key works until PreviousValidUntil.
type AgentKeyAnswerJSON struct {
	NodeID             string `json:"nodeId"`
	AgentKeyGen        int64  `json:"agentKeyGen"`
	AgentKey           string `json:"agentKey,omitempty"`
	SecretShown        bool   `json:"secretShown,omitempty"`
	PreviousValidUntil string `json:"previousValidUntil"`
}

// AgentKeyAnswer is the answer to a key rotation.
func AgentKeyAnswer(res *capacity.AgentKeyResult) AgentKeyAnswerJSON {
	out := AgentKeyAnswerJSON{NodeID: res.NodeID, AgentKeyGen: res.Gen, SecretShown: res.SecretShown,
		PreviousValidUntil: res.PreviousValidUntil.UTC().Format(time.RFC3339)}
	if len(res.AgentKey) > 0 {
		out.AgentKey = base64.StdEncoding.EncodeToString(res.AgentKey)
	}
	return out
}

// NodeGetJSON answers GET /v1/nodes/{nodeId}.
type NodeGetJSON struct {
	Node NodeJSON `json:"node"`
}

// ReservationAnswerJSON answers reservation create, cancel and reaffirm. VMsOnUnits is on
// cancel only (the VMs still running on the units, which a cancel does not terminate).
type ReservationAnswerJSON struct {
	Reservation ReservationJSON `json:"reservation"`
	VMsOnUnits  *[]VMJSON       `json:"vmsOnUnits,omitempty"`
}

// VMs is vms as the API shows them, [] for none.
func VMs(vms []capacity.VM) []VMJSON {
	out := make([]VMJSON, 0, len(vms))
	for _, v := range vms {
		out = append(out, VM(v))
	}
	return out
}

// TopologyJSON answers PUT /v1/nodes/{nodeId}/topology.
type TopologyJSON struct {
	Node              NodeJSON `json:"node"`
	Changed           bool     `json:"changed"`
	AddedUnitIDs      []string `json:"addedUnitIds"`
	RemovedUnitIDs    []string `json:"removedUnitIds"`
	NeedsReview       []string `json:"needsReview"`
	VMsOnRemovedUnits []VMJSON `json:"vmsOnRemovedUnits"`
}

// ReservationPageJSON is a page of reservations; NextCursor is absent on the last page.
type ReservationPageJSON struct {
	Reservations []ReservationJSON `json:"reservations"`
	NextCursor   string            `json:"nextCursor,omitempty"`
}

// KeyJSON is an API key as the key routes show it; never its secret or hash.
type KeyJSON struct {
	KeyID       string   `json:"keyId"`
	OrgID       string   `json:"orgId"`
	Permissions []string `json:"permissions"`
	Operator    bool     `json:"operator"`
	Description string   `json:"description,omitempty"`
	// CreatedAt is absent on a key that records no creation time (one written to the table
	// outside the API): never "", which is no date-time.
	CreatedAt  string `json:"createdAt,omitempty"`
	CreatedBy  string `json:"createdBy,omitempty"`
	ExpiresAt  string `json:"expiresAt,omitempty"`
	Revoked    bool   `json:"revoked"`
	RevokedAt  string `json:"revokedAt,omitempty"`
	LastUsedAt string `json:"lastUsedAt,omitempty"`
	// RateLimit is the key's own limit; absent: the environment's.
	RateLimit *RateLimitJSON `json:"rateLimit,omitempty"`
}

// RateLimitJSON is a key's own rate limit.
type RateLimitJSON = capacity.RateLimitJSON

// RateLimit is l as the API shows it (nil: none).
func RateLimit(l *capacity.RateLimit) *RateLimitJSON { return l.JSON() }

// KeyAnswerJSON answers POST /v1/keys. Secret is only in the answer that created the key; a
// replay of that answer carries SecretShown instead, since secrets are never stored.
type KeyAnswerJSON struct {
	Key         KeyJSON `json:"key"`
	Secret      string  `json:"secret,omitempty"`
	SecretShown bool    `json:"secretShown,omitempty"`
}

// KeyGetJSON answers a key revoke.
type KeyGetJSON struct {
	Key KeyJSON `json:"key"`
}

// SelfKeyJSON answers GET /v1/keys/self: the caller's own key, only what it may do and
// until when; never its secret, hash, description or history.
type SelfKeyJSON struct {
	Key CallerKeyJSON `json:"key"`
}

// CallerKeyJSON is the caller's own key as GET /v1/keys/self shows it.
type CallerKeyJSON struct {
	KeyID       string         `json:"keyId"`
	OrgID       string         `json:"orgId"`
	Permissions []string       `json:"permissions"`
	Operator    bool           `json:"operator"`
	ExpiresAt   string         `json:"expiresAt,omitempty"`
	RateLimit   *RateLimitJSON `json:"rateLimit,omitempty"`
}

// SelfKey is k as GET /v1/keys/self shows it.
func SelfKey(k capacity.CallerKey) SelfKeyJSON {
	return SelfKeyJSON{Key: CallerKeyJSON{
		KeyID: k.KeyID, OrgID: k.OrgID, Permissions: list(k.Permissions), Operator: k.Operator,
		ExpiresAt: optTime(k.ExpiresAt), RateLimit: RateLimit(k.RateLimit),
	}}
}

// KeyPageJSON is a page of keys; NextCursor is absent on the last page.
type KeyPageJSON struct {
	Keys       []KeyJSON `json:"keys"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// The audit record's JSON form is the domain's: less its hash, it is the text the hash
// covers (capacity.AuditRecordJSON).
type (
	AuditRecordJSON = capacity.AuditRecordJSON
	GrantsJSON      = capacity.GrantsJSON
	VictimJSON      = capacity.VictimJSON
)

// AuditRecord is r as the API shows it.
func AuditRecord(r capacity.AuditRecord) AuditRecordJSON { return r.JSON() }

// AuditRecordFrom is the record j shows (AuditRecordJSON.Record).
func AuditRecordFrom(j AuditRecordJSON) (capacity.AuditRecord, error) { return j.Record() }

// AuditPageJSON is a page of a reservation's audit records, newest first.
type AuditPageJSON struct {
	Records    []AuditRecordJSON `json:"records"`
	NextCursor string            `json:"nextCursor,omitempty"`
}

// AuditChainPageJSON is a page of a chain's records in chain order, with the chain's head as
// read before the records (later records may follow it).
type AuditChainPageJSON struct {
	Head       AuditHeadJSON     `json:"head"`
	Records    []AuditRecordJSON `json:"records"`
	NextCursor string            `json:"nextCursor,omitempty"`
}

func auditRecords(rs []capacity.AuditRecord) []AuditRecordJSON {
	out := make([]AuditRecordJSON, 0, len(rs))
	for _, r := range rs {
		out = append(out, AuditRecord(r))
	}
	return out
}

// NodeAnswer is the answer to a node put.
func NodeAnswer(res *capacity.NodeResult) NodeAnswerJSON {
	out := NodeAnswerJSON{Node: Node(res.Node), Created: res.Created, SecretShown: res.SecretShown}
	if len(res.AgentKey) > 0 {
		out.AgentKey = base64.StdEncoding.EncodeToString(res.AgentKey)
	}
	return out
}

// ReservationAnswer is the answer to a reservation change; withVMs adds vmsOnUnits.
func ReservationAnswer(res *capacity.ReservationResult, withVMs bool) ReservationAnswerJSON {
	out := ReservationAnswerJSON{Reservation: Reservation(res.Reservation)}
	if withVMs {
		vms := VMs(res.VMsOnUnits)
		out.VMsOnUnits = &vms
	}
	return out
}

// Topology is the answer to a topology change.
func Topology(res *capacity.TopologyResult) TopologyJSON {
	return TopologyJSON{
		Node: Node(res.Node), Changed: res.Changed, AddedUnitIDs: list(res.AddedUnitIDs),
		RemovedUnitIDs: list(res.RemovedUnitIDs), NeedsReview: list(res.NeedsReview),
		VMsOnRemovedUnits: VMs(res.VMsOnRemovedUnits),
	}
}

// ReservationPage is p as the API shows it.
func ReservationPage(p *capacity.ReservationPage) ReservationPageJSON {
	out := ReservationPageJSON{Reservations: make([]ReservationJSON, 0, len(p.Reservations)), NextCursor: p.NextCursor}
	for _, r := range p.Reservations {
		out.Reservations = append(out.Reservations, Reservation(r))
	}
	return out
}

// Key is k as the API shows it.
func Key(k capacity.APIKey) KeyJSON {
	return KeyJSON{
		KeyID: k.KeyID, OrgID: k.OrgID, Permissions: list(k.Permissions), Operator: k.Operator,
		Description: k.Description, CreatedAt: timeString(k.CreatedAt), CreatedBy: k.CreatedByKeyID,
		ExpiresAt: optTime(k.ExpiresAt), Revoked: k.Revoked, RevokedAt: optTime(k.RevokedAt),
		LastUsedAt: optTime(k.LastUsedAt), RateLimit: RateLimit(k.RateLimit),
	}
}

// KeyFrom is the key j shows, as far as it shows it (no hash): what it grants and whether it
// is revoked, for checking keys against their audit records.
func KeyFrom(j KeyJSON) (capacity.APIKey, error) {
	k := capacity.APIKey{KeyID: j.KeyID, OrgID: j.OrgID, Permissions: nilIfEmpty(j.Permissions), Operator: j.Operator,
		Revoked: j.Revoked, Description: j.Description, CreatedByKeyID: j.CreatedBy, RateLimit: j.RateLimit.Limit()}
	if j.ExpiresAt != "" {
		at, err := time.Parse(time.RFC3339Nano, j.ExpiresAt)
		if err != nil {
			return k, fmt.Errorf("key %s: expiresAt %q: %w", j.KeyID, j.ExpiresAt, err)
		}
		at = at.UTC()
		k.ExpiresAt = &at
	}
	return k, nil
}

func optTime(t *time.Time) string {
	if t == nil {
		return ""
	}
	return timeString(*t)
}

// KeyAnswer is the answer to a key creation.
func KeyAnswer(res *capacity.KeyResult) KeyAnswerJSON {
	return KeyAnswerJSON{Key: Key(res.Key), Secret: res.Secret, SecretShown: res.SecretShown}
}

// KeyPage is p as the API shows it.
func KeyPage(p *capacity.KeyPage) KeyPageJSON {
	out := KeyPageJSON{Keys: make([]KeyJSON, 0, len(p.Keys)), NextCursor: p.NextCursor}
	for _, k := range p.Keys {
		out.Keys = append(out.Keys, Key(k))
	}
	return out
}

// AuditPage is p as the API shows it.
func AuditPage(p *capacity.AuditPage) AuditPageJSON {
	return AuditPageJSON{Records: auditRecords(p.Records), NextCursor: p.NextCursor}
}

// AuditChainPage is p as the API shows it.
func AuditChainPage(p *capacity.AuditChainPage) AuditChainPageJSON {
	return AuditChainPageJSON{Head: AuditHead(p.Head), Records: auditRecords(p.Records), NextCursor: p.NextCursor}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
