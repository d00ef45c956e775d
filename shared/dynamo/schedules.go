package dynamo

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// Scheduled reclaims live in a partition of their own per scheduled reclaim, like reclaim
// operations, so the node's decision partition (LoadNode) never reads them:
//
//	NODE#<nodeId>#SCHED#<id>   SCHED   a scheduled reclaim (TTL once fired or cancelled:
//	                                   then + retention)
//
// and are listed per reservation through the byState index: gsi1pk
// NODE#<nodeId>#RES#<reservationId>#SCHED, gsi1sk <at, RFC 3339 UTC>#<id> (in order of at).
//
// Each org's pending scheduled reclaims are counted in one item, which every transaction that
// creates or ends a counted one updates, so the count is exact under any concurrency (the
// transactions serialise on it):
//
//	ORG#<orgId>                SCHED#PENDING   Pending: the org's pending scheduled reclaims
const (
	typeScheduled    = "scheduled-reclaim"
	skScheduled      = "SCHED"
	typePendingCount = "pending-scheduled-count"
	skPendingCount   = "SCHED#PENDING"
	attrPending      = "Pending"
)

var _ capacity.ScheduleStore = (*Store)(nil)

// schedPK is the partition of one scheduled reclaim.
func schedPK(nodeID, id string) string { return nodePK(nodeID) + "#SCHED#" + id }

// schedListPK is the byState index partition of a reservation's scheduled reclaims.
func schedListPK(nodeID, reservationID string) string {
	return nodePK(nodeID) + "#RES#" + reservationID + "#SCHED"
}

// schedListSK orders a scheduled reclaim in its reservation's list: by at (whole seconds,
// UTC, so the strings sort as the times), then id.
func schedListSK(sr capacity.ScheduledReclaim) string {
	return sr.At.UTC().Format(time.RFC3339) + "#" + sr.ID
}

type scheduledItem struct {
	PK              string     `dynamodbav:"pk"`
	SK              string     `dynamodbav:"sk"`
	Type            string     `dynamodbav:"type"`
	ID              string     `dynamodbav:"ID"`
	NodeID          string     `dynamodbav:"NodeID"`
	ReservationID   string     `dynamodbav:"ReservationID"`
	UnitIDs         []string   `dynamodbav:"UnitIDs"`
	Reason          string     `dynamodbav:"Reason"`
	GraceSeconds    int        `dynamodbav:"GraceSeconds"`
	At              time.Time  `dynamodbav:"At"`
	State           string     `dynamodbav:"State"`
	CreatorKeyID    string     `dynamodbav:"CreatorKeyID"`
	CreatorOrgID    string     `dynamodbav:"CreatorOrgID"`
	CreatorOperator bool       `dynamodbav:"CreatorOperator"`
	CreatedAt       time.Time  `dynamodbav:"CreatedAt"`
	UpdatedAt       time.Time  `dynamodbav:"UpdatedAt"`
	ReclaimID       string     `dynamodbav:"ReclaimID"`
	Code            string     `dynamodbav:"Code"`
	Detail          string     `dynamodbav:"Detail"`
	FiredAt         *time.Time `dynamodbav:"FiredAt"`
	CancelledAt     *time.Time `dynamodbav:"CancelledAt"`
	Version         int64      `dynamodbav:"Version"`
	CountedOrgID    string     `dynamodbav:"CountedOrgID,omitempty"`
	// ExpiresAt is set once the scheduled reclaim has fired or was cancelled.
	ExpiresAt int64 `dynamodbav:"expiresAt,omitempty"`
	// The reservation's list (the byState index).
	GSI1PK string `dynamodbav:"gsi1pk"`
	GSI1SK string `dynamodbav:"gsi1sk"`
}

