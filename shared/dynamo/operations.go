package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

var _ capacity.TerminationStore = (*Store)(nil)

// GetOperation reads a reclaim operation and its VM outcomes with one strongly consistent
// Query: the outcomes are items of their own under the operation's sort key.
func (s *Store) GetOperation(ctx context.Context, nodeID, opID string) (*capacity.Operation, error) {
	keyCond := expression.Key(table.PartitionKey).Equal(expression.Value(nodePK(nodeID))).
		And(expression.Key(table.SortKey).BeginsWith(prefixOperation + opID))
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).Build()
	if err != nil {
		return nil, fmt.Errorf("build operation query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.Table), ConsistentRead: aws.Bool(true),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}
	var op *capacity.Operation
	outcomes := map[string]capacity.VMOutcome{}
	for page := dynamodb.NewQueryPaginator(s.Client, in); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("query operation %s: %w", opID, err)
		}
		for _, item := range out.Items {
			var k key
			if err := attributevalue.UnmarshalMap(item, &k); err != nil {
				return nil, fmt.Errorf("decode operation %s: %w", opID, err)
			}
			switch {
			case k.Type == typeOperation && k.SK == prefixOperation+opID:
				var it operationItem
				if err := attributevalue.UnmarshalMap(item, &it); err != nil {
					return nil, fmt.Errorf("decode operation %s: %w", opID, err)
				}
				op = &it.Operation
			case k.Type == typeOutcome:
				var it outcomeItem
				if err := attributevalue.UnmarshalMap(item, &it); err != nil {
					return nil, fmt.Errorf("decode outcome of operation %s: %w", opID, err)
				}
				outcomes[it.VMID] = it.VMOutcome
			}
		}
	}
	if op == nil {
		return nil, capacity.Errorf(capacity.CodeNotFound, "reclaim operation %s not found", opID)
	}
	op.Outcomes = outcomes
	return op, nil
}

// BeginTermination moves the operation from pending-start to terminating.
func (s *Store) BeginTermination(ctx context.Context, op capacity.Operation, executionARN string, now time.Time) error {
	op.State = capacity.OpTerminating
	upd := expression.Set(expression.Name("State"), expression.Value(capacity.OpTerminating)).
		Set(expression.Name("ExecutionARN"), expression.Value(executionARN)).
		Set(expression.Name("UpdatedAt"), expression.Value(now)).
		Set(expression.Name(table.ByStatePartitionKey), expression.Value(opStatePK(capacity.OpTerminating)))
	cond := expression.Name("State").Equal(expression.Value(capacity.OpPendingStart))
	_, err := s.updateItem(ctx, itemKey(nodePK(op.NodeID), prefixOperation+op.ID), cond, upd, types.ReturnValueNone)
	if err != nil {
		return fmt.Errorf("begin termination of operation %s: %w", op.ID, err)
	}
	return nil
}

// MarkTerminated moves a VM evicted by op from terminating to terminated, which frees its
// units. Re-marking a VM op already terminated succeeds; any other state is an error.
func (s *Store) MarkTerminated(ctx context.Context, op capacity.Operation, vmID string, now time.Time) error {
	k := itemKey(nodePK(op.NodeID), prefixVM+vmID)
	cond := expression.Name("State").Equal(expression.Value(capacity.VMTerminating)).
		And(expression.Name("ReclaimID").Equal(expression.Value(op.ID)))
	upd := expression.Set(expression.Name("State"), expression.Value(capacity.VMTerminated)).
		Set(expression.Name("UpdatedAt"), expression.Value(now)).
		Set(expression.Name("Version"), expression.Name("Version").Plus(expression.Value(1)))
	_, err := s.updateItem(ctx, k, cond, upd, types.ReturnValueNone)
	if !errors.Is(err, capacity.ErrConflict) {
		if err != nil {
			return fmt.Errorf("mark VM %s terminated: %w", vmID, err)
		}
		return nil
	}
	out, gerr := s.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.Table), Key: k, ConsistentRead: aws.Bool(true)})
	if gerr != nil {
		return fmt.Errorf("read VM %s: %w", vmID, gerr)
	}
	var it vmItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return fmt.Errorf("decode VM %s: %w", vmID, err)
	}
	if out.Item != nil && it.State == capacity.VMTerminated && it.ReclaimID == op.ID {
		return nil // this operation terminated it already: a re-run
	}
	return fmt.Errorf("VM %s is %q for %q, not terminating for %s: %w", vmID, it.State, it.ReclaimID, op.ID, err)
}

