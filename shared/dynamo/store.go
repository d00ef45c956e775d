// Package dynamo stores the capacity domain in DynamoDB: one state table (single-table
// design, see items.go), one append-only audit table, and API keys in a table of their own
// (keys.go).
package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

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
	// ReadResealedAgentKeys: LoadNode returns the node's resealed agent key (Node.ResealedAgentKey).
	// Only the terminating function's store sets it, the one function that can open it; any
	// other's reads leave the item out.
	ReadResealedAgentKeys bool
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
		if err := headRetry.Pause(ctx, try+1); err != nil {
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
