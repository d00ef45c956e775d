package dynamo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// MigrationReport counts what Migrate moved (or, in a dry run, would move).
type MigrationReport struct {
	Scanned       int // items the scan returned (after its filter)
	TerminatedVMs int // moved to their node's history
	Operations    int // moved to their own partition
	Outcomes      int // moved to their operation's partition
	Superseded    int // old outcomes dropped: the new layout already held a newer one
	Scheduled     int // scheduled reclaims given their place in their reservation's list
	// ListEntries: node directory and membership entries written (for nodes and reservations
	// from before the node list); ListedOperations: operations given their place in their
	// reservation's reclaim list.
	ListEntries      int
	ListedOperations int
	// ShardedOperations: operations moved from their state's single byState key to its shard.
	ShardedOperations int
	Skipped           int // changed during the move, or not of the first layout: left for a re-run
}

// Migrate moves the items the first layout kept in the decision partition to the live-only
// layout (see items.go): terminated VMs to NODE#<node>#HIST, operations and their outcomes to
// NODE#<node>#OP#<id>. Each item moves in one transaction on its node: a delete conditioned on
// the old item being as read, and a put conditioned on the new key being free. So it is
// idempotent and resumable: a re-run finds only what is still to move; an item that changed
// under it is skipped and moved by the next run. Ended operations, terminated VMs and outcomes
// get their expiry (from when they ended, were terminated or recorded) as they move.
// Scheduled reclaims written before their reservation's list existed get its index keys.
func (s *Store) Migrate(ctx context.Context, dryRun bool, logger *slog.Logger) (MigrationReport, error) {
	var rep MigrationReport
	sk, typ := expression.Name(attrSK), expression.Name(attrType)
	filter := sk.BeginsWith(legacyPrefixOperation).Or(
		typ.Equal(expression.Value(typeVM)).And(expression.Name(attrState).Equal(expression.Value(capacity.VMTerminated))),
		typ.Equal(expression.Value(typeScheduled)).And(expression.Name(attrGSI1PK).AttributeNotExists()),
		typ.Equal(expression.Value(typeNode)), typ.Equal(expression.Value(typeReservation)),
		typ.Equal(expression.Value(typeOperation)).And(expression.Name(attrGSI2PK).AttributeNotExists()),
		typ.Equal(expression.Value(typeOperation)).And(expression.Name(attrGSI1PK).In(legacyOpStateKeys[0], legacyOpStateKeys[1:]...)))
	expr, err := expression.NewBuilder().WithFilter(filter).Build()
	if err != nil {
		return rep, fmt.Errorf("build migration scan: %w", err)
	}
	in := &dynamodb.ScanInput{
		TableName: aws.String(s.Table), ConsistentRead: aws.Bool(true), FilterExpression: expr.Filter(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}
	for page := dynamodb.NewScanPaginator(s.Client, in); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return rep, fmt.Errorf("scan %s: %w", s.Table, err)
		}
		for _, item := range out.Items {
			rep.Scanned++
			if err := s.migrateItem(ctx, item, dryRun, &rep); err != nil {
				return rep, err
			}
		}
	}
	logger.InfoContext(ctx, "migration done", "table", s.Table, "dry_run", dryRun, "scanned", rep.Scanned,
		"terminated_vms", rep.TerminatedVMs, "operations", rep.Operations, "outcomes", rep.Outcomes,
		"superseded", rep.Superseded, "scheduled", rep.Scheduled, "list_entries", rep.ListEntries,
		"listed_operations", rep.ListedOperations, "sharded_operations", rep.ShardedOperations, "skipped", rep.Skipped)
	return rep, nil
}

