// Package capacity is the domain of the capacity-boundary service: nodes, their GPU units,
// reservations, VMs, and the rules that move units between a reservation's exclusive use and
// the spot market. It knows nothing of HTTP, Lambda or DynamoDB; adapters depend on it.
package capacity

import (
	"slices"
	"time"
)

// Permissions carried by API keys.
const (
	// PermCapacity allows reclaiming and releasing a reservation's units.
	PermCapacity = "reservation.capacity"
	// PermRead allows reading reservations the caller can see.
	PermRead = "reservation.read"
	// PermPlace allows the marketplace scheduler to place VMs (with the operator flag).
	PermPlace = "vm.place"

	// Operator permissions: each is a set of operator routes, and only an operator key holds
	// one (see OperatorPermissions). The operator flag alone grants none of them: it widens
	// the scope of the permissions a key holds to every org's nodes and reservations.

	// PermKeyManage allows creating, listing, reading and revoking API keys, never beyond
	// what the caller itself holds.
	PermKeyManage = "key.manage"
	// PermNodeManage allows registering nodes, changing their owner, agent endpoint and
	// topology, and reading any node.
	PermNodeManage = "node.manage"
	// PermReservationManage allows creating, cancelling and reaffirming reservations.
	PermReservationManage = "reservation.manage"
	// PermAuditRead allows reading the audit hash chains of nodes and of key management.
	PermAuditRead = "audit.read"
)

// OperatorPermissions are the permissions only an operator key may hold.
var OperatorPermissions = []string{PermAuditRead, PermKeyManage, PermNodeManage, PermReservationManage}

// AllPermissions is every permission a key may hold, sorted.
var AllPermissions = slices.Sorted(slices.Values(append([]string{PermCapacity, PermRead, PermPlace}, OperatorPermissions...)))

// Principal is the authenticated caller.
type Principal struct {
	KeyID       string
	OrgID       string
	Permissions []string
	Operator    bool
	// ExpiresAt is when the key stops working (nil: never); nothing it schedules may fire
	// after it, and no key it creates expires later.
	ExpiresAt *time.Time
	// RateLimit is the key's own rate limit (nil: its environment's); it only narrows the
	// environment's, and no key it creates may call faster.
	RateLimit *RateLimit
}

// Can reports whether the principal holds the permission.
func (p Principal) Can(perm string) bool { return slices.Contains(p.Permissions, perm) }

// CanOperate reports whether the principal may use the operator routes of perm: an operator
// holding that operator permission.
func (p Principal) CanOperate(perm string) bool { return p.Operator && p.Can(perm) }

// BootstrapKeyID is the actor of keys written with AWS credentials straight to the tables
// (capacityctl keys create --bootstrap): no key exists to act with.
const BootstrapKeyID = "bootstrap"

// Bootstrap is the principal of the first operator key's creation, made with AWS
// credentials on the tables (the authority over the tables is the authority over keys): an
// operator of org holding every permission, with no expiry. Nothing reachable over the API
// or the event bus acts as it.
func Bootstrap(org string) Principal {
	return Principal{KeyID: BootstrapKeyID, OrgID: org, Permissions: slices.Clone(AllPermissions), Operator: true}
}

// APIKey is a stored API key. Only the SHA-256 hash of the secret is kept.
type APIKey struct {
	KeyID       string
	Hash        string
	OrgID       string
	Permissions []string
	Operator    bool
	Revoked     bool
	ExpiresAt   *time.Time
	Description string
	// CreatedAt and CreatedByKeyID are zero on keys provisioned outside the API.
	CreatedAt      time.Time
	CreatedByKeyID string
	RevokedAt      *time.Time
	// LastUsedAt is when the key last authenticated a call, recorded at most once a minute.
	LastUsedAt *time.Time
	// RateLimit is the key's own rate limit, set at creation (nil: its environment's).
	RateLimit *RateLimit
}

// Principal is the caller the key authenticates as (whether it still may is Usable's).
func (k APIKey) Principal() Principal {
	return Principal{KeyID: k.KeyID, OrgID: k.OrgID, Permissions: k.Permissions, Operator: k.Operator, ExpiresAt: k.ExpiresAt, RateLimit: k.RateLimit}
}