func newScheduledItem(sr capacity.ScheduledReclaim, retention time.Duration) scheduledItem {
	it := scheduledItem{
		PK: schedPK(sr.NodeID, sr.ID), SK: skScheduled, Type: typeScheduled,
		ID: sr.ID, NodeID: sr.NodeID, ReservationID: sr.ReservationID, UnitIDs: sr.UnitIDs, Reason: sr.Reason,
		GraceSeconds: sr.GraceSeconds, At: sr.At, State: string(sr.State), CreatorKeyID: sr.CreatorKeyID,
		CreatorOrgID: sr.CreatorOrgID, CreatorOperator: sr.CreatorOperator, CreatedAt: sr.CreatedAt,
		UpdatedAt: sr.UpdatedAt, ReclaimID: sr.ReclaimID, Code: string(sr.Code), Detail: sr.Detail,
		FiredAt: sr.FiredAt, CancelledAt: sr.CancelledAt, Version: sr.Version, CountedOrgID: sr.CountedOrgID,
		GSI1PK: schedListPK(sr.NodeID, sr.ReservationID), GSI1SK: schedListSK(sr),
	}
	if sr.State != capacity.ScheduledPending {
		it.ExpiresAt = expiry(sr.UpdatedAt.Add(retention))
	}
	return it
}

func (i scheduledItem) scheduled() capacity.ScheduledReclaim {
	return capacity.ScheduledReclaim{
		ID: i.ID, NodeID: i.NodeID, ReservationID: i.ReservationID, UnitIDs: i.UnitIDs, Reason: i.Reason,
		GraceSeconds: i.GraceSeconds, At: i.At, State: capacity.ScheduledState(i.State), CreatorKeyID: i.CreatorKeyID,
		CreatorOrgID: i.CreatorOrgID, CreatorOperator: i.CreatorOperator, CreatedAt: i.CreatedAt,
		UpdatedAt: i.UpdatedAt, ReclaimID: i.ReclaimID, Code: capacity.Code(i.Code), Detail: i.Detail,
		FiredAt: i.FiredAt, CancelledAt: i.CancelledAt, Version: i.Version, CountedOrgID: i.CountedOrgID,
	}
}

// pendingCount adds delta (1 or -1) to the org's count of pending scheduled reclaims. An
// increment is conditioned on the count (absent: 0) being below limit; a decrement is not: it rides on the
// conditional transition out of pending of a scheduled reclaim the increment counted, so it
// happens exactly once per counted one, and a failed condition there would only block the
// firing or cancel that frees the slot.
func (s *Store) pendingCount(orgID string, delta, limit int) (types.TransactWriteItem, error) {
	// SET with if_not_exists rather than ADD: the emulator drops ADD on numbers in a
	// transaction; both mean the same on AWS.
	upd := expression.Set(expression.Name(attrType), expression.Value(typePendingCount)).
		Set(expression.Name(attrPending), expression.Plus(expression.IfNotExists(expression.Name(attrPending), expression.Value(0)), expression.Value(delta)))
	b := expression.NewBuilder().WithUpdate(upd)
	if delta > 0 {
		b = b.WithCondition(expression.Name(attrPending).AttributeNotExists().
			Or(expression.Name(attrPending).LessThan(expression.Value(limit))))
	}
	expr, err := b.Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build pending count of org %s: %w", orgID, err)
	}
	return types.TransactWriteItem{Update: &types.Update{
		TableName: aws.String(s.Table), Key: itemKey(orgPK(orgID), skPendingCount),
		UpdateExpression: expr.Update(), ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}, nil
}

// orgPK is the partition of an org's own items.
func orgPK(orgID string) string { return "ORG#" + orgID }

// PendingScheduled returns the org's count of pending scheduled reclaims (strongly
// consistent; 0 when it has none).
func (s *Store) PendingScheduled(ctx context.Context, orgID string) (int, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.Table), Key: itemKey(orgPK(orgID), skPendingCount), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return 0, fmt.Errorf("read pending scheduled reclaims of org %s: %w", orgID, classify(err))
	}
	var it struct {
		Pending int `dynamodbav:"Pending"`
	}
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return 0, fmt.Errorf("decode pending scheduled reclaims of org %s: %w", orgID, err)
	}
	return it.Pending, nil
}

// ended returns the items that take a counted scheduled reclaim leaving the pending state
// (from -> to) off its org's count: none when it stays pending or was never counted.
func (s *Store) ended(from, to capacity.ScheduledReclaim) ([]types.TransactWriteItem, error) {
	if from.State != capacity.ScheduledPending || to.State == capacity.ScheduledPending || from.CountedOrgID == "" {
		return nil, nil
	}
	it, err := s.pendingCount(from.CountedOrgID, -1, 0)
	if err != nil {
		return nil, err
	}
	return []types.TransactWriteItem{it}, nil
}

