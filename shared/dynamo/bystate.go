package dynamo

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// OperationsInState lists operations in a state that entered it before the time and, when
// after is set, sort after that cursor (the next of an earlier page), oldest first, at most
// limit; and the cursor of the next page ("" when none is left). It reads every shard of the
// state's byState keys (and the unsharded key of operations not yet re-keyed by
// capacity-migrate) and merges them by the time each entered the state: a k-way merge that
// reads each shard only as far as the page needs.
func (s *Store) OperationsInState(ctx context.Context, state capacity.OperationState, before time.Time, after string, limit int) ([]capacity.Operation, string, error) {
	return s.OperationsInStateBetween(ctx, state, time.Time{}, before, after, limit)
}

// OperationsInStateBetween lists as OperationsInState does, only the operations that entered
// the state at or after since (zero: any), and up to a second before it: the lower bound is
// since's whole second without its zone, which sorts below every key of that second (their
// fractions are cut to their last non-zero digit, so they do not sort as times within one)
// and above every key of an earlier one. The shards' queries read nothing older.
func (s *Store) OperationsInStateBetween(ctx context.Context, state capacity.OperationState, since, before time.Time, after string, limit int) ([]capacity.Operation, string, error) {
	upTo := before.UTC().Format(time.RFC3339Nano)
	if !since.IsZero() {
		if from := since.UTC().Format("2006-01-02T15:04:05"); from > after {
			after = from // no key equals it (each ends in #<operation id>): none is dropped
		}
	}
	if limit <= 0 || (after != "" && after >= upTo) {
		return nil, "", nil
	}
	shards := make([]*stateShard, 0, OpStateShards+1)
	for i := range OpStateShards {
		shards = append(shards, &stateShard{pk: opStateShardPK(state, i)})
	}
	shards = append(shards, &stateShard{pk: legacyOpStatePK(state)})
	// Each shard holds about 1/shards of the page; a shard that holds more is read on.
	first := min(operationsPage, limit/len(shards)+2)
	ops := make([]capacity.Operation, 0, min(limit, operationsPage))
	next := ""
	for len(ops) < limit {
		if err := s.fillShards(ctx, shards, after, upTo, first); err != nil {
			return nil, "", fmt.Errorf("query %s operations: %w", state, err)
		}
		var oldest *stateShard
		for _, sh := range shards {
			if len(sh.items) > 0 && (oldest == nil || sh.items[0].GSI1SK < oldest.items[0].GSI1SK) {
				oldest = sh
			}
		}
		if oldest == nil {
			return ops, "", nil // every shard read to its end
		}
		it := oldest.items[0]
		oldest.items = oldest.items[1:]
		ops = append(ops, it.operation()) // without outcomes: GetOperation reads those
		next = it.GSI1SK
	}
	return ops, next, nil
}

// stateShard is one byState key being merged: its items read and not yet taken, and where
// its next page starts.
type stateShard struct {
	pk    string
	items []operationItem
	start map[string]types.AttributeValue // LastEvaluatedKey of the last page
	read  bool                            // a page was read
}

func (sh *stateShard) done() bool { return sh.read && sh.start == nil }

// fillShards reads on every shard whose read items are all taken and that has more, at most
// stateQueries at once, until each has an item to merge or is read to its end (a page may
// hold none: only the cursor's own item).
func (s *Store) fillShards(ctx context.Context, shards []*stateShard, after, upTo string, first int) error {
	for {
		var empty []*stateShard
		for _, sh := range shards {
			if len(sh.items) == 0 && !sh.done() {
				empty = append(empty, sh)
			}
		}
		if len(empty) == 0 {
			return nil
		}
		if err := s.readShards(ctx, empty, after, upTo, first); err != nil {
			return err
		}
	}
}

// readShards reads the next page of each shard, at most stateQueries at once.
func (s *Store) readShards(ctx context.Context, shards []*stateShard, after, upTo string, first int) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, stateQueries)
	)
	for _, sh := range shards {
		size := first
		if sh.read {
			size = operationsPage // this shard holds more than its share: read on in full pages
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := s.readShard(ctx, sh, after, upTo, size); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// moreAttempts gives a shard's query more of the SDK's attempts (with its backoff) than a
// single read's: a listing needs every shard's, so one throttled shard would fail it.
func moreAttempts(o *dynamodb.Options) {
	o.Retryer = retry.AddWithMaxAttempts(o.Retryer, 8)
}

// stateQueries bounds the byState queries in flight at once for one listing.
const stateQueries = 8

// readShard reads one page of a shard: operations that entered the state before upTo and,
// with a cursor, after it.
func (s *Store) readShard(ctx context.Context, sh *stateShard, after, upTo string, size int) error {
	sk := expression.Key(attrGSI1SK)
	cond := sk.LessThan(expression.Value(upTo))
	if after != "" {
		// BETWEEN is inclusive: the cursor's own item is dropped below. No key equals upTo
		// (every one ends in #<operation id>).
		cond = sk.Between(expression.Value(after), expression.Value(upTo))
	}
	expr, err := expression.NewBuilder().WithKeyCondition(expression.Key(attrGSI1PK).Equal(expression.Value(sh.pk)).And(cond)).Build()
	if err != nil {
		return fmt.Errorf("build index query: %w", err)
	}
	out, err := s.Client.Query(ctx, &dynamodb.QueryInput{
		TableName: aws.String(s.Table), IndexName: aws.String(table.ByStateIndex),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(),
		ExpressionAttributeValues: expr.Values(), ScanIndexForward: aws.Bool(true),
		Limit: aws.Int32(int32(max(1, size))), ExclusiveStartKey: sh.start,
	}, moreAttempts)
	if err != nil {
		return fmt.Errorf("%s: %w", sh.pk, classify(err))
	}
	sh.read, sh.start = true, out.LastEvaluatedKey
	for _, item := range out.Items {
		var it operationItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return fmt.Errorf("decode operation: %w", err)
		}
		if it.GSI1SK == after {
			continue
		}
		sh.items = append(sh.items, it)
	}
	return nil
}

// operationsPage is the byState page size of a shard read on past its share (a variable for
// the paging test).
var operationsPage = 100
