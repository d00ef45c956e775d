package dynamo

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// Audit records form hash chains (capacity.ChainAuditRecord): two per node, and one for key
// management, whose head is an item of the keys table. A node's changes chain holds the record
// of every call that changed its state, and its head is the node item's AuditSeq and
// AuditHead, which every commit conditions on. Its calls chain holds the records of calls
// that changed nothing (dry runs, refusals, replays): its head is an item of its own in the
// node's partition (skCallsHead) that no decision reads and no commit conditions on, so a
// burst of such calls never makes a commit go again. This file is the one place audit items are chained and put: every record
// goes in a transaction that also moves its chain's head, conditioned on the head as read, so
// two writers can never give out the same seq and the head never names a record not written.

const (
	attrAuditSeq  = "AuditSeq"
	attrAuditHead = "AuditHead"
	// The pin of the chain's start (capacity.ChainStart), on the head item.
	attrAuditStartCount  = "AuditStartCount"
	attrAuditStartDigest = "AuditStartDigest"

	// keysAuditPK is the audit partition of key management, and the pk of its head item in
	// the keys table (sk skAuditHead).
	keysAuditPK = "APIKEYS"
	skAuditHead = "AUDITHEAD"
	// skCallsHead is the sk of a node's calls chain head, in the node's partition of the state
	// table: it sorts before NODE, so the decision Query never reads it.
	skCallsHead = "AUDITHEAD#CALLS"

	// headTries bounds the commits that lose only the head to another writer and go again
	// (past it the service decides again, up to its own attempts).
	headTries = 5
	// appendTries bounds the appends outside a commit that lose the head and go again. More
	// than a commit's: an append that gives up loses its record (its call has answered), and
	// many dry runs at once on one node all race for the one head.
	appendTries = 10
	// callsAppendTries bounds the appends to a calls chain that lose its head and go again.
	// Only other calls that changed nothing contend for it, and each round one of them
	// wins, so with the backoff's jitter a burst drains well within these.
	callsAppendTries = 40
)

// headRef names the item holding a chain's head: the node item, or the key chain's head item.
type headRef struct {
	table string
	key   map[string]types.AttributeValue
	// auditPK is the chain's partition in the audit table.
	auditPK string
	// node is set for a node's chains: a record for a node that does not exist is not kept.
	node bool
	// nodeID names the node of a calls chain, whose head item may not exist yet while the
	// node does (it is made by the chain's first append).
	nodeID string
}

func (s *Store) nodeHead(nodeID string) headRef {
	return headRef{table: s.Table, key: itemKey(nodePK(nodeID), skNode), auditPK: nodePK(nodeID), node: true}
}

// callsHead is a node's calls chain: its head item sits beside the node item (never read
// with it), and its records in an audit partition of their own.
func (s *Store) callsHead(nodeID string) headRef {
	return headRef{table: s.Table, key: itemKey(nodePK(nodeID), skCallsHead), auditPK: callsPK(nodeID), node: true, nodeID: nodeID}
}

// callsPK is the audit partition of a node's calls chain.
func callsPK(nodeID string) string { return nodePK(nodeID) + "#CALLS" }

// nodeChainHead names one of a node's chains.
func (s *Store) nodeChainHead(nodeID string, chain capacity.NodeChain) headRef {
	if chain == capacity.ChainCalls {
		return s.callsHead(nodeID)
	}
	return s.nodeHead(nodeID)
}

func (s *Store) keysHead() headRef {
	return headRef{table: s.KeysTable, key: itemKey(keysAuditPK, skAuditHead), auditPK: keysAuditPK}
}

// headIs holds while the head item still names head (no record yet: no AuditSeq, or 0).
func headIs(head capacity.AuditHead) expression.ConditionBuilder {
	if head.Seq == 0 {
		return expression.Name(attrAuditSeq).AttributeNotExists().
			Or(expression.Name(attrAuditSeq).Equal(expression.Value(0)))
	}
	return expression.Name(attrAuditSeq).Equal(expression.Value(head.Seq)).
		And(expression.Name(attrAuditHead).Equal(expression.Value(head.Hash)))
}

