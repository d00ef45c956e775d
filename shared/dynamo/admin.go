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

// Seed writes provisioning data (nodes, reservations, VMs, API keys) as given (terminated VMs
// into their node's history), each item
// created only if absent: provisioning never overwrites live state. It is the admin path
// used by the local stack's demo data and by tests, not by the public API. Keys go to the
// keys table (Store.KeysTable), everything else to the state table.
type Seed struct {
	Nodes        []capacity.Node
	Reservations []capacity.Reservation
	VMs          []capacity.VM
	Keys         []capacity.APIKey
	// Operations are reclaim operations as a commit writes them (without outcomes): a
	// backlog for the reconciler's tests.
	Operations []capacity.Operation
}

// Put writes the seed, item by item.
func (s *Store) Put(ctx context.Context, seed Seed) error {
	keys := s.Keys()
	if len(seed.Keys) > 0 {
		// Refuse bad keys before writing anything else.
		if err := keys.check(seed.Keys); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	var items []any
	for _, n := range seed.Nodes {
		if n.AuditHead.Seq == 0 && !n.AuditHead.Start.Pinned() {
			// A new node's chain starts empty: pinned so, nothing can be planted before it.
			n.AuditHead.Start = capacity.ChainStartOf(nil)
		}
		items = append(items, newNodeItem(n))
	}
	for _, r := range seed.Reservations {
		items = append(items, newReservationItem(r))
	}
	for _, v := range seed.VMs {
		if v.State == capacity.VMTerminated {
			items = append(items, newHistoryItem(v, s.retention())) // only live VMs are decided on
			continue
		}
		items = append(items, newVMItem(v))
	}
	for _, o := range seed.Operations {
		items = append(items, newOperationItem(o))
	}
	if err := putNew(ctx, s.Client, s.Table, items); err != nil {
		return err
	}
	// The list index entries are true of what was seeded, whatever was there before: put
	// whether or not they exist (a test seeds reservations on a node seeded earlier).
	for _, v := range seedEntries(seed) {
		item, err := attributevalue.MarshalMap(v)
		if err != nil {
			return fmt.Errorf("encode seed list entry: %w", err)
		}
		if _, err := s.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.Table), Item: item}); err != nil {
			return fmt.Errorf("put seed list entry %s %s: %w", attr(item, table.PartitionKey), attr(item, table.SortKey), err)
		}
	}
	if len(seed.Keys) == 0 {
		return nil
	}
	return keys.Put(ctx, seed.Keys...)
}

// putNew puts each item into the table unless an item with its key exists.
func putNew(ctx context.Context, client *dynamodb.Client, tableName string, items []any) error {
	cond, err := expression.NewBuilder().WithCondition(expression.Name(table.PartitionKey).AttributeNotExists()).Build()
	if err != nil {
		return fmt.Errorf("build seed condition: %w", err)
	}
	for _, v := range items {
		item, err := attributevalue.MarshalMap(v)
		if err != nil {
			return fmt.Errorf("encode seed item: %w", err)
		}
		_, err = client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(tableName), Item: item,
			ConditionExpression: cond.Condition(), ExpressionAttributeNames: cond.Names(),
		})
		if err != nil {
			return fmt.Errorf("put seed item %s %s into %s: %w", attr(item, table.PartitionKey), attr(item, table.SortKey), tableName, err)
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
