package dynamo

import (
	"fmt"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// auditItem is an audit record as the audit table stores it: the record itself, whose tags
// name its attributes (capacity.AuditRecord), under the item's keys.
type auditItem struct {
	PK   string `dynamodbav:"pk"`
	SK   string `dynamodbav:"sk"`
	Type string `dynamodbav:"type"`
	capacity.AuditRecord
	// ResKey keys the byReservation index (table.AuditByReservationKey), on records about a
	// reservation only (reservationTrail).
	ResKey string `dynamodbav:"resKey,omitempty"`
}

// newAuditItem is the record in its node's audit partition: a chained record (Seq > 0) under
// SEQ#<seq>, an unchained one under <time>#<id> (which sorts before SEQ#).
func newAuditItem(a capacity.AuditRecord) auditItem {
	return newAuditItemIn(nodePK(a.NodeID), a)
}

func auditSK(a capacity.AuditRecord) string {
	if a.Seq > 0 {
		return seqSK(a.Seq)
	}
	return a.Time.UTC().Format(time.RFC3339Nano) + "#" + a.ID
}

// seqSK is the sort key of the chained record with the seq.
func seqSK(seq int64) string { return fmt.Sprintf("%s%020d", prefixSeq, seq) }

// reservationTrail is the byReservation index partition of a reservation's records on one of
// its node's chains: NODE#<nodeId>#RES#<id> for its changes, ...#CALLS for the calls about it
// that changed nothing (dry runs, refusals, replays). Apart, so that neither list's order nor
// its cursor mixes the two chains' seqs. Calls records written before they were apart carry
// the changes key (docs/compatibility.md).
func reservationTrail(nodeID, reservationID string, chain capacity.NodeChain) string {
	key := nodePK(nodeID) + "#RES#" + reservationID
	if chain == capacity.ChainCalls {
		key += "#CALLS"
	}
	return key
}

// newAuditItemIn is the record in audit partition pk: its node's changes chain (nodePK), its
// calls chain (callsPK), or the keys chain.
func newAuditItemIn(pk string, a capacity.AuditRecord) auditItem {
	it := auditItem{PK: pk, SK: auditSK(a), Type: typeAudit, AuditRecord: a}
	if a.ReservationID != "" {
		chain := capacity.ChainChanges
		if pk == callsPK(a.NodeID) {
			chain = capacity.ChainCalls
		}
		it.ResKey = reservationTrail(a.NodeID, a.ReservationID, chain)
	}
	return it
}

func (i auditItem) record() capacity.AuditRecord { return i.AuditRecord }