// auditWrites returns the transaction items appending rec to the chain at head (as read):
// ONE Update of the head item that applies upd (nil: none) under cond (nil: none), sets the
// new head and conditions on head as read, then the audit record's Put. A head that pins no
// start gets pin (startPin), conditioned on still having none; nil leaves it unpinned (only
// for TransactInput's copy of a commit). The transaction must not otherwise write the head
// item. It returns rec as chained.
func (s *Store) auditWrites(rec capacity.AuditRecord, head capacity.AuditHead, pin *capacity.ChainStart, ref headRef,
	upd *expression.UpdateBuilder, cond *expression.ConditionBuilder) ([]types.TransactWriteItem, capacity.AuditRecord, error) {
	pinning := pin != nil && !head.Start.Pinned()
	if pinning {
		rec.Start = pin // the pin in the chain's hashes too, not only on the head
	}
	rec, next := capacity.ChainAuditRecord(rec, head)
	u := expression.UpdateBuilder{}
	if upd != nil {
		u = *upd
	}
	u = u.Set(expression.Name(attrAuditSeq), expression.Value(next.Seq)).
		Set(expression.Name(attrAuditHead), expression.Value(next.Hash))
	c := headIs(head)
	if pinning {
		u = u.Set(expression.Name(attrAuditStartCount), expression.Value(pin.Unchained)).
			Set(expression.Name(attrAuditStartDigest), expression.Value(pin.Digest))
		c = c.And(expression.Name(attrAuditStartDigest).AttributeNotExists())
	}
	if cond != nil {
		c = cond.And(c)
	}
	expr, err := expression.NewBuilder().WithCondition(c).WithUpdate(u).Build()
	if err != nil {
		return nil, rec, fmt.Errorf("build audit head update: %w", err)
	}
	condition, update := expr.Condition(), expr.Update()
	names := distinctNames(expr.Names(), condition, update)
	headUpd := types.TransactWriteItem{Update: &types.Update{
		TableName: aws.String(ref.table), Key: ref.key,
		ConditionExpression: condition, UpdateExpression: update,
		ExpressionAttributeNames: names, ExpressionAttributeValues: expr.Values(),
		// On a failed condition the item comes back: a head that moved is told from a
		// version that moved without another read.
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}
	put, err := s.putNew(s.AuditTable, newAuditItemIn(ref.auditPK, rec), nil)
	if err != nil {
		return nil, rec, fmt.Errorf("audit record %s: %w", rec.ID, err)
	}
	return []types.TransactWriteItem{headUpd, put}, rec, nil
}

// placeholder is an expression attribute name placeholder as the expression builder makes them.
var placeholder = regexp.MustCompile(`#([0-9]+)`)

// distinctNames renames the placeholders #0, #1, ... #10 of an expression to #0n, #1n, ...
// #10n in the expressions and returns the names under them: none is then a prefix of another.
// AWS needs none of this; the local emulator resolves names by plain text replacement, in
// which #1 also rewrites #10, and a node's creation with its chain's head and start takes
// more than ten names.
func distinctNames(names map[string]string, exprs ...*string) map[string]string {
	for _, e := range exprs {
		if e != nil {
			*e = placeholder.ReplaceAllString(*e, "#${1}n")
		}
	}
	out := make(map[string]string, len(names))
	for k, v := range names {
		out[placeholder.ReplaceAllString(k, "#${1}n")] = v
	}
	return out
}

// readHead reads a chain's head with one strongly consistent GetItem; exists is false when
// the head item does not exist (a node that does not exist, or a key chain not begun).
func (s *Store) readHead(ctx context.Context, ref headRef) (capacity.AuditHead, bool, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(ref.table), Key: ref.key, ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String("#pk, #seq, #head, #sc, #sd"),
		ExpressionAttributeNames: map[string]string{"#pk": attrPK, "#seq": attrAuditSeq, "#head": attrAuditHead,
			"#sc": attrAuditStartCount, "#sd": attrAuditStartDigest},
	})
	if err != nil {
		return capacity.AuditHead{}, false, fmt.Errorf("read audit head %s: %w", ref.auditPK, classify(err))
	}
	if out.Item == nil {
		if ref.nodeID != "" {
			// A calls chain not begun: empty, if its node exists.
			exists, err := s.nodeExists(ctx, ref.nodeID)
			return capacity.AuditHead{}, exists, err
		}
		return capacity.AuditHead{}, false, nil
	}
	h, err := headOf(out.Item)
	return h, true, err
}

// nodeExists reads whether the node item exists (a read: it never conflicts with a commit).
func (s *Store) nodeExists(ctx context.Context, nodeID string) (bool, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.Table), Key: itemKey(nodePK(nodeID), skNode), ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String("#pk"), ExpressionAttributeNames: map[string]string{"#pk": attrPK},
	})
	if err != nil {
		return false, fmt.Errorf("read node %s: %w", nodeID, classify(err))
	}
	return out.Item != nil, nil
}

