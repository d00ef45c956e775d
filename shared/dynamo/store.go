// Package dynamo stores the capacity domain in DynamoDB: one state table (single-table
// design, see items.go), one append-only audit table, and API keys in a table of their own
// (keys.go).
package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// MaxTransactItems is DynamoDB's limit on actions in one TransactWriteItems. The emulator may
// not enforce it, so Commit does.
const MaxTransactItems = 100

// Store implements capacity.Store on DynamoDB.
type Store struct {
	Client     *dynamodb.Client
	Table      string // state table
	AuditTable string
	// KeysTable holds API keys (see Keys). Only the api function and provisioning need it.
	KeysTable string
}

var _ capacity.Store = (*Store)(nil)

// New returns a store on the given tables.
func New(client *dynamodb.Client, stateTable, auditTable string) *Store {
	return &Store{Client: client, Table: stateTable, AuditTable: auditTable}
}

// Keys returns the API key store on the store's client and KeysTable.
func (s *Store) Keys() *Keys { return &Keys{Client: s.Client, Table: s.KeysTable} }

// LoadNode reads a node's partition with one strongly consistent Query (more pages only if
// the partition outgrows 1 MB). Reclaim operations, terminated VMs and other callers'
// idempotency records are filtered out: no decision reads them.
func (s *Store) LoadNode(ctx context.Context, nodeID, idempotencyScope string) (*capacity.NodeState, error) {
	keyCond := expression.Key(table.PartitionKey).Equal(expression.Value(nodePK(nodeID)))
	sk := expression.Name(table.SortKey)
	filter := expression.And(
		expression.Not(sk.BeginsWith(prefixOperation)),
		expression.Or(expression.Not(sk.BeginsWith(prefixIdempotent)), sk.Equal(expression.Value(prefixIdempotent+idempotencyScope))),
		expression.Or(expression.Name("State").AttributeNotExists(), expression.Name("State").NotEqual(expression.Value(capacity.VMTerminated))),
	)
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).WithFilter(filter).Build()
	if err != nil {
		return nil, fmt.Errorf("build node query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.Table),
		KeyConditionExpression:    expr.KeyCondition(),
		FilterExpression:          expr.Filter(),
		ExpressionAttributeNames:  expr.Names(),
		ExpressionAttributeValues: expr.Values(),
		ConsistentRead:            aws.Bool(true),
	}
	st := &capacity.NodeState{}
	found := false
	for page := dynamodb.NewQueryPaginator(s.Client, in); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("query partition of node %s: %w", nodeID, classify(err))
		}
		for _, item := range out.Items {
			ok, err := s.addItem(st, item)
			if err != nil {
				return nil, fmt.Errorf("decode item of node %s: %w", nodeID, err)
			}
			found = found || ok
		}
	}
	if !found {
		return nil, capacity.Errorf(capacity.CodeNotFound, "node %s not found", nodeID)
	}
	return st, nil
}

// addItem decodes one partition item into the state; it reports whether it was the node.
func (s *Store) addItem(st *capacity.NodeState, item map[string]types.AttributeValue) (bool, error) {
	var k key
	if err := attributevalue.UnmarshalMap(item, &k); err != nil {
		return false, err
	}
	switch k.Type {
	case typeNode:
		var it nodeItem
		err := attributevalue.UnmarshalMap(item, &it)
		st.Node = it.Node
		return true, err
	case typeReservation:
		var it reservationItem
		err := attributevalue.UnmarshalMap(item, &it)
		st.Reservations = append(st.Reservations, it.Reservation)
		return false, err
	case typeVM:
		var it vmItem
		err := attributevalue.UnmarshalMap(item, &it)
		st.VMs = append(st.VMs, it.VM)
		return false, err
	case typeIdempotency:
		var it idempotencyItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return false, err
		}
		rec := it.record()
		st.Idempotency = &rec
	}
	return false, nil
}

// Commit writes a decision in one TransactWriteItems, every item conditioned on what the
// decision read.
func (s *Store) Commit(ctx context.Context, c capacity.Commit) error {
	items, err := s.transactItems(c)
	if err != nil {
		return err
	}
	if len(items) > MaxTransactItems {
		return fmt.Errorf("commit on node %s needs %d transaction actions; DynamoDB allows %d", c.Node.ID, len(items), MaxTransactItems)
	}
	var attempts attemptLog
	_, err = s.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}, attempts.option)
	if err != nil {
		if attempts.ambiguous() {
			// An earlier attempt may have landed, and a later one then failed on the state it
			// left (the ClientRequestToken that makes AWS answer such a retry with success
			// lasts 10 minutes and is not honoured everywhere): only a read can tell.
			return fmt.Errorf("commit on node %s: %w: %w", c.Node.ID, capacity.ErrAmbiguous, err)
		}
		if throttled(err) {
			return fmt.Errorf("commit on node %s: %w", c.Node.ID, classify(err))
		}
		var canceled *types.TransactionCanceledException
		if errors.As(err, &canceled) && c.NewVM != nil && putFailed(items, canceled, prefixVM+c.NewVM.ID) {
			// The id is taken, by a VM the decision could not see (terminated ones are not
			// read): not a race that a new round could win.
			return fmt.Errorf("commit on node %s: VM %s: %w", c.Node.ID, c.NewVM.ID, capacity.ErrVMExists)
		}
		if errors.As(err, &canceled) && retryable(canceled) {
			return fmt.Errorf("commit on node %s: %w (%s)", c.Node.ID, capacity.ErrConflict, reasons(canceled))
		}
		return fmt.Errorf("commit on node %s: %w", c.Node.ID, err)
	}
	return nil
}

