package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// Claims in an operation's partition (pk OP#<node>#<op>): sk CLAIM#<vm>, a VM's terminate
// claim, and sk REPORT#<attempt>, an attempt's report claim. Each is taken by one conditional
// PutItem, so that of two runs of one step at once (a duplicate delivery) one acts. The
// operation read notes whether its attempt's report claim exists (Operation.ReportClaimed).
const (
	typeClaim    = "claim"
	prefixClaim  = "CLAIM#"
	prefixReport = "REPORT#"
	attrHolder   = "Holder"
	attrUntilMs  = "UntilMs"
	attrDone     = "Done"
	attrAnswered = "Answered"
)

// claimKeptFor is how long a claim stays after its lease: a run holds it while it may be
// live (its lease, minutes at most); after that the outcome is what every run reads, and a
// claim gone reads as free. An ended operation whose report claim exists was reported by the
// run that ended it, so a later report of it publishes nothing; the only later reporters are
// a duplicate delivery and a late task of the workflow, minutes at most, well inside a day.
// A report run later than that would publish the same events under the same ids again.
const claimKeptFor = 24 * time.Hour

// claimItem is a claim: who holds it and until when (epoch milliseconds, compared in the
// condition as a number).
type claimItem struct {
	PK        string `dynamodbav:"pk"`
	SK        string `dynamodbav:"sk"`
	Type      string `dynamodbav:"type"`
	ReclaimID string `dynamodbav:"ReclaimID"`
	Holder    string `dynamodbav:"Holder"`
	UntilMs   int64  `dynamodbav:"UntilMs"`
	Done      bool   `dynamodbav:"Done"`
	ExpiresAt int64  `dynamodbav:"expiresAt"` // epoch seconds: table.TTLAttribute
}

// ClaimTermination takes the VM's terminate claim (see capacity.TerminationStore). A retry of
// this call whose first answer was lost meets its own claim, which the condition admits. It
// is an update, not a put, so the agent's answer a holder marked on the claim
// (MarkClaimAnswered) stays on it for every later holder, and a retry whose first try landed
// still reads it.
func (s *Store) ClaimTermination(ctx context.Context, op capacity.Operation, vmID, holder string, now, until time.Time) (capacity.TerminateClaim, error) {
	k := itemKey(opPK(op.NodeID, op.ID), prefixClaim+vmID)
	free := expression.Name(attrUntilMs).LessThan(expression.Value(now.UnixMilli()))
	cond := expression.Name(attrPK).AttributeNotExists().Or(free).Or(expression.Name(attrHolder).Equal(expression.Value(holder)))
	upd := expression.Set(expression.Name(attrType), expression.Value(typeClaim)).
		Set(expression.Name("ReclaimID"), expression.Value(op.ID)).
		Set(expression.Name(attrHolder), expression.Value(holder)).
		Set(expression.Name(attrUntilMs), expression.Value(until.UnixMilli())).
		Set(expression.Name(attrExpiresAt), expression.Value(expiry(until.Add(claimKeptFor))))
	old, err := s.updateItem(ctx, k, cond, upd, types.ReturnValueAllOld)
	if err != nil {
		return capacity.TerminateClaim{}, fmt.Errorf("claim termination of VM %s on operation %s: %w", vmID, op.ID, classify(err))
	}
	prev := attr(old, attrHolder)
	return capacity.TerminateClaim{TookOver: prev != "" && prev != holder, Answered: capacity.Outcome(attr(old, attrAnswered))}, nil
}

// MarkClaimAnswered records the agent's answer on holder's terminate claim (see
// capacity.TerminationStore); ErrConflict when the claim is no longer holder's.
func (s *Store) MarkClaimAnswered(ctx context.Context, op capacity.Operation, vmID, holder string, answer capacity.Outcome) error {
	k := itemKey(opPK(op.NodeID, op.ID), prefixClaim+vmID)
	cond := expression.Name(attrHolder).Equal(expression.Value(holder))
	upd := expression.Set(expression.Name(attrAnswered), expression.Value(answer))
	if _, err := s.updateItem(ctx, k, cond, upd, types.ReturnValueNone); err != nil {
		return fmt.Errorf("mark the agent's answer on the claim of VM %s on operation %s: %w", vmID, op.ID, classify(err))
	}
	return nil
}

