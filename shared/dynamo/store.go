// Package dynamo stores the capacity domain in DynamoDB: one state table (single-table
// design, see items.go), one append-only audit table, and API keys in a table of their own
// (keys.go).
package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/capacity"
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
	// LimitsTable holds each API key's rate limiter state (TakeRate). Only the api function
	// needs it.
	LimitsTable string
	// Retention is how long terminated VMs and ended operations (with their outcomes) are
	// kept before TTL deletes them: DefaultRetention when zero, never less than MinRetention.
	Retention time.Duration
}

const (
	// DefaultRetention keeps history for 400 days.
	DefaultRetention = 400 * 24 * time.Hour
	// MinRetention: GET of a finished operation answers for at least 90 days.
	MinRetention = 90 * 24 * time.Hour
)

func (s *Store) retention() time.Duration {
	if s.Retention == 0 {
		return DefaultRetention
	}
	return max(s.Retention, MinRetention)
}

var _ capacity.Store = (*Store)(nil)

// New returns a store on the given tables.
func New(client *dynamodb.Client, stateTable, auditTable string) *Store {
	return &Store{Client: client, Table: stateTable, AuditTable: auditTable}
}

// Keys returns the API key store on the store's client and KeysTable.
func (s *Store) Keys() *Keys { return &Keys{Client: s.Client, Table: s.KeysTable} }