// Usable reports whether the key authenticates at now: not revoked, not expired.
func (k APIKey) Usable(now time.Time) bool {
	return !k.Revoked && (k.ExpiresAt == nil || now.Before(*k.ExpiresAt))
}

// Node is a GPU machine and, as the ledger of its units, the item that every write to the
// node's capacity bumps: reclaim, release and placement serialise on its Version.
type Node struct {
	ID            string
	OwnerOrgID    string
	TopologyGen   int64
	AgentEndpoint string
	UnitIDs       []string
	Version       int64
	// AuditHead is the head of the node's audit hash chain, advanced in the same transaction
	// as each audit record of the node is put.
	AuditHead AuditHead
	// AgentKey is the node agent's key of generation AgentKeyGen, sealed (AgentKeySealer): the
	// api function may seal but never open it; only the terminating function opens it.
	// Generation 0 has no sealed key: it is the key derived from the agent master secret, for
	// nodes registered before per-node keys (or without a sealer).
	AgentKeyGen int64
	AgentKey    []byte `json:"-"`
	// PrevAgentKey is generation AgentKeyGen-1's sealed key (nil when that is generation 0),
	// still tried, until AgentKeyRotatedAt+AgentKeyOverlap, on an agent that refuses the
	// current one.
	PrevAgentKey      []byte `json:"-"`
	AgentKeyRotatedAt time.Time
	// AgentKeyOverlapEndedGen is the generation whose overlap an operator ended early (after a
	// leak of the previous key): while it is AgentKeyGen, the previous generation is never
	// tried. A rotation moves AgentKeyGen past it. 0: none ended.
	AgentKeyOverlapEndedGen int64
	// ResealedAgentKey is the terminating function's resealed copy of a generation of the key
	// (nil when there is none, and always in the api function, whose reads leave it out).
	ResealedAgentKey *ResealedAgentKey `json:"-"`
}

// AuditHead is the last record of an audit hash chain: its Seq and Hash (zero: no record yet),
// and the chain's Start.
type AuditHead struct {
	Seq  int64
	Hash string
	// Start pins what precedes the chain in its partition (unchained records, written before
	// chains existed). Zero on a chain begun before pins existed, until its next append.
	Start ChainStart
}

// ChainStart pins the unchained records that precede a chain: how many, and the digest of
// their hashes in chain order (ChainStartOf). It is set once, with the first record the
// service appends to the chain after pins existed, so no unchained record can be planted
// later as if it predated the chain.
type ChainStart struct {
	Unchained int64  `dynamodbav:"unchained"` // as an audit record stores it (AuditRecord.Start)
	Digest    string `dynamodbav:"digest"`
}

// Pinned reports whether the chain's start is pinned.
func (s ChainStart) Pinned() bool { return s.Digest != "" }

// Status of a reservation.
type Status string

const (
	StatusPending     Status = "pending"
	StatusActive      Status = "active"
	StatusExpired     Status = "expired"
	StatusCancelled   Status = "cancelled"
	StatusNeedsReview Status = "needs-review"
)

// Reservation reserves units of one node for an audience of orgs.
type Reservation struct {
	ID              string
	NodeID          string
	AllowedOrgIDs   []string
	ReservedUnitIDs []string
	// ReleasedUnitIDs is the subset of ReservedUnitIDs on the spot market.
	ReleasedUnitIDs []string
	ManagingOrgIDs  []string
	StartsAt        time.Time
	EndsAt          *time.Time
	Status          Status
	ContractRef     string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	Reason          string
	TopologyGen     int64
	Version         int64
}

// InTerm reports whether t is inside [StartsAt, EndsAt).
func (r Reservation) InTerm(t time.Time) bool {
	return !t.Before(r.StartsAt) && (r.EndsAt == nil || t.Before(*r.EndsAt))
}

// ended reports whether t is at or past EndsAt.
func (r Reservation) ended(t time.Time) bool { return r.EndsAt != nil && !t.Before(*r.EndsAt) }

