package dynamo

import (
	"fmt"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

type auditItem struct {
	PK             string    `dynamodbav:"pk"`
	SK             string    `dynamodbav:"sk"`
	Type           string    `dynamodbav:"type"`
	ID             string    `dynamodbav:"ID"`
	Time           time.Time `dynamodbav:"Time"`
	RequestID      string    `dynamodbav:"RequestID"`
	ActorKeyID     string    `dynamodbav:"ActorKeyID"`
	CallerOrgID    string    `dynamodbav:"CallerOrgID"`
	ActingFor      string    `dynamodbav:"ActingFor"`
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
	Outcome        string    `dynamodbav:"Outcome"`
	Via            string    `dynamodbav:"via,omitempty"`
	EventID        string    `dynamodbav:"eventId,omitempty"`
	TargetKeyID    string    `dynamodbav:"targetKeyId,omitempty"`
	// What the key of a key-management record grants (absent on every other record).
	Grants *grantsRecord `dynamodbav:"grants,omitempty"`
	// The pin of the chain's start, on the record whose append set it.
	Start *startRecord `dynamodbav:"start,omitempty"`
	// The hash chain (absent on unchained and earlier records) and the evicted VMs.
	Seq      int64          `dynamodbav:"seq,omitempty"`
	PrevHash string         `dynamodbav:"prevHash,omitempty"`
	Hash     string         `dynamodbav:"hash,omitempty"`
	Victims  []victimRecord `dynamodbav:"victims,omitempty"`
	// ResKey keys the byReservation index (table.AuditByReservationKey), on records about a
	// reservation only.
	ResKey string `dynamodbav:"resKey,omitempty"`
}

// grantsRecord is capacity.KeyGrants as an audit item stores it.
type grantsRecord struct {
	OrgID       string      `dynamodbav:"orgId"`
	Permissions []string    `dynamodbav:"permissions"`
	Operator    bool        `dynamodbav:"operator"`
	ExpiresAt   *time.Time  `dynamodbav:"expiresAt"`
	RateLimit   *rateRecord `dynamodbav:"rateLimit,omitempty"`
}

// startRecord is capacity.ChainStart as an audit item stores it.
type startRecord struct {
	Unchained int64  `dynamodbav:"unchained"`
	Digest    string `dynamodbav:"digest"`
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
	it := auditItem{
		PK: pk, SK: auditSK(a), Type: typeAudit,
		ID: a.ID, Time: a.Time, RequestID: a.RequestID, ActorKeyID: a.ActorKeyID, CallerOrgID: a.CallerOrgID,
		ActingFor: a.ActingFor, Action: a.Action, NodeID: a.NodeID, ReservationID: a.ReservationID,
		UnitIDs: a.UnitIDs, DryRun: a.DryRun, Reason: a.Reason, ReclaimID: a.ReclaimID,
		Terminated: a.Terminated, Skipped: a.Skipped, ReleasedBefore: a.ReleasedBefore,
		ReleasedAfter: a.ReleasedAfter, TopologyGen: a.TopologyGen, VMID: a.VMID, Outcome: a.Outcome,
		Via: a.Via, EventID: a.EventID, TargetKeyID: a.TargetKeyID, Seq: a.Seq, PrevHash: a.PrevHash, Hash: a.Hash,
		ResKey: auditResKey(a),
	}
	if st := a.Start; st != nil {
		it.Start = &startRecord{Unchained: st.Unchained, Digest: st.Digest}
	}
	if g := a.Grants; g != nil {
		it.Grants = &grantsRecord{OrgID: g.OrgID, Permissions: g.Permissions, Operator: g.Operator, ExpiresAt: g.ExpiresAt, RateLimit: newRateRecord(g.RateLimit)}
	}
	for _, v := range a.Victims {
		it.Victims = append(it.Victims, victimRecord{VMID: v.VMID, OrgID: v.OrgID, UnitIDs: v.UnitIDs})
	}
	return it
}

func (i auditItem) record() capacity.AuditRecord {
	a := capacity.AuditRecord{
		ID: i.ID, Time: i.Time, RequestID: i.RequestID, ActorKeyID: i.ActorKeyID, CallerOrgID: i.CallerOrgID,
		ActingFor: i.ActingFor, Action: i.Action, NodeID: i.NodeID, ReservationID: i.ReservationID,
		UnitIDs: i.UnitIDs, DryRun: i.DryRun, Reason: i.Reason, ReclaimID: i.ReclaimID,
		Terminated: i.Terminated, Skipped: i.Skipped, ReleasedBefore: i.ReleasedBefore,
		ReleasedAfter: i.ReleasedAfter, TopologyGen: i.TopologyGen, VMID: i.VMID, Outcome: i.Outcome,
		Via: i.Via, EventID: i.EventID, TargetKeyID: i.TargetKeyID, Seq: i.Seq, PrevHash: i.PrevHash, Hash: i.Hash,
	}
	if st := i.Start; st != nil {
		a.Start = &capacity.ChainStart{Unchained: st.Unchained, Digest: st.Digest}
	}
	if g := i.Grants; g != nil {
		a.Grants = &capacity.KeyGrants{OrgID: g.OrgID, Permissions: g.Permissions, Operator: g.Operator, ExpiresAt: g.ExpiresAt, RateLimit: g.RateLimit.limit()}
	}
	for _, v := range i.Victims {
		a.Victims = append(a.Victims, capacity.Victim{VMID: v.VMID, OrgID: v.OrgID, UnitIDs: v.UnitIDs})
	}
	return a
}