// putFailed reports whether the cancelled transaction's put of the item with sort key sk
// failed its condition (the item already exists).
func putFailed(items []types.TransactWriteItem, e *types.TransactionCanceledException, sk string) bool {
	for i, r := range e.CancellationReasons {
		if i >= len(items) || items[i].Put == nil || aws.ToString(r.Code) != "ConditionalCheckFailed" {
			continue
		}
		if v, ok := items[i].Put.Item[table.SortKey].(*types.AttributeValueMemberS); ok && v.Value == sk {
			return true
		}
	}
	return false
}

// Landed reports whether a commit that failed ambiguously was applied after all, by a
// strongly consistent read of its audit record (written only by that commit's transaction).
func (s *Store) Landed(ctx context.Context, c capacity.Commit) (bool, error) {
	a := newAuditItem(c.Audit)
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.AuditTable), Key: itemKey(a.PK, a.SK), ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String(table.PartitionKey),
	})
	if err != nil {
		return false, fmt.Errorf("read audit record %s of an ambiguous commit: %w", c.Audit.ID, err)
	}
	return out.Item != nil, nil
}

// classify marks an error of a call that DynamoDB refused for capacity with
// capacity.ErrThrottled (nothing was applied; the caller answers 503 throttled, not 500).
func classify(err error) error {
	if throttled(err) {
		return fmt.Errorf("%w: %w", capacity.ErrThrottled, err)
	}
	return err
}

// throttled reports whether DynamoDB refused a transaction for capacity, which applies
// nothing: the throttling exceptions the SDK gave up retrying, or a cancellation whose
// reasons are throttling (the SDK does not retry those) and no condition failure or conflict.
func throttled(err error) bool {
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) {
		throttle := false
		for _, r := range canceled.CancellationReasons {
			switch aws.ToString(r.Code) {
			case "ThrottlingError", "ProvisionedThroughputExceeded":
				throttle = true
			case "", "None":
			default:
				return false
			}
		}
		return throttle
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded":
			return true
		}
	}
	return false
}

// attemptLog records the outcome of each attempt the SDK's retryer makes of one call.
type attemptLog struct {
	mu   sync.Mutex
	errs []error
}

// option adds the log to one call's stack, inside the retry loop.
func (l *attemptLog) option(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Finalize.Insert(middleware.FinalizeMiddlewareFunc("capacity.AttemptLog",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleFinalize(ctx, in)
				l.mu.Lock()
				l.errs = append(l.errs, err)
				l.mu.Unlock()
				return out, md, err
			}), "Retry", middleware.After)
	})
}

// ambiguous reports whether some attempt failed in a way that leaves open whether it was
// applied: no answer (timeout, broken connection) or a server error. An answer that is a
// client error (a 4xx, such as a cancellation or throttling) applied nothing.
func (l *attemptLog) ambiguous() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		if err == nil {
			continue
		}
		var status interface{ HTTPStatusCode() int }
		if errors.As(err, &status) && status.HTTPStatusCode() != 0 {
			if code := status.HTTPStatusCode(); code >= 400 && code < 500 {
				continue
			}
			return true
		}
		var api smithy.APIError
		if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient {
			continue
		}
		return true
	}
	return false
}

// retryable reports whether a cancelled transaction lost to another write (and so a fresh
// read and decision may succeed), rather than failing for a reason a retry cannot fix.
func retryable(e *types.TransactionCanceledException) bool {
	for _, r := range e.CancellationReasons {
		switch aws.ToString(r.Code) {
		case "ConditionalCheckFailed", "TransactionConflict":
			return true
		}
	}
	return false
}

func reasons(e *types.TransactionCanceledException) string {
	var out []string
	for i, r := range e.CancellationReasons {
		if c := aws.ToString(r.Code); c != "" && c != "None" {
			out = append(out, fmt.Sprintf("item %d: %s", i, c))
		}
	}
	return strings.Join(out, ", ")
}

