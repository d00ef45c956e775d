package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// Rate limiter items (table.Limits): pk KEY#<keyId>, sk RATE, Tat the key's theoretical
// arrival time in microseconds since the epoch (a number, so that a write can compare it and
// add to it), expiresAt its TTL.
const (
	skRate  = "RATE"
	attrTat = "Tat"
)

func ratePK(keyID string) string { return "KEY#" + keyID }

var _ capacity.RateStore = (*Store)(nil)

// TakeRate spends one call of the key's bucket: one conditional UpdateItem of the key's item
// in LimitsTable (see capacity.RateStep for the two branches). A refused condition is no
// error: DynamoDB returns the stored item with it (ReturnValuesOnConditionCheckFailure
// ALL_OLD), so the limiter learns the TAT without a read; the local emulator returns nothing,
// and the TAT is then unknown (as it is on AWS when no item exists).
func (s *Store) TakeRate(ctx context.Context, keyID string, step capacity.RateStep) (capacity.RateTake, error) {
	if s.LimitsTable == "" {
		return capacity.RateTake{}, errors.New("take rate: no limits table configured")
	}
	num := func(n int64) types.AttributeValue {
		return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
	}
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(s.LimitsTable),
		Key:       itemKey(ratePK(keyID), skRate),
		// Names and values written out: few, and none a prefix of another.
		ExpressionAttributeNames: map[string]string{"#tat": attrTat, "#exp": table.TTLAttribute},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":now": num(step.Now), ":exp": num(step.Expires.Unix()),
		},
		ReturnValues:                        types.ReturnValueUpdatedNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if step.Busy {
		in.ConditionExpression = aws.String("#tat > :now AND #tat <= :limit")
		in.UpdateExpression = aws.String("SET #tat = #tat + :interval, #exp = :exp")
		in.ExpressionAttributeValues[":limit"] = num(step.Now + step.Tolerance)
		in.ExpressionAttributeValues[":interval"] = num(step.Interval)
	} else {
		in.ConditionExpression = aws.String("attribute_not_exists(#tat) OR #tat <= :now")
		in.UpdateExpression = aws.String("SET #tat = :next, #exp = :exp")
		in.ExpressionAttributeValues[":next"] = num(step.Now + step.Interval)
	}
	out, err := s.Client.UpdateItem(ctx, in)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		tat, known := tatOf(ccf.Item)
		return capacity.RateTake{TAT: tat, Known: known}, nil
	}
	if err != nil {
		return capacity.RateTake{}, fmt.Errorf("take rate of key %s: %w", keyID, classify(err))
	}
	tat, known := tatOf(out.Attributes)
	if !known {
		return capacity.RateTake{}, fmt.Errorf("take rate of key %s: the answer has no %s", keyID, attrTat)
	}
	return capacity.RateTake{Applied: true, TAT: tat, Known: true}, nil
}

// tatOf reads Tat from an item (false when absent or not a whole number).
func tatOf(item map[string]types.AttributeValue) (int64, bool) {
	n, ok := item[attrTat].(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	return v, err == nil
}
