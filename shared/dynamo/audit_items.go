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
	// reservation only.
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

func auditResKey(a capacity.AuditRecord) string {
	if a.ReservationID == "" {
		return ""
	}
	return nodePK(a.NodeID) + "#RES#" + a.ReservationID
}

func newAuditItemIn(pk string, a capacity.AuditRecord) auditItem {
	return auditItem{PK: pk, SK: auditSK(a), Type: typeAudit, AuditRecord: a, ResKey: auditResKey(a)}
}

func (i auditItem) record() capacity.AuditRecord { return i.AuditRecord }
