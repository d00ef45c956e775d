package dynamo

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The migration's backfill of the list index (byList, see lists.go) for items written before
// it existed: nodes get their directory entry and their owner's membership, reservations their
// orgs' memberships, operations their reservation's list keys. Each is idempotent: a re-run
// finds nothing left to write.

// indexNode puts the node's directory entry and its owner's membership when the entry is
// missing or differs from the node as read, conditioned on the node's version as read: a
// change of the node meanwhile writes both itself.
func (s *Store) indexNode(ctx context.Context, item map[string]types.AttributeValue, dryRun bool, rep *MigrationReport) error {
	var it nodeItem
	if err := attributevalue.UnmarshalMap(item, &it); err != nil {
		return fmt.Errorf("decode node %s: %w", attr(item, attrPK), err)
	}
	n := it.node()
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.Table), Key: itemKey(nodePK(n.ID), skDirectory), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return fmt.Errorf("read directory entry of node %s: %w", n.ID, classify(err))
	}
	var dir directoryItem
	if out.Item != nil {
		if err := attributevalue.UnmarshalMap(out.Item, &dir); err != nil {
			return fmt.Errorf("decode directory entry of node %s: %w", n.ID, err)
		}
		if dir.OwnerOrgID == n.OwnerOrgID && dir.TopologyGen == n.TopologyGen && slices.Equal(dir.UnitIDs, n.UnitIDs) {
			return nil
		}
	}
	if dryRun {
		rep.ListEntries++
		return nil
	}
	check, err := s.check(itemKey(nodePK(n.ID), skNode), versionIs(n.Version))
	if err != nil {
		return err
	}
	puts, err := s.putItems([]any{newDirectoryItem(n), newMemberItem(n.ID, n.OwnerOrgID)})
	if err != nil {
		return err
	}
	_, err = s.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: append([]types.TransactWriteItem{check}, puts...)})
	var canceled *types.TransactionCanceledException
	switch {
	case err == nil:
		rep.ListEntries++
	case errors.As(err, &canceled) && retryable(canceled):
		rep.Skipped++ // the node changed meanwhile, and wrote its entries itself
	default:
		return fmt.Errorf("list node %s: %w", n.ID, classify(err))
	}
	return nil
}

// indexReservation puts the memberships of the reservation's orgs that are missing. They need
// no condition: once a reservation names an org, the org may see the node for good.
func (s *Store) indexReservation(ctx context.Context, item map[string]types.AttributeValue, dryRun bool, rep *MigrationReport) error {
	var it reservationItem
	if err := attributevalue.UnmarshalMap(item, &it); err != nil {
		return fmt.Errorf("decode reservation %s: %w", attr(item, attrPK), err)
	}
	orgs := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(it.AllowedOrgIDs), it.ManagingOrgIDs...))))
	for _, org := range orgs {
		m := newMemberItem(it.NodeID, org)
		out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.Table), Key: itemKey(m.PK, m.SK)})
		if err != nil {
			return fmt.Errorf("read membership of %s on node %s: %w", org, it.NodeID, classify(err))
		}
		if out.Item != nil {
			continue
		}
		rep.ListEntries++
		if dryRun {
			continue
		}
		put, err := attributevalue.MarshalMap(m)
		if err != nil {
			return fmt.Errorf("encode membership: %w", err)
		}
		if _, err := s.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.Table), Item: put}); err != nil {
			return fmt.Errorf("put membership of %s on node %s: %w", org, it.NodeID, classify(err))
		}
	}
	return nil
}

// indexOperation gives an operation its reservation's list keys, if it still has none; the
// update names no other attribute, so the workflow's writes meanwhile are kept.
func (s *Store) indexOperation(ctx context.Context, item map[string]types.AttributeValue, dryRun bool, rep *MigrationReport) error {
	var it operationItem
	if err := attributevalue.UnmarshalMap(item, &it); err != nil {
		return fmt.Errorf("decode operation %s: %w", attr(item, attrPK), err)
	}
	if it.GSI2PK != "" {
		rep.Skipped++
		return nil
	}
	if dryRun {
		rep.ListedOperations++
		return nil
	}
	cond := expression.Name(attrPK).AttributeExists().And(expression.Name(attrGSI2PK).AttributeNotExists())
	upd := expression.Set(expression.Name(attrGSI2PK), expression.Value(opListPK(it.NodeID, it.ReservationID))).
		Set(expression.Name(attrGSI2SK), expression.Value(opListSK(it.CreatedAt, it.ID)))
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return fmt.Errorf("build operation list keys: %w", err)
	}
	_, err = s.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.Table), Key: itemKey(it.PK, it.SK), ConditionExpression: expr.Condition(),
		UpdateExpression: expr.Update(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		rep.ListedOperations++
	case errors.As(err, &ccf):
		rep.Skipped++ // expired or listed meanwhile
	default:
		return fmt.Errorf("list operation %s: %w", it.ID, classify(err))
	}
	return nil
}
