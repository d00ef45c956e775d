package dynamo

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// ReservationAudit returns a page of a reservation's records on one of its node's chains
// (its changes, or the calls about it that changed nothing), newest first, from the
// byReservation index (eventually consistent: a record just written may be missing). The index
// holds the records' keys only (a reclaim's record would be stored twice, for good, to be read
// rarely): the page's records are then read from the table by key.
func (s *Store) ReservationAudit(ctx context.Context, nodeID, reservationID string, chain capacity.NodeChain, limit int, cursor string) ([]capacity.AuditRecord, string, error) {
	trail, pk := reservationTrail(nodeID, reservationID, chain), s.nodeChainHead(nodeID, chain).auditPK
	start, err := decodeCursor(cursor, reservationAuditShape(nodeID, reservationID, chain))
	if err != nil {
		return nil, "", err
	}
	// Only the chain's own records: calls records written before the trails were apart carry
	// the changes trail's key (docs/compatibility.md), and are skipped there.
	expr, err := expression.NewBuilder().
		WithKeyCondition(expression.Key(table.AuditByReservationKey).Equal(expression.Value(trail))).
		WithFilter(expression.Name(attrPK).Equal(expression.Value(pk))).Build()
	if err != nil {
		return nil, "", fmt.Errorf("build audit query: %w", err)
	}
	what := "reservation " + reservationID
	var entries []map[string]types.AttributeValue
	for range maxTrailQueries {
		out, err := s.Client.Query(ctx, &dynamodb.QueryInput{
			TableName: aws.String(s.AuditTable), IndexName: aws.String(table.AuditByReservationIndex),
			KeyConditionExpression: expr.KeyCondition(), FilterExpression: expr.Filter(), ExpressionAttributeNames: expr.Names(),
			ExpressionAttributeValues: expr.Values(), ScanIndexForward: aws.Bool(false),
			Limit: aws.Int32(int32(limit - len(entries))), ExclusiveStartKey: start,
		})
		if err != nil {
			return nil, "", fmt.Errorf("query audit of %s: %w", what, classify(err))
		}
		entries = append(entries, out.Items...)
		start = nil
		if len(out.LastEvaluatedKey) > 0 {
			// The next start is the last entry read (shown or skipped), with the index's key,
			// as AWS's LastEvaluatedKey of an index is; the emulator's lacks it.
			start = map[string]types.AttributeValue{attrPK: out.LastEvaluatedKey[attrPK], attrSK: out.LastEvaluatedKey[attrSK],
				table.AuditByReservationKey: &types.AttributeValueMemberS{Value: trail}}
		}
		if start == nil || len(entries) == limit {
			break
		}
	}
	items, err := s.auditRecordsByKey(ctx, entries, what)
	if err != nil {
		return nil, "", err
	}
	return decodeAuditPage(items, start, what)
}

// maxTrailQueries bounds the index queries one page of a reservation's trail reads to fill
// itself past skipped entries: past it the page is answered short, with a cursor.
const maxTrailQueries = 5

// reservationAuditShape is the key of a cursor of a reservation's trail on a chain: an entry
// of its index partition, with the table's keys and the index's, as AWS's LastEvaluatedKey of
// an index is. The changes trail's may name a calls record it skipped.
func reservationAuditShape(nodeID, reservationID string, chain capacity.NodeChain) keyShape {
	pk := equal(callsPK(nodeID))
	if chain == capacity.ChainChanges {
		pk = func(v string) bool { return v == nodePK(nodeID) || v == callsPK(nodeID) }
	}
	return keyShape{attrPK: pk, attrSK: isAuditSK, table.AuditByReservationKey: equal(reservationTrail(nodeID, reservationID, chain))}
}

// auditBatch is the most keys one BatchGetItem reads (DynamoDB's limit).
const auditBatch = 100

// batchGet reads the items of keys from tableName with strongly consistent BatchGetItems of
// up to auditBatch keys, and hands each one found to found, in no particular order.
func (s *Store) batchGet(ctx context.Context, tableName string, keys []map[string]types.AttributeValue, what string,
	found func(map[string]types.AttributeValue) error) error {
	for chunk := range slices.Chunk(keys, auditBatch) {
		req := map[string]types.KeysAndAttributes{tableName: {Keys: chunk, ConsistentRead: aws.Bool(true)}}
		for attempt := 0; len(req) > 0; attempt++ {
			if attempt > 0 {
				// Unprocessed keys (throttling): again after a pause, as the SDK would.
				if err := capacity.Sleep(ctx, time.Duration(attempt)*20*time.Millisecond); err != nil {
					return err
				}
			}
			if attempt == 10 {
				return fmt.Errorf("read %s: %d keys left unprocessed: %w", what, len(req[tableName].Keys), capacity.ErrThrottled)
			}
			out, err := s.Client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				return fmt.Errorf("read %s: %w", what, classify(err))
			}
			for _, it := range out.Responses[tableName] {
				if err := found(it); err != nil {
					return err
				}
			}
			req = out.UnprocessedKeys
		}
	}
	return nil
}

