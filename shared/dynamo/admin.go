package dynamo

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// LookupKey returns the API key stored under the SHA-256 hash of its secret, or nil.
func (s *Store) LookupKey(ctx context.Context, hash string) (*capacity.APIKey, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.Table),
		Key:       itemKey(apiKeyPK(hash), skAPIKey),
	})
	if err != nil {
		return nil, fmt.Errorf("get API key: %w", err)
	}
	if out.Item == nil {
		return nil, nil
	}
	var it apiKeyItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return nil, fmt.Errorf("decode API key: %w", err)
	}
	return &it.APIKey, nil
}

// Seed writes provisioning data (nodes, reservations, VMs, API keys) as given, each item
// created only if absent: provisioning never overwrites live state. It is the admin path
// used by the local stack's demo data and by tests, not by the public API.
type Seed struct {
	Nodes        []capacity.Node
	Reservations []capacity.Reservation
	VMs          []capacity.VM
	Keys         []capacity.APIKey
}

// Put writes the seed, item by item.
func (s *Store) Put(ctx context.Context, seed Seed) error {
	var items []any
	for _, n := range seed.Nodes {
		items = append(items, newNodeItem(n))
	}
	for _, r := range seed.Reservations {
		items = append(items, newReservationItem(r))
	}
	for _, v := range seed.VMs {
		items = append(items, newVMItem(v))
	}
	for _, k := range seed.Keys {
		items = append(items, newAPIKeyItem(k))
	}
	cond, err := expression.NewBuilder().WithCondition(expression.Name(table.PartitionKey).AttributeNotExists()).Build()
	if err != nil {
		return fmt.Errorf("build seed condition: %w", err)
	}
	for _, v := range items {
		item, err := attributevalue.MarshalMap(v)
		if err != nil {
			return fmt.Errorf("encode seed item: %w", err)
		}
		_, err = s.Client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(s.Table), Item: item,
			ConditionExpression: cond.Condition(), ExpressionAttributeNames: cond.Names(),
		})
		if err != nil {
			return fmt.Errorf("put seed item %s %s: %w", attr(item, table.PartitionKey), attr(item, table.SortKey), err)
		}
	}
	return nil
}

func attr(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}