// RecordOutcome stores a VM's final outcome on the operation, while it is terminating: in
// one transaction, the outcome item (once per VM) and a count of outcomes on the operation,
// which EndOperation's condition checks. A condition failure means the outcome was recorded
// before (a re-run) or the operation has ended: either way there is nothing left to write.
func (s *Store) RecordOutcome(ctx context.Context, op capacity.Operation, vmID string, o capacity.VMOutcome) error {
	put, err := s.putNew(s.Table, newOutcomeItem(op, vmID, o), nil)
	if err != nil {
		return fmt.Errorf("outcome of VM %s: %w", vmID, err)
	}
	count, err := s.update(itemKey(nodePK(op.NodeID), prefixOperation+op.ID),
		expression.Name("State").Equal(expression.Value(capacity.OpTerminating)),
		expression.Set(expression.Name(attrRecorded), expression.Name(attrRecorded).Plus(expression.Value(1))).
			Set(expression.Name("UpdatedAt"), expression.Value(o.At)))
	if err != nil {
		return fmt.Errorf("count outcome of VM %s: %w", vmID, err)
	}
	_, err = s.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{put, count}})
	var canceled *types.TransactionCanceledException
	if err != nil && !(errors.As(err, &canceled) && retryable(canceled)) {
		return fmt.Errorf("record outcome of VM %s on operation %s: %w", vmID, op.ID, err)
	}
	return nil
}

// EndOperation moves a terminating operation whose VMs all have outcomes to its end state
// (and, in the byState index, under that state, which the reconciler never reads). Exactly
// one caller wins.
func (s *Store) EndOperation(ctx context.Context, op capacity.Operation, state capacity.OperationState, now time.Time) error {
	cond := expression.Name("State").Equal(expression.Value(capacity.OpTerminating)).
		And(expression.Name(attrRecorded).GreaterThanEqual(expression.Value(len(op.VMIDs))))
	upd := expression.Set(expression.Name("State"), expression.Value(state)).
		Set(expression.Name("UpdatedAt"), expression.Value(now)).
		Set(expression.Name(table.ByStatePartitionKey), expression.Value(opStatePK(state)))
	if _, err := s.updateItem(ctx, itemKey(nodePK(op.NodeID), prefixOperation+op.ID), cond, upd, types.ReturnValueNone); err != nil {
		return fmt.Errorf("end operation %s as %s: %w", op.ID, state, err)
	}
	return nil
}

// OperationsInState lists operations in a state created before the time, oldest first, from
// the byState index.
func (s *Store) OperationsInState(ctx context.Context, state capacity.OperationState, createdBefore time.Time, limit int) ([]capacity.Operation, error) {
	keyCond := expression.Key(table.ByStatePartitionKey).Equal(expression.Value(opStatePK(state))).
		And(expression.Key(table.ByStateSortKey).LessThan(expression.Value(createdBefore.UTC().Format(time.RFC3339Nano))))
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).Build()
	if err != nil {
		return nil, fmt.Errorf("build index query: %w", err)
	}
	out, err := s.Client.Query(ctx, &dynamodb.QueryInput{
		TableName: aws.String(s.Table), IndexName: aws.String(table.ByStateIndex),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(),
		ExpressionAttributeValues: expr.Values(), Limit: aws.Int32(int32(limit)),
	})
	if err != nil {
		return nil, fmt.Errorf("query %s operations: %w", state, err)
	}
	ops := make([]capacity.Operation, 0, len(out.Items))
	for _, item := range out.Items {
		var it operationItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return nil, fmt.Errorf("decode operation: %w", err)
		}
		ops = append(ops, it.Operation) // without outcomes: GetOperation reads those
	}
	return ops, nil
}

// updateItem runs one conditional UpdateItem (built as in a transaction); a failed
// condition wraps capacity.ErrConflict.
func (s *Store) updateItem(ctx context.Context, k map[string]types.AttributeValue, cond expression.ConditionBuilder, upd expression.UpdateBuilder, rv types.ReturnValue) (map[string]types.AttributeValue, error) {
	it, err := s.update(k, cond, upd)
	if err != nil {
		return nil, err
	}
	u := it.Update
	out, err := s.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: u.TableName, Key: u.Key, ReturnValues: rv,
		ConditionExpression: u.ConditionExpression, UpdateExpression: u.UpdateExpression,
		ExpressionAttributeNames: u.ExpressionAttributeNames, ExpressionAttributeValues: u.ExpressionAttributeValues,
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil, fmt.Errorf("%w: %s", capacity.ErrConflict, aws.ToString(ccf.Message))
	}
	if err != nil {
		return nil, err
	}
	return out.Attributes, nil
}