// auditRecordsByKey reads the audit records the index entries point to, in the entries'
// order. Records are never changed or deleted, so each is there; a strongly consistent read,
// as an entry may be seen before an eventually consistent read of the table sees its record.
func (s *Store) auditRecordsByKey(ctx context.Context, entries []map[string]types.AttributeValue, what string) ([]map[string]types.AttributeValue, error) {
	byKey := make(map[string]map[string]types.AttributeValue, len(entries))
	keys := make([]map[string]types.AttributeValue, 0, len(entries))
	for _, e := range entries {
		keys = append(keys, map[string]types.AttributeValue{attrPK: e[attrPK], attrSK: e[attrSK]})
	}
	err := s.batchGet(ctx, s.AuditTable, keys, "audit records of "+what, func(it map[string]types.AttributeValue) error {
		byKey[attr(it, attrPK)+"\x00"+attr(it, attrSK)] = it
		return nil
	})
	if err != nil {
		return nil, err
	}
	items := make([]map[string]types.AttributeValue, 0, len(entries))
	for _, e := range entries {
		it, ok := byKey[attr(e, attrPK)+"\x00"+attr(e, attrSK)]
		if !ok {
			return nil, fmt.Errorf("audit record %s / %s of %s: indexed but not found", attr(e, attrPK), attr(e, attrSK), what)
		}
		items = append(items, it)
	}
	return items, nil
}

// NodeAudit reads the head of one of the node's chains, then a page of its records in chain
// order. It writes nothing (a calls chain not begun reads as empty).
func (s *Store) NodeAudit(ctx context.Context, nodeID string, chain capacity.NodeChain, limit int, cursor string) (capacity.AuditHead, []capacity.AuditRecord, string, error) {
	ref := s.nodeChainHead(nodeID, chain)
	start, err := decodeCursor(cursor, chainShape(ref.auditPK)) // before any read
	if err != nil {
		return capacity.AuditHead{}, nil, "", err
	}
	head, exists, err := s.readHead(ctx, ref)
	if err != nil {
		return head, nil, "", err
	}
	if !exists {
		return head, nil, "", capacity.Errorf(capacity.CodeNotFound, "node %s not found", nodeID)
	}
	recs, next, err := s.chainRecords(ctx, ref.auditPK, limit, start)
	return head, recs, next, err
}

// KeyAudit reads the key-management chain's head, then a page of its records in chain order.
func (s *Store) KeyAudit(ctx context.Context, limit int, cursor string) (capacity.AuditHead, []capacity.AuditRecord, string, error) {
	start, err := decodeCursor(cursor, chainShape(keysAuditPK))
	if err != nil {
		return capacity.AuditHead{}, nil, "", err
	}
	head, _, err := s.readHead(ctx, s.keysHead())
	if err != nil {
		return head, nil, "", err
	}
	recs, next, err := s.chainRecords(ctx, keysAuditPK, limit, start)
	return head, recs, next, err
}

// chainShape is the key of a cursor of the chain whose records are in audit partition pk.
func chainShape(pk string) keyShape { return keyShape{attrPK: equal(pk), attrSK: isAuditSK} }

// chainRecords reads a page of an audit partition in key order, which is chain order:
// unchained records (<time>#<id>) sort before SEQ#, and seqs are zero-padded. start is the
// page's start key (decodeCursor with chainShape), nil for the first.
func (s *Store) chainRecords(ctx context.Context, pk string, limit int, start map[string]types.AttributeValue) ([]capacity.AuditRecord, string, error) {
	expr, err := expression.NewBuilder().WithKeyCondition(expression.Key(attrPK).Equal(expression.Value(pk))).Build()
	if err != nil {
		return nil, "", fmt.Errorf("build audit query: %w", err)
	}
	return s.auditPage(ctx, &dynamodb.QueryInput{
		TableName: aws.String(s.AuditTable), KeyConditionExpression: expr.KeyCondition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ScanIndexForward: aws.Bool(true), ConsistentRead: aws.Bool(true),
		Limit: aws.Int32(int32(limit)), ExclusiveStartKey: start,
	}, pk)
}

func (s *Store) auditPage(ctx context.Context, in *dynamodb.QueryInput, what string) ([]capacity.AuditRecord, string, error) {
	out, err := s.Client.Query(ctx, in)
	if err != nil {
		return nil, "", fmt.Errorf("query audit of %s: %w", what, classify(err))
	}
	return decodeAuditPage(out.Items, out.LastEvaluatedKey, what)
}

// decodeAuditPage decodes a page's records and its cursor.
func decodeAuditPage(items []map[string]types.AttributeValue, last map[string]types.AttributeValue, what string) ([]capacity.AuditRecord, string, error) {
	recs := make([]capacity.AuditRecord, 0, len(items))
	for _, item := range items {
		var it auditItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return nil, "", fmt.Errorf("decode audit record of %s: %w", what, err)
		}
		recs = append(recs, it.record())
	}
	next, err := encodeCursor(last)
	if err != nil {
		return nil, "", err
	}
	return recs, next, nil
}