// migrateItem moves one first-layout item, if it is one.
func (s *Store) migrateItem(ctx context.Context, item map[string]types.AttributeValue, dryRun bool, rep *MigrationReport) error {
	pk, sk := attr(item, attrPK), attr(item, attrSK)
	switch attr(item, attrType) {
	case typeScheduled:
		return s.listScheduled(ctx, item, dryRun, rep)
	case typeNode:
		return s.indexNode(ctx, item, dryRun, rep)
	case typeReservation:
		return s.indexReservation(ctx, item, dryRun, rep)
	case typeOperation:
		if sk == skOperation {
			if err := s.indexOperation(ctx, item, dryRun, rep); err != nil {
				return err
			}
			return s.shardOperation(ctx, item, dryRun, rep)
		}
	}
	node := nodeOfPK(pk)
	if node == "" || pk != nodePK(node) {
		rep.Skipped++ // already in the new layout, or no node's: nothing to do
		return nil
	}
	var (
		moved    map[string]types.AttributeValue
		asOfRead []string // attributes the old item must still hold for the move
		count    *int
	)
	switch typ := attr(item, attrType); {
	case typ == typeVM:
		var it vmItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return fmt.Errorf("decode VM %s %s: %w", pk, sk, err)
		}
		moved = withKey(item, histPK(node), sk)
		moved[attrExpiresAt] = number(expiry(orNow(it.UpdatedAt).Add(s.retention())))
		asOfRead, count = []string{attrState, attrVersion}, &rep.TerminatedVMs
	case typ == typeOperation && strings.Count(sk, "#") == 1:
		var it operationItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return fmt.Errorf("decode operation %s %s: %w", pk, sk, err)
		}
		moved = withKey(item, opPK(node, it.ID), skOperation)
		delete(moved, "Outcomes") // the first layout stored an empty placeholder
		if st := capacity.OperationState(it.State); it.GSI1PK == legacyOpStatePK(st) {
			moved[attrGSI1PK] = &types.AttributeValueMemberS{Value: opStatePK(st, it.ID)}
		}
		moved[attrGSI2PK] = &types.AttributeValueMemberS{Value: opListPK(node, it.ReservationID)}
		moved[attrGSI2SK] = &types.AttributeValueMemberS{Value: opListSK(it.CreatedAt, it.ID)}
		if st := capacity.OperationState(it.State); st == capacity.OpCompleted || st == capacity.OpFailed {
			moved[attrExpiresAt] = number(expiry(orNow(it.UpdatedAt).Add(s.retention())))
		}
		asOfRead, count = []string{attrState, attrUpdatedAt, attrAttempt}, &rep.Operations
	case typ == typeOutcome:
		var it outcomeItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return fmt.Errorf("decode outcome %s %s: %w", pk, sk, err)
		}
		moved = withKey(item, opPK(node, it.ReclaimID), prefixVM+it.VMID)
		moved[attrExpiresAt] = number(expiry(orNow(it.At).Add(s.retention())))
		asOfRead, count = []string{attrOutcome, attrAttempt, "At"}, &rep.Outcomes
	default:
		rep.Skipped++
		return nil
	}
	if dryRun {
		*count++
		return nil
	}
	del, err := s.deleteIf(itemKey(pk, sk), sameAs(item, asOfRead))
	if err != nil {
		return fmt.Errorf("move %s %s: %w", pk, sk, err)
	}
	put, err := s.putNew(s.Table, moved, nil)
	if err != nil {
		return fmt.Errorf("move %s %s: %w", pk, sk, err)
	}
	_, err = s.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{del, put}})
	var canceled *types.TransactionCanceledException
	switch {
	case err == nil:
		*count++
	case errors.As(err, &canceled) && failedAt(canceled, 1) && !failedAt(canceled, 0) && count == &rep.Outcomes:
		// The new layout holds this VM's outcome already: written after the deploy, by a
		// later attempt, so it is the one to keep.
		if _, err := s.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{del}}); err != nil {
			return fmt.Errorf("drop superseded outcome %s %s: %w", pk, sk, err)
		}
		rep.Superseded++
	case errors.As(err, &canceled) && retryable(canceled):
		rep.Skipped++ // changed while moving: the next run moves it
	default:
		return fmt.Errorf("move %s %s: %w", pk, sk, err)
	}
	return nil
}

