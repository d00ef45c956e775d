package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// A VM's move to its node's history, without a transaction: the history item is put first,
// then the live item deleted. A VM terminating for an operation has one future only, its
// history as terminated by that operation (terminate-node's MarkTerminated or an operator's
// force-end: no commit changes a terminating VM), so the history item may be put before the
// live item goes. A run cut off between the two leaves both: the VM reads as terminating
// everywhere the live partition is read (the unit view, release, the node's counts, every
// decision), its id stays taken (a placement's put of the live item fails as its history
// check would), and the next round's, a duplicate's or a force-end's move finishes it.

// historyOf is the condition that lets a history put replace an item: the VM's history
// as terminated by this operation (an earlier, cut-off move of the same VM), never another.
func historyOf(op capacity.Operation) expression.ConditionBuilder {
	return expression.Name(attrReclaimID).Equal(expression.Value(op.ID)).
		And(expression.Name(attrState).Equal(expression.Value(capacity.VMTerminated)))
}

// moveToHistory puts vm's history item as terminated by op at now, then deletes its live item
// on condition that it is still terminating for op at the version read. ErrConflict: the live
// item changed since it was read (the history put is then this operation's own, and right).
func (s *Store) moveToHistory(ctx context.Context, op capacity.Operation, vm capacity.VM, now time.Time) error {
	done := vm
	done.State, done.UpdatedAt, done.Version = capacity.VMTerminated, now, vm.Version+1
	ours := historyOf(op)
	put, err := s.putNew(s.Table, newHistoryItem(done, s.retention()), &ours)
	if err != nil {
		return err
	}
	p := put.Put
	_, err = s.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: p.TableName, Item: p.Item, ConditionExpression: p.ConditionExpression,
		ExpressionAttributeNames: p.ExpressionAttributeNames, ExpressionAttributeValues: p.ExpressionAttributeValues,
	}, retryConflicts)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return fmt.Errorf("history of VM %s is another operation's than %s: %w", vm.ID, op.ID, capacity.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("put history of VM %s: %w", vm.ID, classify(err))
	}
	cond := expression.Name(attrState).Equal(expression.Value(capacity.VMTerminating)).
		And(expression.Name(attrReclaimID).Equal(expression.Value(op.ID))).
		And(versionIs(vm.Version))
	del, err := s.deleteIf(itemKey(nodePK(op.NodeID), prefixVM+vm.ID), cond)
	if err != nil {
		return err
	}
	d := del.Delete
	_, err = s.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: d.TableName, Key: d.Key, ConditionExpression: d.ConditionExpression,
		ExpressionAttributeNames: d.ExpressionAttributeNames, ExpressionAttributeValues: d.ExpressionAttributeValues,
	}, retryConflicts)
	if errors.As(err, &ccf) {
		return fmt.Errorf("VM %s changed since read: %w", vm.ID, capacity.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("delete live VM %s: %w", vm.ID, classify(err))
	}
	return nil
}
