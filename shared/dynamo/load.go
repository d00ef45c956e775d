package dynamo

import (
	"context"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// LoadNode reads the node's decision partition with one strongly consistent Query: the node,
// its reservations and its live VMs (the key condition sk >= "NODE" skips the idempotency
// records, which sort before; terminated VMs and operations live under other keys), and for a
// Store with ReadResealedAgentKeys the node's resealed agent key. The
// caller's own idempotency record, when a scope is given, is one consistent GetItem run
// alongside. Items and bytes read go to the context's CallStats.
func (s *Store) LoadNode(ctx context.Context, nodeID, idempotencyScope string) (*capacity.NodeState, error) {
	var (
		idem    *capacity.IdempotencyRecord
		idemErr error
		wg      sync.WaitGroup
	)
	if idempotencyScope != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			idem, idemErr = s.idempotencyRecord(ctx, nodeID, idempotencyScope)
		}()
	}
	st, err := s.queryNode(ctx, nodeID)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if idemErr != nil {
		return nil, idemErr
	}
	st.Idempotency = idem
	return st, nil
}

func (s *Store) queryNode(ctx context.Context, nodeID string) (*capacity.NodeState, error) {
	keyCond := expression.Key(attrPK).Equal(expression.Value(nodePK(nodeID))).
		And(expression.Key(attrSK).GreaterThanEqual(expression.Value(skNode)))
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).Build()
	if err != nil {
		return nil, fmt.Errorf("build node query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.Table),
		KeyConditionExpression:    expr.KeyCondition(),
		ExpressionAttributeNames:  expr.Names(),
		ExpressionAttributeValues: expr.Values(),
		ConsistentRead:            aws.Bool(true),
	}
	st := &capacity.NodeState{}
	found := false
	var resealed *capacity.ResealedAgentKey
	stats := capacity.CallStatsFrom(ctx)
	for page := dynamodb.NewQueryPaginator(s.Client, in); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("query partition of node %s: %w", nodeID, classify(err))
		}
		for _, item := range out.Items {
			stats.AddRead(1, ItemSize(item))
			if attr(item, attrType) == typeResealedAgentKey {
				if s.ReadResealedAgentKeys {
					var it resealedAgentKeyItem
					if err := attributevalue.UnmarshalMap(item, &it); err != nil {
						return nil, fmt.Errorf("decode resealed agent key of node %s: %w", nodeID, err)
					}
					resealed = it.resealed()
				}
				continue
			}
			ok, err := addItem(st, item)
			if err != nil {
				return nil, fmt.Errorf("decode item of node %s: %w", nodeID, err)
			}
			found = found || ok
		}
	}
	if !found {
		return nil, capacity.Errorf(capacity.CodeNotFound, "node %s not found", nodeID)
	}
	st.Node.ResealedAgentKey = resealed
	return st, nil
}

// idempotencyRecord reads the caller's Idempotency-Key record, or nil: the record under the
// scope, else one under the scope the same call had before scopes named the calling key
// (capacity.LegacyIdempotencyScope), read alongside so that a retry across that change
// replays. Legacy records expire within 24 h of the change, and no new one is written.
func (s *Store) idempotencyRecord(ctx context.Context, nodeID, scope string) (*capacity.IdempotencyRecord, error) {
	return readScoped(ctx, scope, func(scope string) (*capacity.IdempotencyRecord, error) {
		out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(s.Table), Key: idempotencyKey(nodeID, scope), ConsistentRead: aws.Bool(true),
		})
		if err != nil {
			return nil, fmt.Errorf("read idempotency record of node %s: %w", nodeID, classify(err))
		}
		if out.Item == nil {
			return nil, nil
		}
		capacity.CallStatsFrom(ctx).AddRead(1, ItemSize(out.Item))
		var it idempotencyItem
		if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
			return nil, fmt.Errorf("decode idempotency record of node %s: %w", nodeID, err)
		}
		rec := it.record()
		return &rec, nil
	})
}

// readScoped reads the record under scope and, concurrently, the one under its legacy scope
// (if it has one); the first wins.
func readScoped(ctx context.Context, scope string, read func(scope string) (*capacity.IdempotencyRecord, error)) (*capacity.IdempotencyRecord, error) {
	legacy := capacity.LegacyIdempotencyScope(scope)
	if legacy == "" {
		return read(scope)
	}
	var (
		old    *capacity.IdempotencyRecord
		oldErr error
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		old, oldErr = read(legacy)
	}()
	rec, err := read(scope)
	wg.Wait()
	switch {
	case err != nil:
		return nil, err
	case rec != nil:
		return rec, nil
	case oldErr != nil:
		return nil, fmt.Errorf("legacy scope: %w", oldErr)
	}
	return old, nil
}

// addItem decodes one decision-partition item into the state; it reports whether it was the
// node. Items of other types (the first layout's operations, until migrated) and terminated
// VMs (likewise) are skipped.
func addItem(st *capacity.NodeState, item map[string]types.AttributeValue) (bool, error) {
	switch attr(item, attrType) {
	case typeNode:
		var it nodeItem
		err := attributevalue.UnmarshalMap(item, &it)
		st.Node = it.node()
		return true, err
	case typeReservation:
		var it reservationItem
		err := attributevalue.UnmarshalMap(item, &it)
		st.Reservations = append(st.Reservations, it.reservation())
		return false, err
	case typeVM:
		var it vmItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return false, err
		}
		if vm := it.vm(); vm.State != capacity.VMTerminated {
			st.VMs = append(st.VMs, vm)
		}
	}
	return false, nil
}