// LoadNode reads the node's decision partition with one strongly consistent Query: the node,
// its reservations and its live VMs (the key condition sk >= "NODE" skips the idempotency
// records, which sort before; terminated VMs and operations live under other keys). The
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
	stats := capacity.CallStatsFrom(ctx)
	for page := dynamodb.NewQueryPaginator(s.Client, in); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("query partition of node %s: %w", nodeID, classify(err))
		}
		for _, item := range out.Items {
			stats.AddRead(1, ItemSize(item))
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

// Commit writes a decision in one TransactWriteItems, every item conditioned on what the
// decision read.
//
// The node's Update also appends the audit record to the node's chain at the head the
// decision read. A transaction that fails only because the head moved (a dry run or refusal
// of another call appended a record; the node's Version is as read) goes again on the new
// head without a new decision, up to headTries: what the decision read has not changed.
func (s *Store) Commit(ctx context.Context, c capacity.Commit) error {
	// A VM id that is taken is not a race a new round could win: the VM holding it is one the
	// decision could not see (terminated ones, in the node's history).
	var vmTaken func([]types.TransactWriteItem, *types.TransactionCanceledException) error
	if c.NewVM != nil {
		vmTaken = func(items []types.TransactWriteItem, e *types.TransactionCanceledException) error {
			if vmIDTaken(items, e, c.NewVM.ID) {
				return fmt.Errorf("VM %s: %w", c.NewVM.ID, capacity.ErrVMExists)
			}
			return nil
		}
	}
	return s.transactAtHead(ctx, "commit on node "+c.Node.ID, c.Node, func(head capacity.AuditHead, pin *capacity.ChainStart) ([]types.TransactWriteItem, error) {
		c.Node.AuditHead = head
		return s.transactItems(c, pin)
	}, vmTaken)
}

// transactAtHead runs the transaction of a node's decision that items builds for the node's
// audit head: the node item's Update first (its Version and head as read), the audit record
// last. When it fails only because the head moved (another call appended a record: the
// node's Version is as read and no other item failed), it is built again on the new head and
// goes again, after a short backoff, up to headTries: what the decision read has not changed,
// so no new decision is needed. refuse, if set, names a cancellation no round could win. A
// head that pins no start gets its pin (startPin) in the same transaction.
func (s *Store) transactAtHead(ctx context.Context, what string, node capacity.Node,
	items func(capacity.AuditHead, *capacity.ChainStart) ([]types.TransactWriteItem, error),
	refuse func([]types.TransactWriteItem, *types.TransactionCanceledException) error) error {
	head := node.AuditHead
	for try := 1; ; try++ {
		pin, err := s.startPin(ctx, s.nodeHead(node.ID), head)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		tx, err := items(head, pin)
		if err != nil {
			return err
		}
		if len(tx) > MaxTransactItems {
			return fmt.Errorf("%s needs %d transaction actions; DynamoDB allows %d", what, len(tx), MaxTransactItems)
		}
		var own func(*types.TransactionCanceledException) error
		if refuse != nil {
			own = func(e *types.TransactionCanceledException) error { return refuse(tx, e) }
		}
		canceled, err := s.transactCanceled(ctx, what, tx, own)
		if err == nil || try >= headTries || canceled == nil || !errors.Is(err, capacity.ErrConflict) {
			return err
		}
		newHead, item, moved, herr := s.headMoved(ctx, s.nodeHead(node.ID), canceled, 0, head)
		if herr != nil {
			return fmt.Errorf("%w (and reading the audit head: %w)", err, herr)
		}
		if !moved || attr(item, attrType) != typeNode || versionOf(item) != node.Version || !othersHeld(canceled, len(tx)-1) {
			return err
		}
		head = newHead
		if err := headBackoff(ctx, try); err != nil {
			return err
		}
	}
}

// othersHeld reports whether only the chain failed its conditions: the node item (item 0,
// whose head moved) and the audit record (item auditAt, whose seq the other record took). A
// reservation whose version moved needs a new decision even if the node's did not.
func othersHeld(e *types.TransactionCanceledException, auditAt int) bool {
	for i, r := range e.CancellationReasons {
		if i == 0 || i == auditAt {
			continue
		}
		switch aws.ToString(r.Code) {
		case "", "None":
		default:
			return false
		}
	}
	return true
}

// versionOf returns an item's Version (-1 when it has none).
func versionOf(item map[string]types.AttributeValue) int64 {
	n, ok := item[attrVersion].(*types.AttributeValueMemberN)
	if !ok {
		return -1
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// transact runs one TransactWriteItems and classifies its failure for the domain: ErrAmbiguous,
// throttled, refused (what refuse makes of the cancellation, if anything) or ErrConflict.
func (s *Store) transact(ctx context.Context, what string, items []types.TransactWriteItem, refuse func(*types.TransactionCanceledException) error) error {
	_, err := s.transactCanceled(ctx, what, items, refuse)
	return err
}

// transactCanceled is transact that also returns the cancellation, when the transaction was
// cancelled (and not ambiguously): the audit chain's writers look at the head's reason.
func (s *Store) transactCanceled(ctx context.Context, what string, items []types.TransactWriteItem, refuse func(*types.TransactionCanceledException) error) (*types.TransactionCanceledException, error) {
	var attempts attemptLog
	_, err := s.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}, attempts.option)
	if err == nil {
		return nil, nil
	}
	if attempts.ambiguous() {
		// An earlier attempt may have landed, and a later one then failed on the state it
		// left (the ClientRequestToken that makes AWS answer such a retry with success
		// lasts 10 minutes and is not honoured everywhere): only a read can tell.
		return nil, fmt.Errorf("%s: %w: %w", what, capacity.ErrAmbiguous, err)
	}
	if throttled(err) {
		return nil, fmt.Errorf("%s: %w", what, classify(err))
	}
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) {
		if refuse != nil {
			if refused := refuse(canceled); refused != nil {
				return canceled, fmt.Errorf("%s: %w", what, refused)
			}
		}
		if retryable(canceled) {
			return canceled, fmt.Errorf("%s: %w (%s)", what, capacity.ErrConflict, reasons(canceled))
		}
	}
	return canceled, fmt.Errorf("%s: %w", what, err)
}

// vmIDTaken reports whether the cancelled transaction failed on the VM id: its put (a live VM
// has the id) or its check of the node's history (a terminated one had it).
func vmIDTaken(items []types.TransactWriteItem, e *types.TransactionCanceledException, vmID string) bool {
	for i, r := range e.CancellationReasons {
		if i >= len(items) || aws.ToString(r.Code) != "ConditionalCheckFailed" {
			continue
		}
		var k map[string]types.AttributeValue
		switch {
		case items[i].Put != nil:
			k = items[i].Put.Item
		case items[i].ConditionCheck != nil:
			k = items[i].ConditionCheck.Key
		}
		if attr(k, attrSK) == prefixVM+vmID {
			return true
		}
	}
	return false
}