// headOf decodes the head attributes of an item (zero when absent).
func headOf(item map[string]types.AttributeValue) (capacity.AuditHead, error) {
	var h capacity.AuditHead
	for name, to := range map[string]*int64{attrAuditSeq: &h.Seq, attrAuditStartCount: &h.Start.Unchained} {
		if n, ok := item[name].(*types.AttributeValueMemberN); ok {
			v, err := strconv.ParseInt(n.Value, 10, 64)
			if err != nil {
				return h, fmt.Errorf("decode audit head %s %q: %w", name, n.Value, err)
			}
			*to = v
		}
	}
	h.Hash = attr(item, attrAuditHead)
	h.Start.Digest = attr(item, attrAuditStartDigest)
	return h, nil
}

// startPin returns the pin for a head that has none (nil when it has one): the unchained
// records of the chain's partition as they stand, read with a consistent Query of the keys
// before SEQ#. The service writes no unchained record any more, so the set is final.
func (s *Store) startPin(ctx context.Context, ref headRef, head capacity.AuditHead) (*capacity.ChainStart, error) {
	if head.Start.Pinned() {
		return nil, nil
	}
	if ref.nodeID != "" {
		// A calls chain began after pins existed and the service puts no unchained record in
		// its partition: it starts with none, whatever may have been planted there.
		pin := capacity.ChainStartOf(nil)
		return &pin, nil
	}
	expr, err := expression.NewBuilder().WithKeyCondition(expression.Key(attrPK).Equal(expression.Value(ref.auditPK)).
		And(expression.Key(attrSK).LessThan(expression.Value(prefixSeq)))).Build()
	if err != nil {
		return nil, fmt.Errorf("build audit start query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.AuditTable), KeyConditionExpression: expr.KeyCondition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ScanIndexForward: aws.Bool(true), ConsistentRead: aws.Bool(true),
	}
	var unchained []capacity.AuditRecord
	for {
		recs, next, err := s.auditPage(ctx, in, ref.auditPK)
		if err != nil {
			return nil, fmt.Errorf("pin the start of audit chain %s: %w", ref.auditPK, err)
		}
		unchained = append(unchained, recs...)
		if next == "" {
			break
		}
		if in.ExclusiveStartKey, err = decodeCursor(next, chainShape(ref.auditPK)); err != nil {
			return nil, err
		}
	}
	pin := capacity.ChainStartOf(unchained)
	return &pin, nil
}

// headMoved reports whether a cancelled transaction whose item i is the head update failed
// because the head moved, and what it is now: from the item the cancellation returned, or
// else (a TransactionConflict, or an emulator that returns no item) a consistent read. It
// also reports the head item's Version (0 when not returned) so Commit can tell a moved
// version, which needs a new decision, from a moved head alone.
func (s *Store) headMoved(ctx context.Context, ref headRef, e *types.TransactionCanceledException, i int, head capacity.AuditHead) (capacity.AuditHead, map[string]types.AttributeValue, bool, error) {
	if i >= len(e.CancellationReasons) {
		return head, nil, false, nil
	}
	r := e.CancellationReasons[i]
	switch aws.ToString(r.Code) {
	case "ConditionalCheckFailed", "TransactionConflict":
	default:
		return head, nil, false, nil
	}
	item := r.Item
	if item == nil {
		out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(ref.table), Key: ref.key, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return head, nil, false, fmt.Errorf("read audit head %s: %w", ref.auditPK, classify(err))
		}
		item = out.Item
	}
	if item == nil {
		return head, nil, false, nil
	}
	now, err := headOf(item)
	if err != nil {
		return head, nil, false, err
	}
	return now, item, now != head, nil
}

