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
)

// Eviction notices: pk OP#<node>#<op> (the operation's partition), sk NOTICE#<vm>, one item per
// VM, read with the operation.
const (
	typeNotice   = "notice"
	prefixNotice = "NOTICE#"
	attrNotice   = "NoticeState"
)

var _ capacity.NoticeStore = (*Store)(nil)

// noticeItem is what became of one VM's eviction notice.
type noticeItem struct {
	PK             string    `dynamodbav:"pk"`
	SK             string    `dynamodbav:"sk"`
	Type           string    `dynamodbav:"type"`
	ReclaimID      string    `dynamodbav:"ReclaimID"`
	VMID           string    `dynamodbav:"VMID"`
	State          string    `dynamodbav:"NoticeState"`
	Error          string    `dynamodbav:"Error,omitempty"`
	At             time.Time `dynamodbav:"At"`
	TerminateAfter time.Time `dynamodbav:"TerminateAfter"`
	ExpiresAt      int64     `dynamodbav:"expiresAt,omitempty"`
}

func (i noticeItem) notice() capacity.VMNotice {
	return capacity.VMNotice{State: capacity.NoticeState(i.State), Error: i.Error, At: i.At, TerminateAfter: i.TerminateAfter}
}

// noticeKept is how long a notice item stays after the grace it announced: the round that
// ends the VM runs at the grace's end, and its outcome carries a copy of the notice (see
// outcomeItem), which the operation read shows once the item is gone.
const noticeKept = 24 * time.Hour

func noticeKeptUntil(n capacity.VMNotice) time.Time {
	end := n.TerminateAfter
	if end.Before(n.At) {
		end = n.At
	}
	return end.Add(noticeKept)
}

// RecordNotice puts the VM's notice item. A delivered notice is kept: a later run (a retry, a
// restarted attempt) that could not deliver again does not hide that the guest was told.
func (s *Store) RecordNotice(ctx context.Context, op capacity.Operation, vmID string, n capacity.VMNotice) error {
	item, err := attributevalue.MarshalMap(noticeItem{
		PK: opPK(op.NodeID, op.ID), SK: prefixNotice + vmID, Type: typeNotice, ReclaimID: op.ID, VMID: vmID,
		State: string(n.State), Error: n.Error, At: n.At, TerminateAfter: n.TerminateAfter,
		ExpiresAt: expiry(noticeKeptUntil(n)),
	})
	if err != nil {
		return fmt.Errorf("encode notice of VM %s: %w", vmID, err)
	}
	cond := expression.Name(attrPK).AttributeNotExists().Or(expression.Name(attrNotice).NotEqual(expression.Value(capacity.NoticeDelivered)))
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return fmt.Errorf("build notice condition: %w", err)
	}
	_, err = s.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.Table), Item: item, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil // delivered before
	}
	if err != nil {
		return fmt.Errorf("record notice of VM %s on operation %s: %w", vmID, op.ID, err)
	}
	return nil
}

// keepNotices keeps, for the retention from now, the notice items of op's VMs that have no
// outcome to carry a copy: a failed operation holds such a VM (it stays terminating) for as
// long as it takes someone to re-drive or force-end it, and its read should still say whether
// the guest was told. A notice item gone has nothing to keep.
func (s *Store) keepNotices(ctx context.Context, op capacity.Operation, now time.Time) error {
	keep := expression.Set(expression.Name(attrExpiresAt), expression.Value(expiry(now.Add(s.retention()))))
	for vmID := range op.Notices {
		if _, ok := op.Outcomes[vmID]; ok {
			continue
		}
		_, err := s.updateItem(ctx, itemKey(opPK(op.NodeID, op.ID), prefixNotice+vmID), expression.Name(attrPK).AttributeExists(), keep, types.ReturnValueNone)
		if err != nil && !errors.Is(err, capacity.ErrConflict) {
			return fmt.Errorf("keep notice of VM %s on operation %s: %w", vmID, op.ID, err)
		}
	}
	return nil
}