// Landed reports whether a commit that failed ambiguously was applied after all, by a
// strongly consistent read of its audit record (written only by that commit's transaction):
// chained after the head its decision read, under some SEQ# key past it (Commit may have
// gone again on a moved head), with the commit's record id.
func (s *Store) Landed(ctx context.Context, c capacity.Commit) (bool, error) {
	// Most often nothing else was appended: the record is the one right after the head read,
	// or no record is there and nothing (this commit included) landed.
	next := seqSK(c.Node.AuditHead.Seq + 1)
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.AuditTable), Key: itemKey(nodePK(c.Node.ID), next), ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String("#id"), ExpressionAttributeNames: map[string]string{"#id": "ID"},
	})
	if err != nil {
		return false, fmt.Errorf("read audit record %s of an ambiguous commit: %w", c.Audit.ID, classify(err))
	}
	if out.Item == nil || attr(out.Item, "ID") == c.Audit.ID {
		return out.Item != nil, nil
	}
	// Another record took that seq: the commit may have gone again on a later head.
	keyCond := expression.Key(attrPK).Equal(expression.Value(nodePK(c.Node.ID))).
		And(expression.Key(attrSK).Between(expression.Value(seqSK(c.Node.AuditHead.Seq+2)), expression.Value(prefixSeq+"~")))
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).
		WithFilter(expression.Name("ID").Equal(expression.Value(c.Audit.ID))).
		WithProjection(expression.NamesList(expression.Name(attrPK))).Build()
	if err != nil {
		return false, fmt.Errorf("build audit query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.AuditTable), KeyConditionExpression: expr.KeyCondition(),
		FilterExpression: expr.Filter(), ProjectionExpression: expr.Projection(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(), ConsistentRead: aws.Bool(true),
	}
	for page := dynamodb.NewQueryPaginator(s.Client, in); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return false, fmt.Errorf("find audit record %s of an ambiguous commit: %w", c.Audit.ID, classify(err))
		}
		if len(out.Items) > 0 {
			return true, nil
		}
	}
	return false, nil
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

// TransactInput returns the TransactWriteItems input Commit would send for c, so that a
// benchmark can send the very same items without the store (see BenchmarkReclaim's floor).
func (s *Store) TransactInput(c capacity.Commit) (*dynamodb.TransactWriteItemsInput, error) {
	items, err := s.transactItems(c, nil)
	if err != nil {
		return nil, err
	}
	return &dynamodb.TransactWriteItemsInput{TransactItems: items}, nil
}

func (s *Store) transactItems(c capacity.Commit, pin *capacity.ChainStart) ([]types.TransactWriteItem, error) {
	var items []types.TransactWriteItem
	add := func(it types.TransactWriteItem, err error) error {
		if err != nil {
			return err
		}
		items = append(items, it)
		return nil
	}
	// One Update of the node: its version as read (bumped when the commit moves capacity)
	// and the audit chain's head, advanced by the record put last.
	var upd *expression.UpdateBuilder
	if c.BumpNode {
		u := bump(expression.UpdateBuilder{}, c.Node.Version)
		upd = &u
	}
	cond := versionIs(c.Node.Version)
	audit, _, err := s.auditWrites(c.Audit, c.Node.AuditHead, pin, s.nodeHead(c.Node.ID), upd, &cond)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", c.Node.ID, err)
	}
	items = append(items, audit[0])
	if r := c.Reservation; r != nil {
		upd := expression.Set(expression.Name(attrReleasedUnitIDs), expression.Value(r.ReleasedUnitIDs)).
			Set(expression.Name(attrUpdatedAt), expression.Value(r.UpdatedAt))
		err := add(s.update(itemKey(nodePK(r.NodeID), prefixReserv+r.ID), versionIs(r.Version), bump(upd, r.Version)))
		if err != nil {
			return nil, fmt.Errorf("reservation %s: %w", r.ID, err)
		}
	}
	for _, vm := range c.Evict {
		cond := versionIs(vm.Version).And(expression.Name(attrState).Equal(expression.Value(vm.State)))
		upd := expression.Set(expression.Name(attrState), expression.Value(capacity.VMTerminating)).
			Set(expression.Name(attrReclaimID), expression.Value(c.Operation.ID)).
			Set(expression.Name(attrUpdatedAt), expression.Value(c.Operation.CreatedAt))
		if err := add(s.update(itemKey(nodePK(vm.NodeID), prefixVM+vm.ID), cond, bump(upd, vm.Version))); err != nil {
			return nil, fmt.Errorf("VM %s: %w", vm.ID, err)
		}
	}
	if c.NewVM != nil {
		if err := add(s.putNew(s.Table, newVMItem(*c.NewVM), nil)); err != nil {
			return nil, fmt.Errorf("VM %s: %w", c.NewVM.ID, err)
		}
		// VM ids are not reused while the node's history remembers them.
		hist := itemKey(histPK(c.NewVM.NodeID), prefixVM+c.NewVM.ID)
		if err := add(s.check(hist, expression.Name(attrPK).AttributeNotExists())); err != nil {
			return nil, fmt.Errorf("VM %s history: %w", c.NewVM.ID, err)
		}
	}
	if c.Operation != nil {
		if err := add(s.putNew(s.Table, newOperationItem(*c.Operation), nil)); err != nil {
			return nil, fmt.Errorf("operation %s: %w", c.Operation.ID, err)
		}
	}
	if c.Idempotency != nil {
		if err := add(s.idempotencyPut(*c.Idempotency)); err != nil {
			return nil, err
		}
	}
	if c.Scheduled != nil {
		// A fired scheduled reclaim leaves the scheduled state with the reclaim, or not at all.
		fired, err := s.firedItems(*c.Scheduled)
		if err != nil {
			return nil, fmt.Errorf("scheduled reclaim %s: %w", c.Scheduled.ID, err)
		}
		items = append(items, fired...)
	}
	return append(items, audit[1:]...), nil
}