// appendChained puts rec on its chain together with the other items (which must not write
// the head item) in one transaction: it reads the head, and goes again when the head moved
// or the transaction met another (TransactionConflict), up to appendTries (callsAppendTries on a calls chain). A record for a node that does not exist is put unchained (conditioned on
// the node's absence). what names the write in errors; refuse is as for transact.
func (s *Store) appendChained(ctx context.Context, what string, rec capacity.AuditRecord, ref headRef, others []types.TransactWriteItem,
	refuse func(*types.TransactionCanceledException) error) error {
	tries := appendTries
	if ref.nodeID != "" {
		tries = callsAppendTries
	}
	for try := 1; ; try++ {
		head, exists, err := s.readHead(ctx, ref)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !exists && ref.node {
			// A node that does not exist has no chain to append to, and a record put outside
			// one could not be told from a planted one: nothing is written (the caller logs).
			return fmt.Errorf("%s: %w", what, capacity.Errorf(capacity.CodeNotFound, "node %s does not exist: its audit chain has not begun", rec.NodeID))
		}
		pin, err := s.startPin(ctx, ref, head)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		aw, chained, err := s.auditWrites(rec, head, pin, ref, nil, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		headAt := len(others)
		items := append(append([]types.TransactWriteItem{}, others...), aw...)
		canceled, err := s.transactCanceled(ctx, what, items, refuse)
		if err == nil {
			return nil
		}
		if errors.Is(err, capacity.ErrAmbiguous) {
			// A timeout after the write landed: the record is there under its seq. Putting it
			// again would give it a second seq.
			landed, lerr := s.auditLanded(ctx, ref, chained)
			if lerr != nil {
				return fmt.Errorf("%w (and checking it: %w)", err, lerr)
			}
			if landed {
				return nil
			}
			if try < tries && len(others) == 0 {
				continue
			}
			return err
		}
		if canceled == nil || try >= tries {
			return err
		}
		_, _, moved, herr := s.headMoved(ctx, ref, canceled, headAt, head)
		if herr != nil {
			return fmt.Errorf("%w (and reading the head: %w)", err, herr)
		}
		if !moved && !conflicted(canceled) {
			return err
		}
		if err := headRetry.Pause(ctx, try+1); err != nil {
			return err
		}
	}
}

// conflicted reports whether a cancelled transaction met another transaction on one of its
// items (on AWS, two appends at once on a head: the head has not moved yet). Nothing was
// applied, and the same write may go again after a backoff.
func conflicted(e *types.TransactionCanceledException) bool {
	for _, r := range e.CancellationReasons {
		if aws.ToString(r.Code) == "TransactionConflict" {
			return true
		}
	}
	return false
}

// headRetry spreads writers that lost the head to one another before they go again (full
// jitter, 5 ms doubling to 160 ms: otherwise they read the same new head and collide again).
var headRetry = capacity.RetryPolicy{Base: 5 * time.Millisecond, Cap: 160 * time.Millisecond}

// auditLanded reports whether the chained record is stored under its seq (with its id).
func (s *Store) auditLanded(ctx context.Context, ref headRef, rec capacity.AuditRecord) (bool, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.AuditTable), Key: itemKey(ref.auditPK, seqSK(rec.Seq)), ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String("#id"), ExpressionAttributeNames: map[string]string{"#id": "ID"},
	})
	if err != nil {
		return false, fmt.Errorf("read audit record %s at seq %d: %w", rec.ID, rec.Seq, classify(err))
	}
	return out.Item != nil && attr(out.Item, "ID") == rec.ID, nil
}

// AppendAudit appends the record of a call that changed nothing (dry runs, refusals,
// replays) to its chain: its node's calls chain, which no commit conditions on, or for key
// management (no node, a key.* action) the keys chain. It never overwrites.
func (s *Store) AppendAudit(ctx context.Context, rec capacity.AuditRecord) error {
	return s.appendChained(ctx, "append audit record "+rec.ID, rec, s.auditRef(rec), nil, nil)
}

// RecordUnchanged puts the record of a call whose decision changed nothing (a repeat of a
// change already made) on its node's calls chain, with the call's Idempotency-Key record (if
// any) in the same transaction, so that a retry under the key replays the answer. Neither
// is an item a decision reads or a commit conditions on: the node item is not written.
func (s *Store) RecordUnchanged(ctx context.Context, rec capacity.AuditRecord, idem *capacity.IdempotencyRecord) error {
	var others []types.TransactWriteItem
	if idem != nil {
		put, err := s.idempotencyPut(*idem)
		if err != nil {
			return fmt.Errorf("record unchanged %s %s: %w", rec.Action, rec.ID, err)
		}
		others = append(others, put)
	}
	return s.appendChained(ctx, "record unchanged "+rec.Action+" "+rec.ID, rec, s.callsHead(rec.NodeID), others, nil)
}

// auditRef names the chain a record belongs to.
func (s *Store) auditRef(rec capacity.AuditRecord) headRef {
	if rec.NodeID == "" && s.KeysTable != "" && len(rec.Action) > 4 && rec.Action[:4] == "key." {
		return s.keysHead()
	}
	return s.callsHead(rec.NodeID)
}

var _ capacity.AuditStore = (*Store)(nil)
