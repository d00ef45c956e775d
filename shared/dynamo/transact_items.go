package dynamo

import (
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// TransactInput returns the TransactWriteItems input Commit would send for c, so that a
// benchmark can send the very same items without the store (see BenchmarkReclaim's floor).
func (s *Store) TransactInput(c capacity.Commit) (*dynamodb.TransactWriteItemsInput, error) {
	items, err := s.transactItems(c, nil)
	if err != nil {
		return nil, err
	}
	return &dynamodb.TransactWriteItemsInput{TransactItems: items}, nil
}

func (s *Store) transactItems(c capacity.Commit, pin *capacity.ChainStart) ([]types.TransactWriteItem, error) {
	var items []types.TransactWriteItem
	add := func(it types.TransactWriteItem, err error) error {
		if err != nil {
			return err
		}
		items = append(items, it)
		return nil
	}
	// One Update of the node: its version as read (bumped when the commit moves capacity)
	// and the audit chain's head, advanced by the record put last.
	var upd *expression.UpdateBuilder
	if c.BumpNode {
		u := bump(expression.UpdateBuilder{}, c.Node.Version)
		upd = &u
	}
	cond := versionIs(c.Node.Version)
	audit, _, err := s.auditWrites(c.Audit, c.Node.AuditHead, pin, s.nodeHead(c.Node.ID), upd, &cond)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", c.Node.ID, err)
	}
	items = append(items, audit[0])
	if r := c.Reservation; r != nil {
		upd := expression.Set(expression.Name(attrReleasedUnitIDs), expression.Value(r.ReleasedUnitIDs)).
			Set(expression.Name(attrUpdatedAt), expression.Value(r.UpdatedAt))
		err := add(s.update(itemKey(nodePK(r.NodeID), prefixReserv+r.ID), versionIs(r.Version), bump(upd, r.Version)))
		if err != nil {
			return nil, fmt.Errorf("reservation %s: %w", r.ID, err)
		}
	}
	for _, vm := range c.Evict {
		cond := versionIs(vm.Version).And(expression.Name(attrState).Equal(expression.Value(vm.State)))
		upd := expression.Set(expression.Name(attrState), expression.Value(capacity.VMTerminating)).
			Set(expression.Name(attrReclaimID), expression.Value(c.Operation.ID)).
			Set(expression.Name(attrUpdatedAt), expression.Value(c.Operation.CreatedAt))
		if err := add(s.update(itemKey(nodePK(vm.NodeID), prefixVM+vm.ID), cond, bump(upd, vm.Version))); err != nil {
			return nil, fmt.Errorf("VM %s: %w", vm.ID, err)
		}
	}
	if c.NewVM != nil {
		if err := add(s.putNew(s.Table, newVMItem(*c.NewVM), nil)); err != nil {
			return nil, fmt.Errorf("VM %s: %w", c.NewVM.ID, err)
		}
		// VM ids are not reused while the node's history remembers them.
		hist := itemKey(histPK(c.NewVM.NodeID), prefixVM+c.NewVM.ID)
		if err := add(s.check(hist, expression.Name(attrPK).AttributeNotExists())); err != nil {
			return nil, fmt.Errorf("VM %s history: %w", c.NewVM.ID, err)
		}
	}
	if c.Operation != nil {
		if err := add(s.putNew(s.Table, newOperationItem(*c.Operation), nil)); err != nil {
			return nil, fmt.Errorf("operation %s: %w", c.Operation.ID, err)
		}
	}
	if c.Idempotency != nil {
		if err := add(s.idempotencyPut(*c.Idempotency)); err != nil {
			return nil, err
		}
	}
	if c.Scheduled != nil {
		// A fired scheduled reclaim leaves the scheduled state with the reclaim, or not at all.
		fired, err := s.firedItems(*c.Scheduled)
		if err != nil {
			return nil, fmt.Errorf("scheduled reclaim %s: %w", c.Scheduled.ID, err)
		}
		items = append(items, fired...)
	}
	return append(items, audit[1:]...), nil
}

// idempotencyPut puts a call's Idempotency-Key record, on the condition that none binds the
// key: a record past its expiry may still exist until TTL deletes it, and no longer binds.
func (s *Store) idempotencyPut(r capacity.IdempotencyRecord) (types.TransactWriteItem, error) {
	expired := expression.Name(attrExpiresAt).LessThanEqual(expression.Value(r.CreatedAt.Unix()))
	put, err := s.putNew(s.Table, newIdempotencyItem(r), &expired)
	if err != nil {
		return put, fmt.Errorf("idempotency record: %w", err)
	}
	return put, nil
}

func itemKey(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrPK: &types.AttributeValueMemberS{Value: pk},
		attrSK: &types.AttributeValueMemberS{Value: sk},
	}
}

func versionIs(v int64) expression.ConditionBuilder {
	return expression.Name(attrVersion).Equal(expression.Value(v))
}

func bump(u expression.UpdateBuilder, v int64) expression.UpdateBuilder {
	return u.Set(expression.Name(attrVersion), expression.Value(v+1))
}

func (s *Store) update(k map[string]types.AttributeValue, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build update: %w", err)
	}
	// The builder puts each clause (SET, REMOVE, ...) on a line of its own; the local
	// emulator reads only the first clause unless they are separated by a space, which AWS
	// takes as well. Expressions hold only placeholders, so nothing else changes.
	update := strings.ReplaceAll(aws.ToString(expr.Update()), "\n", " ")
	return types.TransactWriteItem{Update: &types.Update{
		TableName: aws.String(s.Table), Key: k,
		ConditionExpression: expr.Condition(), UpdateExpression: aws.String(update),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}, nil
}

func (s *Store) check(k map[string]types.AttributeValue, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build condition check: %w", err)
	}
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
		TableName: aws.String(s.Table), Key: k, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}, nil
}

func (s *Store) deleteIf(k map[string]types.AttributeValue, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build delete condition: %w", err)
	}
	return types.TransactWriteItem{Delete: &types.Delete{
		TableName: aws.String(s.Table), Key: k, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}, nil
}

// putNew puts an item (an item struct, or an item as stored) that must not exist yet (or,
// with orElse, may exist if orElse holds).
func (s *Store) putNew(tableName string, v any, orElse *expression.ConditionBuilder) (types.TransactWriteItem, error) {
	cond := expression.Name(attrPK).AttributeNotExists()
	if orElse != nil {
		cond = cond.Or(*orElse)
	}
	return putIf(tableName, v, cond)
}

// putIf puts an item (an item struct, or an item as stored) on the condition cond.
func putIf(tableName string, v any, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	item, ok := v.(map[string]types.AttributeValue)
	if !ok {
		var err error
		if item, err = attributevalue.MarshalMap(v); err != nil {
			return types.TransactWriteItem{}, fmt.Errorf("encode item: %w", err)
		}
	}
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build put condition: %w", err)
	}
	put := &types.Put{
		TableName: aws.String(tableName), Item: item, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}
	return types.TransactWriteItem{Put: put}, nil
}