// StatusAt is the status a reader sees at t: a reservation whose term has ended is expired,
// whatever its stored status says, until something rewrites it (a cancelled one stays
// cancelled).
func (r Reservation) StatusAt(t time.Time) Status {
	switch r.Status {
	case StatusActive, StatusPending, StatusNeedsReview:
		if r.ended(t) {
			return StatusExpired
		}
	}
	return r.Status
}

// holds reports whether the reservation keeps its units from other uses at t: an active or
// pending one inside [StartsAt, EndsAt). A needs-review reservation withholds its units from
// everyone until it ends, even before it starts; an expired or cancelled one holds nothing.
func (r Reservation) holds(t time.Time) bool {
	switch r.Status {
	case StatusNeedsReview:
		return !r.ended(t)
	case StatusActive, StatusPending:
		return !t.Before(r.StartsAt) && !r.ended(t)
	}
	return false
}

// upcoming reports whether an active or pending reservation will hold its units after t.
// Until then its units may carry spot VMs only: a reclaim can evict them when it starts, while
// a reserved or on-demand VM would keep the units from it.
func (r Reservation) upcoming(t time.Time) bool {
	return (r.Status == StatusActive || r.Status == StatusPending) && t.Before(r.StartsAt)
}

// Tier is the commercial tier a VM was sold at.
type Tier string

const (
	TierSpot     Tier = "spot"
	TierReserved Tier = "reserved"
	TierOnDemand Tier = "on-demand"
)

// VMState is the lifecycle state of a VM.
type VMState string

const (
	VMRunning     VMState = "running"
	VMTerminating VMState = "terminating"
	VMTerminated  VMState = "terminated"
)

// VM is a workload placed on units of a node.
type VM struct {
	ID        string
	NodeID    string
	OrgID     string
	Tier      Tier
	UnitIDs   []string
	State     VMState
	ReclaimID string
	CreatedAt time.Time
	UpdatedAt time.Time
	Version   int64
}

// occupies reports whether the VM still stands on its units.
func (v VM) occupies() bool { return v.State == VMRunning || v.State == VMTerminating }

// OperationState is the state of a reclaim operation's termination workflow.
type OperationState string

const (
	// OpPendingStart: committed; its termination workflow has not been started yet.
	OpPendingStart OperationState = "pending-start"
	OpTerminating  OperationState = "terminating"
	OpCompleted    OperationState = "completed"
	OpFailed       OperationState = "failed"
)

// Operation is a committed reclaim and the terminations it owes.
type Operation struct {
	ID            string
	NodeID        string
	ReservationID string
	State         OperationState
	VMIDs         []string
	UnitIDs       []string
	// ExecutionARN is the termination workflow's execution, once one has started working.
	ExecutionARN string
	// Outcomes holds each VM's final outcome, by VM id; the operation ends when every VM of
	// VMIDs has one that is final for the current Attempt (see Final).
	Outcomes map[string]VMOutcome
	// Notices holds what became of each VM's eviction notice to its agent, by VM id (none
	// without a grace period).
	Notices map[string]VMNotice
	// Attempt numbers the operation's workflow executions: 1 (or 0, before any restart) is the
	// first, named by the operation id; a restart by the reconciler or a re-drive moves to the
	// next (see ExecutionName). Writes of an older attempt's late branch are ignored.
	Attempt int
	// Restarts counts the reconciler's restarts since the operation was last driven (by the
	// reclaim or a re-drive); past a bound the operation fails with Reason.
	Restarts int
	// Reason says why an operation failed without an outcome for every VM (its workflow
	// could not be run).
	Reason    string
	CreatedAt time.Time
	UpdatedAt time.Time
	// TerminateAfter is when the workflow may begin terminating: commit time plus the
	// reclaim's grace. Zero on operations committed before grace existed (no grace).
	TerminateAfter time.Time
	// OwnerOrgID is the node's owner at commit, to whom the operation's end is reported.
	OwnerOrgID string
	// Victims are the evicted VMs as they were at commit (buyer org, units), so the notices
	// and reports name them after the VMs themselves have moved to history.
	Victims []Victim
	// Expiring: the store will let the operation expire. Only a completed one should, but
	// failed ones ended before that rule still do (the reconciler keeps them).
	Expiring bool `json:"-"`
	// ReportClaimed: the report claim of its current attempt was taken (see ReportClaims),
	// and is kept (a day): an ended operation with one was reported by the run that ended it.
	ReportClaimed bool `json:"-"`
}

