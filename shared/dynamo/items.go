package dynamo

import (
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// Item layout of the state table (single-table design). Everything a capacity decision reads
// lives in its node's partition, so one Query reads it:
//
//	pk                 sk              item
//	NODE#<nodeId>      NODE            the node and ledger: every capacity write bumps its Version
//	NODE#<nodeId>      RES#<id>        a reservation
//	NODE#<nodeId>      VM#<id>         a VM
//	NODE#<nodeId>      OP#<id>         a reclaim operation (gsi1: its state, for the reconciler)
//	NODE#<nodeId>      OP#<id>#VM#<vm> the final outcome of one VM of that operation
//	NODE#<nodeId>      IDEM#<scope>    an Idempotency-Key record (TTL 24 h)
//
// The audit table: pk NODE#<nodeId>, sk <time>#<auditId>; append-only.
//
// The keys table: pk APIKEY#<sha256>, sk APIKEY: an API key, by the hash of its secret.
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
	skAPIKey         = "APIKEY"
	prefixReserv     = "RES#"
	prefixVM         = "VM#"
	prefixOperation  = "OP#"
	prefixIdempotent = "IDEM#"
)

func nodePK(nodeID string) string { return "NODE#" + nodeID }
func apiKeyPK(hash string) string { return "APIKEY#" + hash }

// key is the primary key every item carries, plus its type for readers of the raw table.
type key struct {
	PK   string `dynamodbav:"pk"`
	SK   string `dynamodbav:"sk"`
	Type string `dynamodbav:"type"`
}

type nodeItem struct {
	key
	capacity.Node
}

type reservationItem struct {
	key
	capacity.Reservation
}

type vmItem struct {
	key
	capacity.VM
}

type operationItem struct {
	key
	GSI1PK string `dynamodbav:"gsi1pk"`
	GSI1SK string `dynamodbav:"gsi1sk"`
	capacity.Operation
}

// outcomeItem is one VM's final outcome in a reclaim operation, keyed under it.
type outcomeItem struct {
	key
	ReclaimID string
	VMID      string
	capacity.VMOutcome
}

func newOutcomeItem(op capacity.Operation, vmID string, o capacity.VMOutcome) outcomeItem {
	return outcomeItem{key{nodePK(op.NodeID), prefixOperation + op.ID + "#VM#" + vmID, typeOutcome}, op.ID, vmID, o}
}

type idempotencyItem struct {
	key
	Scope       string
	NodeID      string
	Fingerprint string
	Result      []byte
	CreatedAt   time.Time
	ExpiresAt   int64 `dynamodbav:"expiresAt"` // epoch seconds: table.TTLAttribute (a test holds them equal)
}

type apiKeyItem struct {
	key
	capacity.APIKey
}

type auditItem struct {
	key
	capacity.AuditRecord
}

func newNodeItem(n capacity.Node) nodeItem {
	return nodeItem{key{nodePK(n.ID), skNode, typeNode}, n}
}

func newReservationItem(r capacity.Reservation) reservationItem {
	return reservationItem{key{nodePK(r.NodeID), prefixReserv + r.ID, typeReservation}, r}
}

func newVMItem(v capacity.VM) vmItem {
	return vmItem{key{nodePK(v.NodeID), prefixVM + v.ID, typeVM}, v}
}

func newOperationItem(o capacity.Operation) operationItem {
	o.Outcomes = nil // outcomes are items of their own
	return operationItem{
		key:    key{nodePK(o.NodeID), prefixOperation + o.ID, typeOperation},
		GSI1PK: opStatePK(o.State), GSI1SK: opStateSK(o),
		Operation: o,
	}
}

func newIdempotencyItem(r capacity.IdempotencyRecord) idempotencyItem {
	return idempotencyItem{
		key:   key{nodePK(r.NodeID), prefixIdempotent + r.Scope, typeIdempotency},
		Scope: r.Scope, NodeID: r.NodeID, Fingerprint: r.Fingerprint, Result: r.Result,
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt.Unix(),
	}
}

func (i idempotencyItem) record() capacity.IdempotencyRecord {
	return capacity.IdempotencyRecord{
		Scope: i.Scope, NodeID: i.NodeID, Fingerprint: i.Fingerprint, Result: i.Result,
		CreatedAt: i.CreatedAt, ExpiresAt: time.Unix(i.ExpiresAt, 0).UTC(),
	}
}

func newAuditItem(a capacity.AuditRecord) auditItem {
	return auditItem{
		key:         key{nodePK(a.NodeID), a.Time.UTC().Format(time.RFC3339Nano) + "#" + a.ID, typeAudit},
		AuditRecord: a,
	}
}

func newAPIKeyItem(k capacity.APIKey) apiKeyItem {
	return apiKeyItem{key{apiKeyPK(k.Hash), skAPIKey, typeAPIKey}, k}
}

// The byState index keys operations by state, ordered by creation.
func opStatePK(state capacity.OperationState) string { return "OPSTATE#" + string(state) }

func opStateSK(o capacity.Operation) string { return opStateSKAt(o.CreatedAt, o.ID) }

// opStateSKAt orders an operation in the byState index from the time it entered its state
// (created, restarted or re-driven), so the reconciler gives each start its grace period.
func opStateSKAt(t time.Time, opID string) string {
	return t.UTC().Format(time.RFC3339Nano) + "#" + opID
}