// listScheduled gives a scheduled reclaim its reservation's list keys (the byState index), if
// it has none, conditioned on its version as read: a firing or cancel meanwhile writes them
// itself.
func (s *Store) listScheduled(ctx context.Context, item map[string]types.AttributeValue, dryRun bool, rep *MigrationReport) error {
	var it scheduledItem
	if err := attributevalue.UnmarshalMap(item, &it); err != nil {
		return fmt.Errorf("decode scheduled reclaim %s: %w", attr(item, attrPK), err)
	}
	if it.GSI1PK != "" {
		rep.Skipped++
		return nil
	}
	if dryRun {
		rep.Scheduled++
		return nil
	}
	keyed := newScheduledItem(it.scheduled(), s.retention())
	cond := versionIs(it.Version).And(expression.Name(attrGSI1PK).AttributeNotExists())
	upd := expression.Set(expression.Name(attrGSI1PK), expression.Value(keyed.GSI1PK)).
		Set(expression.Name(attrGSI1SK), expression.Value(keyed.GSI1SK))
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return fmt.Errorf("build scheduled reclaim update: %w", err)
	}
	_, err = s.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.Table), Key: itemKey(it.PK, it.SK), ConditionExpression: expr.Condition(),
		UpdateExpression: expr.Update(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		rep.Scheduled++
	case errors.As(err, &ccf):
		rep.Skipped++ // changed meanwhile: rewritten whole, with its keys
	default:
		return fmt.Errorf("list scheduled reclaim %s: %w", it.PK, classify(err))
	}
	return nil
}

// withKey is a copy of the item under another key.
func withKey(item map[string]types.AttributeValue, pk, sk string) map[string]types.AttributeValue {
	out := maps.Clone(item)
	maps.Copy(out, itemKey(pk, sk))
	return out
}

// sameAs holds while the item's named attributes are as read (absent ones still absent).
func sameAs(item map[string]types.AttributeValue, names []string) expression.ConditionBuilder {
	cond := expression.Name(attrPK).AttributeExists()
	for _, n := range names {
		if v, ok := item[n]; ok {
			cond = cond.And(expression.Name(n).Equal(expression.Value(v)))
		} else {
			cond = cond.And(expression.Name(n).AttributeNotExists())
		}
	}
	return cond
}

func failedAt(e *types.TransactionCanceledException, i int) bool {
	return i < len(e.CancellationReasons) && aws.ToString(e.CancellationReasons[i].Code) == "ConditionalCheckFailed"
}

func number(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: fmt.Sprint(n)}
}

func orNow(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now()
	}
	return t
}

// legacyOpStateKeys are the byState keys of every state before the shards.
var legacyOpStateKeys = func() []expression.OperandBuilder {
	var out []expression.OperandBuilder
	for _, st := range []capacity.OperationState{capacity.OpPendingStart, capacity.OpTerminating, capacity.OpCompleted, capacity.OpFailed} {
		out = append(out, expression.Value(legacyOpStatePK(st)))
	}
	return out
}()

// shardOperation moves an operation from its state's single byState key (the layout before
// the shards) to its shard's, conditioned on the key as read: a state change meanwhile
// writes the sharded key itself. Readers read the single key too until this has run.
func (s *Store) shardOperation(ctx context.Context, item map[string]types.AttributeValue, dryRun bool, rep *MigrationReport) error {
	var it operationItem
	if err := attributevalue.UnmarshalMap(item, &it); err != nil {
		return fmt.Errorf("decode operation %s: %w", attr(item, attrPK), err)
	}
	state := capacity.OperationState(it.State)
	if it.GSI1PK != legacyOpStatePK(state) {
		return nil // sharded already
	}
	if dryRun {
		rep.ShardedOperations++
		return nil
	}
	cond := expression.Name(attrGSI1PK).Equal(expression.Value(it.GSI1PK))
	upd := expression.Set(expression.Name(attrGSI1PK), expression.Value(opStatePK(state, it.ID)))
	_, err := s.updateItem(ctx, itemKey(it.PK, it.SK), cond, upd, types.ReturnValueNone)
	switch {
	case err == nil:
		rep.ShardedOperations++
	case errors.Is(err, capacity.ErrConflict):
		rep.Skipped++ // moved on meanwhile, under its shard
	default:
		return fmt.Errorf("shard operation %s: %w", it.ID, classify(err))
	}
	return nil
}