// Victim is a VM a reclaim evicted, as it was at commit.
type Victim struct {
	VMID    string   `dynamodbav:"vmId"` // as operation and audit items store it
	OrgID   string   `dynamodbav:"orgId"`
	UnitIDs []string `dynamodbav:"unitIds"`
}

// Victim returns the operation's record of the evicted VM (only its id for operations
// committed before victims were recorded).
func (o Operation) Victim(vmID string) Victim {
	for _, v := range o.Victims {
		if v.VMID == vmID {
			return v
		}
	}
	return Victim{VMID: vmID}
}

// Outcome of one VM's termination.
type Outcome string

const (
	OutcomeTerminated  Outcome = "terminated"
	OutcomeAlreadyGone Outcome = "already-gone" // the agent no longer knew the VM
	OutcomeFailed      Outcome = "failed"       // gave up after the workflow's last round
	// OutcomeForceEnded: an operator confirmed out of band that the VM is gone (ForceEnd);
	// its agent never did. Counted with already-gone where only counts are shown.
	OutcomeForceEnded Outcome = "force-ended"
)

// VMOutcome is the final outcome of one VM's termination.
type VMOutcome struct {
	Outcome Outcome
	Error   string
	At      time.Time
	// Attempt is the workflow attempt that recorded it. A failure of an earlier attempt is
	// not final for a later one: a re-drive runs that VM again.
	Attempt int
	// Reason is the operator's, on an outcome a force-end recorded.
	Reason string
}

// Ended reports whether every VM of the operation has an outcome final for its attempt.
func (o Operation) Ended() bool {
	for _, vm := range o.VMIDs {
		if _, ok := o.Final(vm); !ok {
			return false
		}
	}
	return true
}

// EndState is the state an operation whose VMs all have outcomes ends in.
func (o Operation) EndState() OperationState {
	for _, out := range o.Outcomes {
		if out.Outcome == OutcomeFailed {
			return OpFailed
		}
	}
	return OpCompleted
}

// OperationView is a reclaim operation as one caller may see it.
type OperationView struct {
	Operation
	// Redacted is set for a caller in the reservation's audience only. The audience may
	// follow the reclaim, but the VMs are other orgs' workloads, the execution ARN names the
	// account and region, and agent errors name node endpoints: VMIDs, Outcomes and
	// ExecutionARN are cleared, and Counts says how many VMs have reached each outcome.
	Redacted bool
	Counts   OutcomeCounts
}

// OutcomeCounts counts an operation's VMs by outcome; Pending have none yet.
type OutcomeCounts struct {
	Pending, Terminated, AlreadyGone, Failed int
}

// redacted returns the audience's view of the operation.
func (o Operation) redacted() *OperationView {
	v := &OperationView{Redacted: true, Counts: o.counts()}
	v.Operation = Operation{
		ID: o.ID, NodeID: o.NodeID, ReservationID: o.ReservationID, State: o.State,
		UnitIDs: o.UnitIDs, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt,
	}
	return v
}

// NodeState is everything a decision about one node needs, read at one point in time.
type NodeState struct {
	Node         Node
	Reservations []Reservation
	VMs          []VM
	// Idempotency is the caller's stored record for the request's Idempotency-Key, if any.
	Idempotency *IdempotencyRecord
}

// Reservation returns the reservation with the id, or nil.
func (s *NodeState) Reservation(id string) *Reservation {
	for i := range s.Reservations {
		if s.Reservations[i].ID == id {
			return &s.Reservations[i]
		}
	}
	return nil
}

// IdempotencyRecord remembers the outcome of a request made with an Idempotency-Key.
type IdempotencyRecord struct {
	Scope       string // who and which key: "<orgId>#<key>"
	NodeID      string
	Fingerprint string // hash of the request; a different request under the same key is refused
	Result      []byte // the JSON-encoded result to replay
	CreatedAt   time.Time
	ExpiresAt   time.Time
}

