package dynamo

import (
	"context"
	"fmt"
	"slices"

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
	if err := s.listSeeded(ctx, seed); err != nil {
		return err
	}
	if len(seed.Keys) == 0 {
		return nil
	}
	return keys.Put(ctx, seed.Keys...)
}

// listSeeded gives the memberships of the seeded reservations' orgs their lists of ids (see
// lists.go), from the node's reservations as read now (a node may have been seeded earlier).
// Each list is added to the entry's (ADD unions): a commit's put meanwhile is complete
// itself, and what it adds stays. Seeding is provisioning, not run beside live writes.
func (s *Store) listSeeded(ctx context.Context, seed Seed) error {
	orgsOf := map[string][]string{}
	for _, r := range seed.Reservations {
		orgsOf[r.NodeID] = append(append(orgsOf[r.NodeID], r.AllowedOrgIDs...), r.ManagingOrgIDs...)
	}
	for nodeID, orgs := range orgsOf {
		ids := map[string][]string{}
		for after, more := "", true; more; {
			rs, m, err := s.ListReservations(ctx, nodeID, 1000, after)
			if err != nil {
				return fmt.Errorf("seed: list memberships: %w", err)
			}
			for _, r := range rs {
				for _, org := range append(slices.Clone(r.AllowedOrgIDs), r.ManagingOrgIDs...) {
					if !slices.Contains(ids[org], r.ID) {
						ids[org] = append(ids[org], r.ID)
					}
				}
				after = r.ID
			}
			more = m
		}
		slices.Sort(orgs)
		for _, org := range slices.Compact(orgs) {
			if len(ids[org]) > maxListedReservations {
				continue // its entry, as seeded, lists none
			}
			// The entry itself was put with the seed's (seedEntries); only the list is added,
			// as the emulator drops an ADD's SET part.
			m := newMemberItem(nodeID, org)
			upd := expression.Add(expression.Name(attrMemberIDs), expression.Value(&types.AttributeValueMemberSS{Value: ids[org]}))
			expr, err := expression.NewBuilder().WithUpdate(upd).Build()
			if err != nil {
				return fmt.Errorf("seed: build membership list: %w", err)
			}
			if _, err := s.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName: aws.String(s.Table), Key: itemKey(m.PK, m.SK), UpdateExpression: expr.Update(),
				ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
			}); err != nil {
				return fmt.Errorf("seed: list membership of %s on node %s: %w", org, nodeID, classify(err))
			}
		}
	}
	return nil
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