func (s *Store) transactItems(c capacity.Commit) ([]types.TransactWriteItem, error) {
	var items []types.TransactWriteItem
	add := func(it types.TransactWriteItem, err error) error {
		if err != nil {
			return err
		}
		items = append(items, it)
		return nil
	}
	nodeKey := itemKey(nodePK(c.Node.ID), skNode)
	if c.BumpNode {
		err := add(s.update(nodeKey, versionIs(c.Node.Version), bump(expression.UpdateBuilder{}, c.Node.Version)))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", c.Node.ID, err)
		}
	} else if err := add(s.check(nodeKey, versionIs(c.Node.Version))); err != nil {
		return nil, fmt.Errorf("node %s: %w", c.Node.ID, err)
	}
	if r := c.Reservation; r != nil {
		upd := expression.Set(expression.Name("ReleasedUnitIDs"), expression.Value(r.ReleasedUnitIDs)).
			Set(expression.Name("UpdatedAt"), expression.Value(r.UpdatedAt))
		err := add(s.update(itemKey(nodePK(r.NodeID), prefixReserv+r.ID), versionIs(r.Version), bump(upd, r.Version)))
		if err != nil {
			return nil, fmt.Errorf("reservation %s: %w", r.ID, err)
		}
	}
	for _, vm := range c.Evict {
		cond := versionIs(vm.Version).And(expression.Name("State").Equal(expression.Value(vm.State)))
		upd := expression.Set(expression.Name("State"), expression.Value(capacity.VMTerminating)).
			Set(expression.Name("ReclaimID"), expression.Value(c.Operation.ID)).
			Set(expression.Name("UpdatedAt"), expression.Value(c.Operation.CreatedAt))
		if err := add(s.update(itemKey(nodePK(vm.NodeID), prefixVM+vm.ID), cond, bump(upd, vm.Version))); err != nil {
			return nil, fmt.Errorf("VM %s: %w", vm.ID, err)
		}
	}
	if c.NewVM != nil {
		if err := add(s.putNew(s.Table, newVMItem(*c.NewVM), nil)); err != nil {
			return nil, fmt.Errorf("VM %s: %w", c.NewVM.ID, err)
		}
	}
	if c.Operation != nil {
		if err := add(s.putNew(s.Table, newOperationItem(*c.Operation), nil)); err != nil {
			return nil, fmt.Errorf("operation %s: %w", c.Operation.ID, err)
		}
	}
	if c.Idempotency != nil {
		// A record past its expiry may still exist until TTL deletes it; it no longer binds.
		expired := expression.Name(table.TTLAttribute).LessThanEqual(expression.Value(c.Idempotency.CreatedAt.Unix()))
		if err := add(s.putNew(s.Table, newIdempotencyItem(*c.Idempotency), &expired)); err != nil {
			return nil, fmt.Errorf("idempotency record: %w", err)
		}
	}
	if err := add(s.putNew(s.AuditTable, newAuditItem(c.Audit), nil)); err != nil {
		return nil, fmt.Errorf("audit record: %w", err)
	}
	return items, nil
}

func itemKey(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		table.PartitionKey: &types.AttributeValueMemberS{Value: pk},
		table.SortKey:      &types.AttributeValueMemberS{Value: sk},
	}
}

func versionIs(v int64) expression.ConditionBuilder {
	return expression.Name("Version").Equal(expression.Value(v))
}

func bump(u expression.UpdateBuilder, v int64) expression.UpdateBuilder {
	return u.Set(expression.Name("Version"), expression.Value(v+1))
}

func (s *Store) update(k map[string]types.AttributeValue, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build update: %w", err)
	}
	return types.TransactWriteItem{Update: &types.Update{
		TableName: aws.String(s.Table), Key: k,
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}, nil
}

func (s *Store) check(k map[string]types.AttributeValue, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build condition check: %w", err)
	}
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
		TableName: aws.String(s.Table), Key: k, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}, nil
}

// putNew puts an item that must not exist yet (or, with orElse, may exist if orElse holds).
func (s *Store) putNew(tableName string, v any, orElse *expression.ConditionBuilder) (types.TransactWriteItem, error) {
	item, err := attributevalue.MarshalMap(v)
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("encode item: %w", err)
	}
	cond := expression.Name(table.PartitionKey).AttributeNotExists()
	if orElse != nil {
		cond = cond.Or(*orElse)
	}
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build put condition: %w", err)
	}
	put := &types.Put{
		TableName: aws.String(tableName), Item: item, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}
	return types.TransactWriteItem{Put: put}, nil
}

// AppendAudit appends one record to the audit table; it never overwrites.
func (s *Store) AppendAudit(ctx context.Context, rec capacity.AuditRecord) error {
	it, err := s.putNew(s.AuditTable, newAuditItem(rec), nil)
	if err != nil {
		return fmt.Errorf("audit record %s: %w", rec.ID, err)
	}
	p := it.Put
	_, err = s.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: p.TableName, Item: p.Item, ConditionExpression: p.ConditionExpression,
		ExpressionAttributeNames: p.ExpressionAttributeNames, ExpressionAttributeValues: p.ExpressionAttributeValues,
	})
	if err != nil {
		return fmt.Errorf("append audit record %s: %w", rec.ID, err)
	}
	return nil
}
