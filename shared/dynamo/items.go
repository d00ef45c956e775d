package dynamo

import (
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// Item layout of the state table (single-table design). A decision reads its node's live state
// only, with one Query of the decision partition; what a decision never needs (terminated VMs,
// reclaim operations and their outcomes) lives under keys of its own on the same node, and
// expires by TTL:
//
//	pk                      sk            item
//	NODE#<nodeId>           DIR           the node's entry in the directory of nodes (gsi2: NODES);
//	                                      a copy of its owner, units and topology generation
//	NODE#<nodeId>           IDEM#<scope>  an Idempotency-Key record (TTL 24 h); sorts before NODE
//	NODE#<nodeId>           MEMBER#<org>  org was named the owner or in a reservation's orgs (gsi2:
//	                                      ORG#<org>#NODES); never removed, checked when read
//	NODE#<nodeId>           NODE          the node and ledger: every capacity write bumps its Version
//	NODE#<nodeId>           NODE#AGENTKEY the node's agent key resealed by the terminating function
//	                                      (resealed.go): written by it alone, read by it alone
//	NODE#<nodeId>           RES#<id>      a reservation
//	NODE#<nodeId>           VM#<id>       a live VM (running or terminating)
//	NODE#<nodeId>#HIST      VM#<id>       a terminated VM (TTL: terminated + retention)
//	NODE#<nodeId>#OP#<id>   OP            a reclaim operation (gsi1: OPSTATE#<state>#<shard>, for the
//	                                      reconciler, see opStatePK;
//	                                      gsi2: its reservation's list, by creation;
//	                                      TTL once completed: end + retention; none while live or
//	                                      failed, when VMs of it may still be terminating)
//	NODE#<nodeId>#OP#<id>   VM#<vm>       the final outcome of one VM of that operation (TTL:
//	                                      recorded + retention, none for a failure, extended when
//	                                      a re-driven operation completes)
//
// Every key starts with its node's NODE#<nodeId>, so no write ever names two nodes' items.
//
// The audit table: pk NODE#<nodeId> (APIKEYS for key management), sk SEQ#<seq, 20 digits>
// for a record of the node's hash chain, <time>#<auditId> for one outside it (written before
// chains existed, or for a node that does not exist); pk NODE#<nodeId>#CALLS for the node's
// calls chain; resKey NODE#<nodeId>#RES#<id> on records about a reservation (the byReservation
// index), ...#CALLS on those of the calls chain (reservationTrail); append-only. The chain's head is the node
// item's AuditSeq and AuditHead (for keys: the keys table's item APIKEYS/AUDITHEAD).
//
// The keys table: pk APIKEY#<sha256>, sk APIKEY: an API key, by the hash of its secret;
// pk KEYID#<keyId>, sk KEYID: the hash of the key with that id (revoke by id); pk
// KEYIDEM#<scope>, sk IDEM: the Idempotency-Key record of a key creation (never the secret).
//
// Item structs name every stored attribute explicitly (tags), apart from the domain's Go
// field names, and expressions use the attr* constants: renaming a domain field changes no
// stored name. The domain types stored whole (the audit record with its victims, grants and
// start; rate limits) carry their attribute names as tags of their own. The names are the ones the first layout stored (the Go field names then), so
// items written before decode unchanged; a golden test holds them.
const (
	typeNode        = "node"
	typeReservation = "reservation"
	typeVM          = "vm"
	typeOperation   = "operation"
	typeOutcome     = "outcome"
	typeIdempotency = "idempotency"
	typeAPIKey      = "apikey"
	typeAudit       = "audit"

	skNode           = "NODE"
	skOperation      = "OP"
	skAPIKey         = "APIKEY"
	prefixReserv     = "RES#"
	prefixVM         = "VM#"
	prefixIdempotent = "IDEM#"
	prefixSeq        = "SEQ#" // a chained audit record

	// legacyPrefixOperation: the first layout kept operations (OP#<id>) and outcomes
	// (OP#<id>#VM#<vm>) in the decision partition; only the migration still reads them.
	legacyPrefixOperation = "OP#"
)

// Attribute names used in expressions (and in the item structs' tags).
const (
	attrPK              = "pk"
	attrSK              = "sk"
	attrType            = "type"
	attrVersion         = "Version"
	attrState           = "State"
	attrReclaimID       = "ReclaimID"
	attrUpdatedAt       = "UpdatedAt"
	attrReleasedUnitIDs = "ReleasedUnitIDs"
	attrExecutionARN    = "ExecutionARN"
	attrAttempt         = "Attempt"
	attrRestarts        = "Restarts"
	attrReason          = "Reason"
	attrOutcome         = "Outcome"
	attrExpiresAt       = "expiresAt" // table.TTLAttribute (a test holds them equal)
	attrGSI1PK          = "gsi1pk"    // table.ByStatePartitionKey
	attrGSI1SK          = "gsi1sk"    // table.ByStateSortKey
)

func nodePK(nodeID string) string { return "NODE#" + nodeID }

// histPK is the partition of a node's terminated VMs.
func histPK(nodeID string) string { return nodePK(nodeID) + "#HIST" }

// opPK is the partition of one reclaim operation and its outcomes.
func opPK(nodeID, opID string) string { return nodePK(nodeID) + "#OP#" + opID }

func apiKeyPK(hash string) string { return "APIKEY#" + hash }

// nodeOfPK returns the node a state-table partition key belongs to ("" if none).
func nodeOfPK(pk string) string {
	rest, ok := strings.CutPrefix(pk, "NODE#")
	if !ok {
		return ""
	}
	node, _, _ := strings.Cut(rest, "#") // ids never hold '#' (capacity.ValidID)
	return node
}

func expiry(t time.Time) int64 { return t.Unix() }

type nodeItem struct {
	PK            string   `dynamodbav:"pk"`
	SK            string   `dynamodbav:"sk"`
	Type          string   `dynamodbav:"type"`
	ID            string   `dynamodbav:"ID"`
	OwnerOrgID    string   `dynamodbav:"OwnerOrgID"`
	TopologyGen   int64    `dynamodbav:"TopologyGen"`
	AgentEndpoint string   `dynamodbav:"AgentEndpoint"`
	UnitIDs       []string `dynamodbav:"UnitIDs"`
	Version       int64    `dynamodbav:"Version"`
	// The head of the node's audit chain (absent until its first chained record), and the
	// pin of its start (absent on a chain begun before pins, until its next append).
	AuditSeq         int64  `dynamodbav:"AuditSeq,omitempty"`
	AuditHead        string `dynamodbav:"AuditHead,omitempty"`
	AuditStartCount  int64  `dynamodbav:"AuditStartCount,omitempty"`
	AuditStartDigest string `dynamodbav:"AuditStartDigest,omitempty"`
	// The agent's key, sealed, its generation and the previous one's (absent at generation 0:
	// the key derived from the agent master secret).
	AgentKeyGen       int64      `dynamodbav:"AgentKeyGen,omitempty"`
	AgentKey          []byte     `dynamodbav:"AgentKey,omitempty"`
	PrevAgentKey      []byte     `dynamodbav:"PrevAgentKey,omitempty"`
	AgentKeyRotatedAt *time.Time `dynamodbav:"AgentKeyRotatedAt,omitempty"`
	// The generation whose overlap an operator ended early (absent: none).
	AgentKeyOverlapEndedGen int64 `dynamodbav:"AgentKeyOverlapEndedGen,omitempty"`
}

func newNodeItem(n capacity.Node) nodeItem {
	return nodeItem{
		PK: nodePK(n.ID), SK: skNode, Type: typeNode,
		ID: n.ID, OwnerOrgID: n.OwnerOrgID, TopologyGen: n.TopologyGen, AgentEndpoint: n.AgentEndpoint,
		UnitIDs: n.UnitIDs, Version: n.Version, AuditSeq: n.AuditHead.Seq, AuditHead: n.AuditHead.Hash,
		AuditStartCount: n.AuditHead.Start.Unchained, AuditStartDigest: n.AuditHead.Start.Digest,
		AgentKeyGen: n.AgentKeyGen, AgentKey: n.AgentKey, PrevAgentKey: n.PrevAgentKey, AgentKeyRotatedAt: optTime(n.AgentKeyRotatedAt),
		AgentKeyOverlapEndedGen: n.AgentKeyOverlapEndedGen,
	}
}

// optTime is t, or nil for the zero time (left out of the item).
func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (i nodeItem) node() capacity.Node {
	return capacity.Node{
		ID: i.ID, OwnerOrgID: i.OwnerOrgID, TopologyGen: i.TopologyGen, AgentEndpoint: i.AgentEndpoint,
		UnitIDs: i.UnitIDs, Version: i.Version, AuditHead: capacity.AuditHead{Seq: i.AuditSeq, Hash: i.AuditHead,
			Start: capacity.ChainStart{Unchained: i.AuditStartCount, Digest: i.AuditStartDigest}},
		AgentKeyGen: i.AgentKeyGen, AgentKey: i.AgentKey, PrevAgentKey: i.PrevAgentKey, AgentKeyRotatedAt: derefTime(i.AgentKeyRotatedAt),
		AgentKeyOverlapEndedGen: i.AgentKeyOverlapEndedGen,
	}
}

// derefTime is *t, or the zero time for nil.
func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

type reservationItem struct {
	PK              string     `dynamodbav:"pk"`
	SK              string     `dynamodbav:"sk"`
	Type            string     `dynamodbav:"type"`
	ID              string     `dynamodbav:"ID"`
	NodeID          string     `dynamodbav:"NodeID"`
	AllowedOrgIDs   []string   `dynamodbav:"AllowedOrgIDs"`
	ReservedUnitIDs []string   `dynamodbav:"ReservedUnitIDs"`
	ReleasedUnitIDs []string   `dynamodbav:"ReleasedUnitIDs"`
	ManagingOrgIDs  []string   `dynamodbav:"ManagingOrgIDs"`
	StartsAt        time.Time  `dynamodbav:"StartsAt"`
	EndsAt          *time.Time `dynamodbav:"EndsAt"`
	Status          string     `dynamodbav:"Status"`
	ContractRef     string     `dynamodbav:"ContractRef"`
	CreatedAt       time.Time  `dynamodbav:"CreatedAt"`
	UpdatedAt       time.Time  `dynamodbav:"UpdatedAt"`
	Reason          string     `dynamodbav:"Reason"`
	TopologyGen     int64      `dynamodbav:"TopologyGen"`
	Version         int64      `dynamodbav:"Version"`
}

func newReservationItem(r capacity.Reservation) reservationItem {
	return reservationItem{
		PK: nodePK(r.NodeID), SK: prefixReserv + r.ID, Type: typeReservation,
		ID: r.ID, NodeID: r.NodeID, AllowedOrgIDs: r.AllowedOrgIDs, ReservedUnitIDs: r.ReservedUnitIDs,
		ReleasedUnitIDs: r.ReleasedUnitIDs, ManagingOrgIDs: r.ManagingOrgIDs, StartsAt: r.StartsAt,
		EndsAt: r.EndsAt, Status: string(r.Status), ContractRef: r.ContractRef, CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, Reason: r.Reason, TopologyGen: r.TopologyGen, Version: r.Version,
	}
}

func (i reservationItem) reservation() capacity.Reservation {
	return capacity.Reservation{
		ID: i.ID, NodeID: i.NodeID, AllowedOrgIDs: i.AllowedOrgIDs, ReservedUnitIDs: i.ReservedUnitIDs,
		ReleasedUnitIDs: i.ReleasedUnitIDs, ManagingOrgIDs: i.ManagingOrgIDs, StartsAt: i.StartsAt,
		EndsAt: i.EndsAt, Status: capacity.Status(i.Status), ContractRef: i.ContractRef, CreatedAt: i.CreatedAt,
		UpdatedAt: i.UpdatedAt, Reason: i.Reason, TopologyGen: i.TopologyGen, Version: i.Version,
	}
}

// vmItem is a live VM in the decision partition or, with ExpiresAt, a terminated one in the
// node's history.
type vmItem struct {
	PK        string    `dynamodbav:"pk"`
	SK        string    `dynamodbav:"sk"`
	Type      string    `dynamodbav:"type"`
	ID        string    `dynamodbav:"ID"`
	NodeID    string    `dynamodbav:"NodeID"`
	OrgID     string    `dynamodbav:"OrgID"`
	Tier      string    `dynamodbav:"Tier"`
	UnitIDs   []string  `dynamodbav:"UnitIDs"`
	State     string    `dynamodbav:"State"`
	ReclaimID string    `dynamodbav:"ReclaimID"`
	CreatedAt time.Time `dynamodbav:"CreatedAt"`
	UpdatedAt time.Time `dynamodbav:"UpdatedAt"`
	Version   int64     `dynamodbav:"Version"`
	ExpiresAt int64     `dynamodbav:"expiresAt,omitempty"`
}

func newVMItem(v capacity.VM) vmItem {
	return vmItem{
		PK: nodePK(v.NodeID), SK: prefixVM + v.ID, Type: typeVM,
		ID: v.ID, NodeID: v.NodeID, OrgID: v.OrgID, Tier: string(v.Tier), UnitIDs: v.UnitIDs,
		State: string(v.State), ReclaimID: v.ReclaimID, CreatedAt: v.CreatedAt, UpdatedAt: v.UpdatedAt,
		Version: v.Version,
	}
}

// newHistoryItem is a terminated VM in its node's history, kept for the retention.
func newHistoryItem(v capacity.VM, retention time.Duration) vmItem {
	it := newVMItem(v)
	it.PK, it.ExpiresAt = histPK(v.NodeID), expiry(v.UpdatedAt.Add(retention))
	return it
}

func (i vmItem) vm() capacity.VM {
	return capacity.VM{
		ID: i.ID, NodeID: i.NodeID, OrgID: i.OrgID, Tier: capacity.Tier(i.Tier), UnitIDs: i.UnitIDs,
		State: capacity.VMState(i.State), ReclaimID: i.ReclaimID, CreatedAt: i.CreatedAt, UpdatedAt: i.UpdatedAt,
		Version: i.Version,
	}
}

type operationItem struct {
	PK     string `dynamodbav:"pk"`
	SK     string `dynamodbav:"sk"`
	Type   string `dynamodbav:"type"`
	GSI1PK string `dynamodbav:"gsi1pk"`
	GSI1SK string `dynamodbav:"gsi1sk"`
	// GSI2PK and GSI2SK place it in its reservation's list (absent on operations committed
	// before the list existed, until capacity-migrate indexes them).
	GSI2PK        string    `dynamodbav:"gsi2pk,omitempty"`
	GSI2SK        string    `dynamodbav:"gsi2sk,omitempty"`
	ID            string    `dynamodbav:"ID"`
	NodeID        string    `dynamodbav:"NodeID"`
	ReservationID string    `dynamodbav:"ReservationID"`
	State         string    `dynamodbav:"State"`
	VMIDs         []string  `dynamodbav:"VMIDs"`
	UnitIDs       []string  `dynamodbav:"UnitIDs"`
	ExecutionARN  string    `dynamodbav:"ExecutionARN"`
	Attempt       int       `dynamodbav:"Attempt"`
	Restarts      int       `dynamodbav:"Restarts"`
	Reason        string    `dynamodbav:"Reason"`
	CreatedAt     time.Time `dynamodbav:"CreatedAt"`
	UpdatedAt     time.Time `dynamodbav:"UpdatedAt"`
	// ExpiresAt is set when the operation ends: GET answers for the retention after that.
	ExpiresAt int64 `dynamodbav:"expiresAt,omitempty"`
	// Written at commit; absent from operations committed before grace and events existed.
	TerminateAfter *time.Time `dynamodbav:"terminateAfter,omitempty"`
	OwnerOrgID     string     `dynamodbav:"ownerOrgId,omitempty"`
	// Victims are the evicted VMs as they were at commit (capacity.Victim's tags).
	Victims []capacity.Victim `dynamodbav:"victims,omitempty"`
	// Outcomes are the VMs' outcomes as the operation's end read them, folded into it: the
	// outcome items expire a day after they are recorded (a failure's is kept), this copy
	// with the operation.
	Outcomes map[string]foldedOutcome `dynamodbav:"vms,omitempty"`
}

// foldedOutcome is a VM's outcome folded into its operation, with short names: about 60 B.
type foldedOutcome struct {
	Outcome string    `dynamodbav:"o"`
	At      time.Time `dynamodbav:"at"`
	Attempt int       `dynamodbav:"n,omitempty"`
	Error   string    `dynamodbav:"e,omitempty"`
	Reason  string    `dynamodbav:"r,omitempty"`
}

func foldOutcomes(outcomes map[string]capacity.VMOutcome) map[string]foldedOutcome {
	out := make(map[string]foldedOutcome, len(outcomes))
	for vm, o := range outcomes {
		out[vm] = foldedOutcome{Outcome: string(o.Outcome), At: o.At, Attempt: o.Attempt, Error: o.Error, Reason: o.Reason}
	}
	return out
}

// outcomeKept is how long a success's outcome item stays after it was recorded: the
// operation's end, minutes later, folds it into the operation item, which stays for the
// retention.
const outcomeKept = 24 * time.Hour

// newOperationItem is the operation without its outcomes, which are items of their own.
func newOperationItem(o capacity.Operation) operationItem {
	it := operationItem{
		PK: opPK(o.NodeID, o.ID), SK: skOperation, Type: typeOperation,
		GSI1PK: opStatePK(o.State, o.ID), GSI1SK: opStateSK(o),
		GSI2PK: opListPK(o.NodeID, o.ReservationID), GSI2SK: opListSK(o.CreatedAt, o.ID),
		ID: o.ID, NodeID: o.NodeID, ReservationID: o.ReservationID, State: string(o.State),
		VMIDs: o.VMIDs, UnitIDs: o.UnitIDs, ExecutionARN: o.ExecutionARN, Attempt: o.Attempt,
		Restarts: o.Restarts, Reason: o.Reason, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt,
		OwnerOrgID: o.OwnerOrgID, Victims: o.Victims,
	}
	if !o.TerminateAfter.IsZero() {
		t := o.TerminateAfter.UTC()
		it.TerminateAfter = &t
	}
	return it
}

func (i operationItem) operation() capacity.Operation {
	o := capacity.Operation{
		ID: i.ID, NodeID: i.NodeID, ReservationID: i.ReservationID, State: capacity.OperationState(i.State),
		VMIDs: i.VMIDs, UnitIDs: i.UnitIDs, ExecutionARN: i.ExecutionARN, Attempt: i.Attempt,
		Restarts: i.Restarts, Reason: i.Reason, CreatedAt: i.CreatedAt, UpdatedAt: i.UpdatedAt,
		OwnerOrgID: i.OwnerOrgID, Victims: i.Victims,
	}
	if i.TerminateAfter != nil {
		o.TerminateAfter = *i.TerminateAfter
	}
	o.Expiring = i.ExpiresAt != 0
	if len(i.Outcomes) > 0 {
		o.Outcomes = make(map[string]capacity.VMOutcome, len(i.Outcomes))
		for vm, f := range i.Outcomes {
			o.Outcomes[vm] = capacity.VMOutcome{Outcome: capacity.Outcome(f.Outcome), At: f.At, Attempt: f.Attempt, Error: f.Error, Reason: f.Reason}
		}
	}
	return o
}

// outcomeItem is one VM's final outcome in a reclaim operation, in the operation's partition.
type outcomeItem struct {
	PK        string    `dynamodbav:"pk"`
	SK        string    `dynamodbav:"sk"`
	Type      string    `dynamodbav:"type"`
	ReclaimID string    `dynamodbav:"ReclaimID"`
	VMID      string    `dynamodbav:"VMID"`
	Outcome   string    `dynamodbav:"Outcome"`
	Error     string    `dynamodbav:"Error"`
	At        time.Time `dynamodbav:"At"`
	Attempt   int       `dynamodbav:"Attempt"`
	ExpiresAt int64     `dynamodbav:"expiresAt,omitempty"`
	Reason    string    `dynamodbav:"Reason,omitempty"` // a force-end's
	// The VM's eviction notice as the outcome's writer read it (grace > 0): its notice item
	// expires a day after the grace, this copy with the outcome.
	NoticeState    string     `dynamodbav:"NoticeState,omitempty"`
	NoticeError    string     `dynamodbav:"NoticeError,omitempty"`
	NoticeAt       *time.Time `dynamodbav:"NoticeAt,omitempty"`
	TerminateAfter *time.Time `dynamodbav:"TerminateAfter,omitempty"`
}

func outcomeKey(op capacity.Operation, vmID string) map[string]types.AttributeValue {
	return itemKey(opPK(op.NodeID, op.ID), prefixVM+vmID)
}

// newOutcomeItem is a VM's outcome. A success expires a day after it was recorded: by then
// its operation's end has folded it into the operation item. A failure has no expiry: its VM
// stays terminating and its operation never expires while it does, so neither does the error
// that says why (a success replacing it sets one).
func newOutcomeItem(op capacity.Operation, vmID string, o capacity.VMOutcome, retention time.Duration) outcomeItem {
	it := outcomeItem{
		PK: opPK(op.NodeID, op.ID), SK: prefixVM + vmID, Type: typeOutcome,
		ReclaimID: op.ID, VMID: vmID, Outcome: string(o.Outcome), Error: o.Error, At: o.At, Attempt: o.Attempt,
		Reason: o.Reason,
	}
	if o.Outcome != capacity.OutcomeFailed {
		it.ExpiresAt = expiry(o.At.Add(outcomeKept))
	}
	if n, ok := op.Notices[vmID]; ok {
		at, after := n.At, n.TerminateAfter
		it.NoticeState, it.NoticeError, it.NoticeAt, it.TerminateAfter = string(n.State), n.Error, &at, &after
	}
	return it
}

func (i outcomeItem) outcome() capacity.VMOutcome {
	return capacity.VMOutcome{Outcome: capacity.Outcome(i.Outcome), Error: i.Error, At: i.At, Attempt: i.Attempt, Reason: i.Reason}
}

// notice is the copy of the VM's notice the outcome carries, if any.
func (i outcomeItem) notice() (capacity.VMNotice, bool) {
	if i.NoticeState == "" {
		return capacity.VMNotice{}, false
	}
	n := capacity.VMNotice{State: capacity.NoticeState(i.NoticeState), Error: i.NoticeError}
	if i.NoticeAt != nil {
		n.At = *i.NoticeAt
	}
	if i.TerminateAfter != nil {
		n.TerminateAfter = *i.TerminateAfter
	}
	return n, true
}

type idempotencyItem struct {
	PK          string    `dynamodbav:"pk"`
	SK          string    `dynamodbav:"sk"`
	Type        string    `dynamodbav:"type"`
	Scope       string    `dynamodbav:"Scope"`
	NodeID      string    `dynamodbav:"NodeID"`
	Fingerprint string    `dynamodbav:"Fingerprint"`
	Result      []byte    `dynamodbav:"Result"`
	CreatedAt   time.Time `dynamodbav:"CreatedAt"`
	ExpiresAt   int64     `dynamodbav:"expiresAt"` // epoch seconds: table.TTLAttribute
}

func idempotencyKey(nodeID, scope string) map[string]types.AttributeValue {
	return itemKey(nodePK(nodeID), prefixIdempotent+scope)
}

func newIdempotencyItem(r capacity.IdempotencyRecord) idempotencyItem {
	return idempotencyItem{
		PK: nodePK(r.NodeID), SK: prefixIdempotent + r.Scope, Type: typeIdempotency,
		Scope: r.Scope, NodeID: r.NodeID, Fingerprint: r.Fingerprint, Result: r.Result,
		CreatedAt: r.CreatedAt, ExpiresAt: expiry(r.ExpiresAt),
	}
}

func (i idempotencyItem) record() capacity.IdempotencyRecord {
	return capacity.IdempotencyRecord{
		Scope: i.Scope, NodeID: i.NodeID, Fingerprint: i.Fingerprint, Result: i.Result,
		CreatedAt: i.CreatedAt, ExpiresAt: time.Unix(i.ExpiresAt, 0).UTC(),
	}
}

type apiKeyItem struct {
	PK          string     `dynamodbav:"pk"`
	SK          string     `dynamodbav:"sk"`
	Type        string     `dynamodbav:"type"`
	KeyID       string     `dynamodbav:"KeyID"`
	Hash        string     `dynamodbav:"Hash"`
	OrgID       string     `dynamodbav:"OrgID"`
	Permissions []string   `dynamodbav:"Permissions"`
	Operator    bool       `dynamodbav:"Operator"`
	Revoked     bool       `dynamodbav:"Revoked"`
	ExpiresAt   *time.Time `dynamodbav:"ExpiresAt"`
	// Added with key management; absent on keys provisioned before.
	Description    string     `dynamodbav:"Description,omitempty"`
	CreatedAt      *time.Time `dynamodbav:"CreatedAt,omitempty"`
	CreatedByKeyID string     `dynamodbav:"CreatedByKeyID,omitempty"`
	RevokedAt      *time.Time `dynamodbav:"RevokedAt,omitempty"`
	// LastUsedAt is epoch seconds, a number so that TouchKey's condition compares it.
	LastUsedAt int64 `dynamodbav:"LastUsedAt,omitempty"`
	// RateLimit is the key's own rate limit; absent when it has none (the environment's).
	RateLimit *capacity.RateLimit `dynamodbav:"RateLimit,omitempty"`
}

func newAPIKeyItem(k capacity.APIKey) apiKeyItem {
	it := apiKeyItem{
		PK: apiKeyPK(k.Hash), SK: skAPIKey, Type: typeAPIKey,
		KeyID: k.KeyID, Hash: k.Hash, OrgID: k.OrgID, Permissions: k.Permissions,
		Operator: k.Operator, Revoked: k.Revoked, ExpiresAt: k.ExpiresAt,
		Description: k.Description, CreatedByKeyID: k.CreatedByKeyID, RevokedAt: k.RevokedAt,
		RateLimit: k.RateLimit,
	}
	if !k.CreatedAt.IsZero() {
		at := k.CreatedAt
		it.CreatedAt = &at
	}
	if k.LastUsedAt != nil {
		it.LastUsedAt = k.LastUsedAt.Unix()
	}
	return it
}

func (i apiKeyItem) apiKey() capacity.APIKey {
	k := capacity.APIKey{
		KeyID: i.KeyID, Hash: i.Hash, OrgID: i.OrgID, Permissions: i.Permissions,
		Operator: i.Operator, Revoked: i.Revoked, ExpiresAt: i.ExpiresAt,
		Description: i.Description, CreatedByKeyID: i.CreatedByKeyID, RevokedAt: i.RevokedAt,
		RateLimit: i.RateLimit,
	}
	if i.CreatedAt != nil {
		k.CreatedAt = *i.CreatedAt
	}
	if i.LastUsedAt != 0 {
		at := time.Unix(i.LastUsedAt, 0).UTC()
		k.LastUsedAt = &at
	}
	return k
}

// The byState index keys operations by state and shard, ordered by the time each entered
// its state: OPSTATE#<state>#<shard>. Without the shard every reclaim of a burst wrote the
// same few keys at their newest end, and one key takes at most a partition's 1,000 WCU/s
// (the time sort key rises, so DynamoDB cannot split it for heat). Readers query every
// shard and merge (OperationsInState). docs/architecture.md, "The byState index".
func opStatePK(state capacity.OperationState, opID string) string {
	return opStateShardPK(state, opStateShard(opID))
}

// OpStateShards is how many keys each state's operations spread over: a 10,000-reclaim burst
// within 10 s (1,000 a second, each putting and later deleting its index entry under a state,
// up to 5 WCU each for a 64-victim operation) gives each key about 310 WCU/s, under a third
// of a partition's 1,000. Changing it moves every operation's key: capacity-migrate re-keys
// them, and until it has, readers would miss the moved shards.
const OpStateShards = 32

// opStateShard spreads operations evenly and stably: FNV-1a of the operation id.
func opStateShard(opID string) int {
	h := fnv.New32a()
	h.Write([]byte(opID))
	return int(h.Sum32() % OpStateShards)
}

func opStateShardPK(state capacity.OperationState, shard int) string {
	return fmt.Sprintf("%s%s#%02d", opStatePrefix, state, shard)
}

// legacyOpStatePK is the unsharded key of operations written before the shards (read as one
// more shard until capacity-migrate has re-keyed them).
func legacyOpStatePK(state capacity.OperationState) string { return opStatePrefix + string(state) }

const opStatePrefix = "OPSTATE#"

func opStateSK(o capacity.Operation) string { return opStateSKAt(o.CreatedAt, o.ID) }

// opStateSKAt orders an operation in the byState index from the time it entered its state
// (created, restarted or re-driven), so the reconciler gives each start its grace period.
func opStateSKAt(t time.Time, opID string) string {
	return t.UTC().Format(time.RFC3339Nano) + "#" + opID
}