// CreateScheduled writes a new scheduled reclaim with its idempotency and audit records, in
// one transaction conditioned on the reservation's version as read.
func (s *Store) CreateScheduled(ctx context.Context, c capacity.ScheduleCommit) error {
	sr := c.Scheduled
	var items []types.TransactWriteItem
	add := func(it types.TransactWriteItem, err error) error {
		if err != nil {
			return err
		}
		items = append(items, it)
		return nil
	}
	r := c.Reservation
	if err := add(s.check(itemKey(nodePK(r.NodeID), prefixReserv+r.ID), versionIs(r.Version))); err != nil {
		return fmt.Errorf("reservation %s: %w", r.ID, err)
	}
	if err := add(s.putNew(s.Table, newScheduledItem(sr, s.retention()), nil)); err != nil {
		return fmt.Errorf("scheduled reclaim %s: %w", sr.ID, err)
	}
	counted := -1
	if sr.CountedOrgID != "" {
		counted = len(items)
		if err := add(s.pendingCount(sr.CountedOrgID, 1, c.MaxPending)); err != nil {
			return err
		}
	}
	if c.Idempotency != nil {
		if err := add(s.idempotencyPut(*c.Idempotency)); err != nil {
			return err
		}
	}
	// The record goes on the node's audit chain in the same transaction.
	atLimit := func(e *types.TransactionCanceledException) error {
		if counted < 0 || counted >= len(e.CancellationReasons) || aws.ToString(e.CancellationReasons[counted].Code) != "ConditionalCheckFailed" {
			return nil
		}
		return capacity.Errorf(capacity.CodeScheduledReclaimLimit,
			"org %s has %d pending scheduled reclaims, the most allowed: cancel one, or wait for one to fire", sr.CountedOrgID, c.MaxPending)
	}
	return s.appendChained(ctx, "create scheduled reclaim "+sr.ID, c.Audit, s.nodeHead(c.Audit.NodeID), items, atLimit)
}

// GetScheduled reads a scheduled reclaim (strongly consistent).
func (s *Store) GetScheduled(ctx context.Context, nodeID, id string) (*capacity.ScheduledReclaim, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.Table), Key: itemKey(schedPK(nodeID, id), skScheduled), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("read scheduled reclaim %s of node %s: %w", id, nodeID, classify(err))
	}
	if out.Item == nil {
		return nil, capacity.Errorf(capacity.CodeNotFound, "scheduled reclaim %s not found", id)
	}
	var it scheduledItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return nil, fmt.Errorf("decode scheduled reclaim %s of node %s: %w", id, nodeID, err)
	}
	sr := it.scheduled()
	return &sr, nil
}

// schedCursorShape is the key of a cursor of a reservation's scheduled reclaims: a scheduled
// reclaim of that list, with the table's keys and the index's.
func schedCursorShape(nodeID, reservationID string) keyShape {
	return keyShape{
		attrPK: func(v string) bool {
			id, ok := strings.CutPrefix(v, schedPK(nodeID, ""))
			return ok && capacity.ValidID(id)
		},
		attrSK:     equal(skScheduled),
		attrGSI1PK: equal(schedListPK(nodeID, reservationID)),
		attrGSI1SK: func(v string) bool {
			at, id, _ := strings.Cut(v, "#")
			t, err := time.Parse(time.RFC3339, at)
			return err == nil && t.UTC().Format(time.RFC3339) == at && capacity.ValidID(id)
		},
	}
}

