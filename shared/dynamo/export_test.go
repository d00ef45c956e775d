package dynamo

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// SetOperationsPage sets the byState page size for a test and returns the restore.
func SetOperationsPage(n int) (restore func()) {
	old := operationsPage
	operationsPage = n
	return func() { operationsPage = old }
}

// PutOperation writes an operation item as a commit writes it (without the commit's other
// items), for the listing tests.
func (s *Store) PutOperation(ctx context.Context, op capacity.Operation) error {
	item, err := attributevalue.MarshalMap(newOperationItem(op))
	if err != nil {
		return err
	}
	_, err = s.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.Table), Item: item})
	return err
}

// OpStatePK is the byState key an operation in the state is written under.
func OpStatePK(state capacity.OperationState, opID string) string { return opStatePK(state, opID) }

// LegacyOpStatePK is the unsharded byState key of operations written before the shards.
func LegacyOpStatePK(state capacity.OperationState) string { return legacyOpStatePK(state) }

// OperationKey is the table key of the operation's item.
func OperationKey(nodeID, opID string) map[string]types.AttributeValue {
	return itemKey(opPK(nodeID, opID), skOperation)
}