// AuditRecord is one entry of the append-only audit trail: one per capacity call, whether it
// changed something, was a dry run, or was refused after the caller was identified.
//
// The tags are the audit item's attribute names (shared/dynamo stores the record as it is,
// under its keys): the first layout's names, so items written then decode unchanged. Changing
// one is a migration. Its JSON form, the API's and the text its hash covers, is
// AuditRecordJSON.
type AuditRecord struct {
	ID             string    `dynamodbav:"ID"`
	Time           time.Time `dynamodbav:"Time"`
	RequestID      string    `dynamodbav:"RequestID"`
	ActorKeyID     string    `dynamodbav:"ActorKeyID"`
	CallerOrgID    string    `dynamodbav:"CallerOrgID"`
	ActingFor      string    `dynamodbav:"ActingFor"` // the node owner on whose behalf capacity moved
	Action         string    `dynamodbav:"Action"`
	NodeID         string    `dynamodbav:"NodeID"`
	ReservationID  string    `dynamodbav:"ReservationID"`
	UnitIDs        []string  `dynamodbav:"UnitIDs"`
	DryRun         bool      `dynamodbav:"DryRun"`
	Reason         string    `dynamodbav:"Reason"`
	ReclaimID      string    `dynamodbav:"ReclaimID"`
	Terminated     []string  `dynamodbav:"Terminated"`
	Skipped        []string  `dynamodbav:"Skipped"`
	ReleasedBefore []string  `dynamodbav:"ReleasedBefore"`
	ReleasedAfter  []string  `dynamodbav:"ReleasedAfter"`
	TopologyGen    int64     `dynamodbav:"TopologyGen"`
	VMID           string    `dynamodbav:"VMID"`
	Outcome        string    `dynamodbav:"Outcome"` // "ok" or the error code
	// Via is how the call came: ViaHTTP, ViaEvent, ViaSchedule or ViaDirect.
	Via string `dynamodbav:"via,omitempty"`
	// EventID names the event that carried the call (Via event or schedule).
	EventID string `dynamodbav:"eventId,omitempty"`
	// TargetKeyID names the API key a key-management record is about (key.create,
	// key.revoke); "" on every other record.
	TargetKeyID string `dynamodbav:"targetKeyId,omitempty"`
	// Victims are the VMs a reclaim evicted, with their buyer org and units.
	Victims []Victim `dynamodbav:"victims,omitempty"`
	// Grants is what the key of a key.create record grants, so that a key item changed in
	// place is told from its record; nil on every other record (and on key records written
	// before it existed).
	Grants *KeyGrants `dynamodbav:"grants,omitempty"`
	// Start is set on the one record whose append pinned the chain's start (nil on every
	// other): the pin inside the chain's hashes, so a head that loses or changes its pin no
	// longer matches the chain.
	Start *ChainStart `dynamodbav:"start,omitempty"`
	// Seq numbers the record in its chain (1, 2, 3...); 0 for a record outside any chain.
	Seq int64 `dynamodbav:"seq,omitempty"`
	// PrevHash is the Hash of record Seq-1 ("" for Seq 1); Hash covers the record's content
	// with PrevHash and Seq (see HashAuditRecord).
	PrevHash string `dynamodbav:"prevHash,omitempty"`
	Hash     string `dynamodbav:"hash,omitempty"`
}

// How a call came (AuditRecord.Via, RequestMeta.Via).
const (
	ViaHTTP     = "http"
	ViaEvent    = "event"
	ViaSchedule = "schedule"
	// ViaDirect: written with AWS credentials straight to the tables, not through the API
	// (the first operator key, capacityctl keys create --bootstrap).
	ViaDirect = "direct"
)

// Audit actions.
const (
	ActionReclaim = "reclaim"
	ActionRelease = "release"
	ActionPlace   = "place"

	// Operator lifecycle (operator.go).
	ActionNodePut             = "node.put"
	ActionReservationCreate   = "reservation.create"
	ActionReservationCancel   = "reservation.cancel"
	ActionReservationReaffirm = "reservation.reaffirm"
	ActionTopologySet         = "topology.set"
	ActionAgentKeyRotate      = "node.agent-key.rotate"
	ActionAgentKeyOverlapEnd  = "node.agent-key.end-overlap"
)