// idempotencyPut puts a call's Idempotency-Key record, on the condition that none binds the
// key: a record past its expiry may still exist until TTL deletes it, and no longer binds.
func (s *Store) idempotencyPut(r capacity.IdempotencyRecord) (types.TransactWriteItem, error) {
	expired := expression.Name(attrExpiresAt).LessThanEqual(expression.Value(r.CreatedAt.Unix()))
	put, err := s.putNew(s.Table, newIdempotencyItem(r), &expired)
	if err != nil {
		return put, fmt.Errorf("idempotency record: %w", err)
	}
	return put, nil
}

func itemKey(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrPK: &types.AttributeValueMemberS{Value: pk},
		attrSK: &types.AttributeValueMemberS{Value: sk},
	}
}

func versionIs(v int64) expression.ConditionBuilder {
	return expression.Name(attrVersion).Equal(expression.Value(v))
}

func bump(u expression.UpdateBuilder, v int64) expression.UpdateBuilder {
	return u.Set(expression.Name(attrVersion), expression.Value(v+1))
}

func (s *Store) update(k map[string]types.AttributeValue, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build update: %w", err)
	}
	// The builder puts each clause (SET, REMOVE, ...) on a line of its own; the local
	// emulator reads only the first clause unless they are separated by a space, which AWS
	// takes as well. Expressions hold only placeholders, so nothing else changes.
	update := strings.ReplaceAll(aws.ToString(expr.Update()), "\n", " ")
	return types.TransactWriteItem{Update: &types.Update{
		TableName: aws.String(s.Table), Key: k,
		ConditionExpression: expr.Condition(), UpdateExpression: aws.String(update),
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

func (s *Store) deleteIf(k map[string]types.AttributeValue, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("build delete condition: %w", err)
	}
	return types.TransactWriteItem{Delete: &types.Delete{
		TableName: aws.String(s.Table), Key: k, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}, nil
}

// putNew puts an item (an item struct, or an item as stored) that must not exist yet (or,
// with orElse, may exist if orElse holds).
func (s *Store) putNew(tableName string, v any, orElse *expression.ConditionBuilder) (types.TransactWriteItem, error) {
	item, ok := v.(map[string]types.AttributeValue)
	if !ok {
		var err error
		if item, err = attributevalue.MarshalMap(v); err != nil {
			return types.TransactWriteItem{}, fmt.Errorf("encode item: %w", err)
		}
	}
	cond := expression.Name(attrPK).AttributeNotExists()
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