// ReleaseTermination drops holder's terminate claim on the VM.
func (s *Store) ReleaseTermination(ctx context.Context, op capacity.Operation, vmID, holder string) error {
	cond := expression.Name(attrHolder).Equal(expression.Value(holder))
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return fmt.Errorf("build release condition: %w", err)
	}
	_, err = s.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(s.Table), Key: itemKey(opPK(op.NodeID, op.ID), prefixClaim+vmID),
		ConditionExpression: expr.Condition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}, retryRelease)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil // gone, or another holder's since it lapsed
	}
	if err != nil {
		return fmt.Errorf("release termination claim of VM %s on operation %s: %w", vmID, op.ID, classify(err))
	}
	return nil
}

// ClaimReport takes the report claim of op's attempt (see capacity.ReportClaims): free when
// absent, or lapsed and not done (Done: set by versions before the end write marked the
// report published; such a claim is never taken again).
func (s *Store) ClaimReport(ctx context.Context, op capacity.Operation, holder string, now, until time.Time) error {
	free := expression.Name(attrUntilMs).LessThan(expression.Value(now.UnixMilli())).
		And(expression.Name(attrDone).Equal(expression.Value(false)))
	_, err := s.claim(ctx, op, reportSK(op), holder, until, free)
	return err
}

// retryRelease gives a release more attempts than other writes: a claim left behind keeps
// its VM busy, for every later round, until it lapses. A release is one small conditional
// delete; retrying it changes nothing once it has landed.
func retryRelease(o *dynamodb.Options) {
	o.Retryer = retry.AddWithMaxAttempts(retry.AddWithErrorCodes(o.Retryer, "TransactionConflictException"), 10)
}

func reportSK(op capacity.Operation) string {
	return fmt.Sprintf("%s%d", prefixReport, op.CurrentAttempt())
}

// claim puts the claim item sk for holder, conditioned on it being absent, free (as the
// condition says) or holder's own; ErrConflict otherwise. tookOver: it replaced another
// holder's claim.
func (s *Store) claim(ctx context.Context, op capacity.Operation, sk, holder string, until time.Time, free expression.ConditionBuilder) (bool, error) {
	item, err := attributevalue.MarshalMap(claimItem{
		PK: opPK(op.NodeID, op.ID), SK: sk, Type: typeClaim, ReclaimID: op.ID, Holder: holder,
		UntilMs: until.UnixMilli(), ExpiresAt: expiry(until.Add(claimKeptFor)),
	})
	if err != nil {
		return false, fmt.Errorf("encode claim %s: %w", sk, err)
	}
	cond := expression.Name(attrPK).AttributeNotExists().Or(free).Or(expression.Name(attrHolder).Equal(expression.Value(holder)))
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return false, fmt.Errorf("build claim condition: %w", err)
	}
	out, err := s.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.Table), Item: item, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValues: types.ReturnValueAllOld,
	}, retryConflicts)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return false, fmt.Errorf("claim %s of operation %s: %w", sk, op.ID, capacity.ErrConflict)
	}
	if err != nil {
		return false, fmt.Errorf("claim %s of operation %s: %w", sk, op.ID, classify(err))
	}
	prev := attr(out.Attributes, attrHolder)
	return prev != "" && prev != holder, nil
}

// ReleaseReport drops holder's report claim (unless done, by an earlier version).
func (s *Store) ReleaseReport(ctx context.Context, op capacity.Operation, holder string) error {
	cond := expression.Name(attrHolder).Equal(expression.Value(holder)).And(expression.Name(attrDone).Equal(expression.Value(false)))
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return fmt.Errorf("build release condition: %w", err)
	}
	_, err = s.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(s.Table), Key: itemKey(opPK(op.NodeID, op.ID), reportSK(op)),
		ConditionExpression: expr.Condition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}, retryRelease)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil // gone, done, or another holder's since it lapsed
	}
	if err != nil {
		return fmt.Errorf("release report claim of operation %s: %w", op.ID, classify(err))
	}
	return nil
}

var _ capacity.ReportClaims = (*Store)(nil)
