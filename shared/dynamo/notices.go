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

// RecordNotice puts the VM's notice item. A delivered notice is kept: a later run (a retry, a
// restarted attempt) that could not deliver again does not hide that the guest was told.
func (s *Store) RecordNotice(ctx context.Context, op capacity.Operation, vmID string, n capacity.VMNotice) error {
	item, err := attributevalue.MarshalMap(noticeItem{
		PK: opPK(op.NodeID, op.ID), SK: prefixNotice + vmID, Type: typeNotice, ReclaimID: op.ID, VMID: vmID,
		State: string(n.State), Error: n.Error, At: n.At, TerminateAfter: n.TerminateAfter,
		ExpiresAt: expiry(n.At.Add(s.retention())),
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