// ListScheduled returns a page of the reservation's scheduled reclaims in order of at, from
// the byState index (eventually consistent: one just created may take a moment to appear).
func (s *Store) ListScheduled(ctx context.Context, nodeID, reservationID string, limit int, cursor string) ([]capacity.ScheduledReclaim, string, error) {
	listPK := schedListPK(nodeID, reservationID)
	start, err := decodeCursor(cursor, schedCursorShape(nodeID, reservationID))
	if err != nil {
		return nil, "", err
	}
	if start != nil && !strings.HasSuffix(attr(start, attrGSI1SK), "#"+strings.TrimPrefix(attr(start, attrPK), schedPK(nodeID, ""))) {
		// Its index sort key is its own: both end in the scheduled reclaim's id.
		return nil, "", capacity.Errorf(capacity.CodeInvalidRequest, "invalid cursor")
	}
	expr, err := expression.NewBuilder().WithKeyCondition(expression.Key(attrGSI1PK).Equal(expression.Value(listPK))).Build()
	if err != nil {
		return nil, "", fmt.Errorf("build scheduled reclaims query: %w", err)
	}
	out, err := s.Client.Query(ctx, &dynamodb.QueryInput{
		TableName: aws.String(s.Table), IndexName: aws.String(table.ByStateIndex),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(),
		ExpressionAttributeValues: expr.Values(), ScanIndexForward: aws.Bool(true),
		Limit: aws.Int32(int32(limit)), ExclusiveStartKey: start,
	})
	if err != nil {
		return nil, "", fmt.Errorf("list scheduled reclaims of reservation %s: %w", reservationID, classify(err))
	}
	list := make([]capacity.ScheduledReclaim, 0, len(out.Items))
	var last scheduledItem
	for _, item := range out.Items {
		if err := attributevalue.UnmarshalMap(item, &last); err != nil {
			return nil, "", fmt.Errorf("decode scheduled reclaim of reservation %s: %w", reservationID, err)
		}
		list = append(list, last.scheduled())
	}
	if len(out.LastEvaluatedKey) == 0 || len(list) == 0 {
		return list, "", nil
	}
	// The cursor is the last item's table and index keys, as AWS's LastEvaluatedKey is; the
	// emulator's lacks the index keys.
	next, err := encodeCursor(map[string]types.AttributeValue{
		attrPK: &types.AttributeValueMemberS{Value: last.PK}, attrSK: &types.AttributeValueMemberS{Value: last.SK},
		attrGSI1PK: &types.AttributeValueMemberS{Value: last.GSI1PK}, attrGSI1SK: &types.AttributeValueMemberS{Value: last.GSI1SK},
	})
	if err != nil {
		return nil, "", err
	}
	return list, next, nil
}

// UpdateScheduled replaces the scheduled reclaim read as from with to, conditioned on its
// version and state as read, with the audit record if any, in one transaction.
func (s *Store) UpdateScheduled(ctx context.Context, from, to capacity.ScheduledReclaim, audit *capacity.AuditRecord) error {
	to.Version = from.Version
	put, err := s.scheduledTransition(from, to)
	if err != nil {
		return err
	}
	count, err := s.ended(from, to)
	if err != nil {
		return err
	}
	items := append([]types.TransactWriteItem{put}, count...)
	if audit != nil {
		// The record goes on the node's audit chain in the same transaction.
		return s.appendChained(ctx, "update scheduled reclaim "+from.ID, *audit, s.nodeHead(audit.NodeID), items, nil)
	}
	return s.transact(ctx, "update scheduled reclaim "+from.ID, items, nil)
}

// scheduledTransition puts to (at to.Version+1) over the scheduled reclaim, conditioned on
// its version and state being from's. A whole put rather than an update: no SET/REMOVE mix.
func (s *Store) scheduledTransition(from, to capacity.ScheduledReclaim) (types.TransactWriteItem, error) {
	to.Version = from.Version + 1
	cond := versionIs(from.Version).And(expression.Name(attrState).Equal(expression.Value(string(from.State))))
	put, err := putIf(s.Table, newScheduledItem(to, s.retention()), cond)
	if err != nil {
		return put, fmt.Errorf("scheduled reclaim %s: %w", to.ID, err)
	}
	return put, nil
}

// firedItems are the items of a commit that fires a scheduled reclaim: it moves from
// scheduled (at the version read) to c.Scheduled's state, and off its org's pending count.
func (s *Store) firedItems(sr capacity.ScheduledReclaim) ([]types.TransactWriteItem, error) {
	from := sr
	from.State = capacity.ScheduledPending
	put, err := s.scheduledTransition(from, sr)
	if err != nil {
		return nil, err
	}
	count, err := s.ended(from, sr)
	if err != nil {
		return nil, err
	}
	return append([]types.TransactWriteItem{put}, count...), nil
}
