package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

var _ capacity.TerminationStore = (*Store)(nil)

// GetOperation reads a reclaim operation, its VM outcomes and notices with one strongly consistent
// Query of the operation's own partition.
func (s *Store) GetOperation(ctx context.Context, nodeID, opID string) (*capacity.Operation, error) {
	keyCond := expression.Key(attrPK).Equal(expression.Value(opPK(nodeID, opID)))
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).Build()
	if err != nil {
		return nil, fmt.Errorf("build operation query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.Table), ConsistentRead: aws.Bool(true),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}
	var op *capacity.Operation
	outcomes := map[string]capacity.VMOutcome{}
	notices := map[string]capacity.VMNotice{}
	reportClaims := map[string]bool{} // report claims taken, by sort key
	stats := capacity.CallStatsFrom(ctx)
	for page := dynamodb.NewQueryPaginator(s.Client, in); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("query operation %s: %w", opID, classify(err))
		}
		for _, item := range out.Items {
			stats.AddRead(1, ItemSize(item))
			switch attr(item, attrType) {
			case typeOperation:
				var it operationItem
				if err := attributevalue.UnmarshalMap(item, &it); err != nil {
					return nil, fmt.Errorf("decode operation %s: %w", opID, err)
				}
				o := it.operation()
				op = &o
			case typeOutcome:
				var it outcomeItem
				if err := attributevalue.UnmarshalMap(item, &it); err != nil {
					return nil, fmt.Errorf("decode outcome of operation %s: %w", opID, err)
				}
				outcomes[it.VMID] = it.outcome()
				if n, ok := it.notice(); ok {
					if _, kept := notices[it.VMID]; !kept { // its notice item expired
						notices[it.VMID] = n
					}
				}
			case typeNotice:
				var it noticeItem
				if err := attributevalue.UnmarshalMap(item, &it); err != nil {
					return nil, fmt.Errorf("decode notice of operation %s: %w", opID, err)
				}
				notices[it.VMID] = it.notice()
			case typeClaim:
				if sk := attr(item, attrSK); strings.HasPrefix(sk, prefixReport) {
					reportClaims[sk] = true
				}
			}
		}
	}
	if op == nil {
		return nil, capacity.Errorf(capacity.CodeNotFound, "reclaim operation %s not found", opID)
	}
	// The outcomes folded at an end, updated by the items (never older than their copies).
	op.Outcomes = mergeOutcomes(op.Outcomes, outcomes)
	op.ReportClaimed = reportClaims[reportSK(*op)]
	if len(notices) > 0 {
		op.Notices = notices
	}
	return op, nil
}

// BeginTermination moves the operation from pending-start to terminating, at op's attempt.
func (s *Store) BeginTermination(ctx context.Context, op capacity.Operation, executionARN string, now time.Time) error {
	upd := expression.Set(expression.Name(attrState), expression.Value(capacity.OpTerminating)).
		Set(expression.Name(attrExecutionARN), expression.Value(executionARN)).
		Set(expression.Name(attrUpdatedAt), expression.Value(now)).
		Set(expression.Name(attrGSI1PK), expression.Value(opStatePK(capacity.OpTerminating, op.ID)))
	cond := stateAt(capacity.OpPendingStart, op)
	_, err := s.updateItem(ctx, operationKey(op), cond, upd, types.ReturnValueNone)
	if err != nil {
		return fmt.Errorf("begin termination of operation %s: %w", op.ID, err)
	}
	return nil
}

// MarkTerminated moves a VM evicted by op out of the decision partition into the node's
// history as terminated, which frees its units: the history item is put, then the live item
// deleted on condition that it is still terminating for op at the version read (see
// moveToHistory). Re-marking a VM op already terminated succeeds; any other state is an error.
func (s *Store) MarkTerminated(ctx context.Context, op capacity.Operation, vmID string, now time.Time) error {
	live := itemKey(nodePK(op.NodeID), prefixVM+vmID)
	var err error
	for range markRounds {
		var vm *capacity.VM
		if vm, err = s.getVM(ctx, live); err != nil {
			return fmt.Errorf("mark VM %s terminated: %w", vmID, err)
		}
		if vm == nil || vm.State != capacity.VMTerminating || vm.ReclaimID != op.ID {
			return s.terminatedBy(ctx, op, vmID, vm)
		}
		if err = s.moveToHistory(ctx, op, *vm, now); !errors.Is(err, capacity.ErrConflict) {
			break
		}
		// The VM changed since read (or a duplicate moved it): read again.
	}
	if err != nil {
		return fmt.Errorf("mark VM %s terminated: %w", vmID, err)
	}
	return nil
}

// markRounds bounds MarkTerminated's read-write rounds when the VM changes under it.
const markRounds = 3

// terminatedBy answers a VM that is not terminating for op: success when op already moved
// it to the history, ErrConflict otherwise.
func (s *Store) terminatedBy(ctx context.Context, op capacity.Operation, vmID string, live *capacity.VM) error {
	if live != nil && live.State == capacity.VMTerminated && live.ReclaimID == op.ID {
		return nil // terminated in place by the first layout (until migrated): a re-run
	}
	if live != nil {
		return fmt.Errorf("VM %s is %q for %q, not terminating for %s: %w", vmID, live.State, live.ReclaimID, op.ID, capacity.ErrConflict)
	}
	hist, err := s.getVM(ctx, itemKey(histPK(op.NodeID), prefixVM+vmID))
	if err != nil {
		return fmt.Errorf("read history of VM %s: %w", vmID, err)
	}
	if hist != nil && hist.State == capacity.VMTerminated && hist.ReclaimID == op.ID {
		return nil // this operation terminated it already: a re-run
	}
	return fmt.Errorf("VM %s is neither live nor terminated by %s: %w", vmID, op.ID, capacity.ErrConflict)
}

// getVM reads a VM item (consistent), or nil.
func (s *Store) getVM(ctx context.Context, k map[string]types.AttributeValue) (*capacity.VM, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.Table), Key: k, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("read VM %s: %w", attr(k, attrSK), classify(err))
	}
	if out.Item == nil {
		return nil, nil
	}
	var it vmItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return nil, fmt.Errorf("decode VM %s: %w", attr(k, attrSK), err)
	}
	vm := it.vm()
	return &vm, nil
}

// RecordOutcome puts the VM's outcome item, on its own: no transaction and no shared
// counter on the operation item, so concurrent branches never conflict over one item, and
// the end is decided by reading the outcome items (see capacity.Terminator). The put is
// conditioned so that an outcome is never overwritten by a worse or older one:
//
//   - a success (terminated, already-gone) may replace nothing but a failure;
//   - a failure may replace nothing but an older attempt's failure.
//
// A failed condition is the only "recorded before"; every other error is returned (after
// the SDK's retries for throttling and ours for TransactionConflict).
func (s *Store) RecordOutcome(ctx context.Context, op capacity.Operation, vmID string, o capacity.VMOutcome) error {
	item, err := attributevalue.MarshalMap(newOutcomeItem(op, vmID, o, s.retention()))
	if err != nil {
		return fmt.Errorf("encode outcome of VM %s: %w", vmID, err)
	}
	failed := expression.Name(attrOutcome).Equal(expression.Value(capacity.OutcomeFailed))
	replaceable := failed
	if o.Outcome == capacity.OutcomeFailed {
		older := expression.Name(attrAttempt).LessThan(expression.Value(max(1, o.Attempt)))
		replaceable = failed.And(expression.Name(attrAttempt).AttributeNotExists().Or(older))
	}
	cond := expression.Name(attrPK).AttributeNotExists().Or(replaceable)
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return fmt.Errorf("build outcome condition: %w", err)
	}
	_, err = s.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.Table), Item: item, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}, retryConflicts)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil // recorded before (a re-run), with an outcome as good or newer
	}
	if err != nil {
		return fmt.Errorf("record outcome of VM %s on operation %s: %w", vmID, op.ID, err)
	}
	return nil
}

// EndOperation moves an operation terminating at op's attempt, with its outcomes, to its end
// state (see endUpdate). Exactly one caller wins; the caller decided from the outcome items it
// read. A completed operation expires a retention after its end; a failed one keeps VMs
// terminating, so it never expires (see endUpdate) until they are let go.
func (s *Store) EndOperation(ctx context.Context, op capacity.Operation, state capacity.OperationState, now time.Time) error {
	upd := s.endUpdate(op, state, now)
	if _, err := s.updateItem(ctx, operationKey(op), stateAt(capacity.OpTerminating, op), upd, types.ReturnValueNone); err != nil {
		return fmt.Errorf("end operation %s as %s: %w", op.ID, state, err)
	}
	if state == capacity.OpFailed {
		if err := s.keepNotices(ctx, op, now); err != nil {
			return fmt.Errorf("end operation %s as %s: %w", op.ID, state, err)
		}
	}
	return nil
}

// endUpdate moves the operation to an end state with op's outcomes folded into it (what the
// end decided from).
//
// A completed operation leaves the byState index (gsi1pk/gsi1sk removed): nothing lists
// completed operations (the reconciler reads pending-start, terminating and failed ones), and
// the index projects every attribute, so an entry would be a second copy of the item for its
// whole retention. It expires a retention after its end.
//
// A failed one is listed under its state by the time it ended (the reconciler reads failed
// ones oldest first, for the VMs they hold). It gets no expiry: it still holds the units of
// the VMs whose termination failed (they stay terminating), and if it expired, nothing could
// re-drive or end it and those units would never free. So it loses any expiry (one an earlier
// end or re-drive set) until a later end or a force-end completes it.
func (s *Store) endUpdate(op capacity.Operation, state capacity.OperationState, now time.Time) expression.UpdateBuilder {
	upd := expression.Set(expression.Name(attrState), expression.Value(state)).
		Set(expression.Name(attrOutcomes), expression.Value(foldOutcomes(op.Outcomes))).
		Set(expression.Name(attrUpdatedAt), expression.Value(now))
	if state == capacity.OpCompleted {
		return upd.Set(expression.Name(attrExpiresAt), expression.Value(expiry(now.Add(s.retention())))).
			Remove(expression.Name(attrGSI1PK)).Remove(expression.Name(attrGSI1SK))
	}
	return upd.Set(expression.Name(attrGSI1PK), expression.Value(opStatePK(state, op.ID))).
		Set(expression.Name(attrGSI1SK), expression.Value(opStateSKAt(now, op.ID))).
		Remove(expression.Name(attrExpiresAt))
}

// RestartOperation moves the operation, still in op.State at op's attempt, to pending-start
// at the next attempt with one more restart.
func (s *Store) RestartOperation(ctx context.Context, op capacity.Operation, now time.Time) error {
	upd := expression.Set(expression.Name(attrState), expression.Value(capacity.OpPendingStart)).
		Set(expression.Name(attrAttempt), expression.Value(op.CurrentAttempt()+1)).
		Set(expression.Name(attrRestarts), expression.Value(op.Restarts+1)).
		Set(expression.Name(attrUpdatedAt), expression.Value(now)).
		Set(expression.Name(attrGSI1PK), expression.Value(opStatePK(capacity.OpPendingStart, op.ID))).
		Set(expression.Name(attrGSI1SK), expression.Value(opStateSKAt(now, op.ID)))
	if _, err := s.updateItem(ctx, operationKey(op), stateAt(op.State, op), upd, types.ReturnValueNone); err != nil {
		return fmt.Errorf("restart operation %s: %w", op.ID, err)
	}
	return nil
}

// FailOperation ends the operation, still in op.State at op's attempt, as failed with the
// reason. Like any failed operation it does not expire (endUpdate).
func (s *Store) FailOperation(ctx context.Context, op capacity.Operation, reason string, now time.Time) error {
	upd := s.endUpdate(op, capacity.OpFailed, now).Set(expression.Name(attrReason), expression.Value(reason))
	if _, err := s.updateItem(ctx, operationKey(op), stateAt(op.State, op), upd, types.ReturnValueNone); err != nil {
		return fmt.Errorf("fail operation %s: %w", op.ID, err)
	}
	if err := s.keepNotices(ctx, op, now); err != nil {
		return fmt.Errorf("fail operation %s: %w", op.ID, err)
	}
	return nil
}

// HoldOperation removes the expiry of an operation still failed at op's attempt (an end
// before failed operations were kept set one) and of its failure outcomes, which held their
// recorded one then. The operation's update conditions on the state read; an outcome that is
// gone has nothing to keep.
func (s *Store) HoldOperation(ctx context.Context, op capacity.Operation) error {
	upd := expression.Remove(expression.Name(attrExpiresAt))
	if _, err := s.updateItem(ctx, operationKey(op), stateAt(capacity.OpFailed, op), upd, types.ReturnValueNone); err != nil {
		return fmt.Errorf("hold operation %s: %w", op.ID, err)
	}
	for _, vmID := range op.Held() {
		if _, ok := op.Outcomes[vmID]; !ok {
			continue
		}
		_, err := s.updateItem(ctx, outcomeKey(op, vmID), expression.Name(attrPK).AttributeExists(), upd, types.ReturnValueNone)
		if err != nil && !errors.Is(err, capacity.ErrConflict) {
			return fmt.Errorf("hold outcome of VM %s on operation %s: %w", vmID, op.ID, err)
		}
	}
	return nil
}

// RedriveOperation moves an ended operation (still in op.State at op's attempt) to
// pending-start at the next attempt, restarts reset and reason cleared, and appends the
// audit record, in one transaction. ErrConflict when the operation changed since read.
func (s *Store) RedriveOperation(ctx context.Context, op capacity.Operation, audit capacity.AuditRecord, now time.Time) error {
	upd := expression.Set(expression.Name(attrState), expression.Value(capacity.OpPendingStart)).
		Set(expression.Name(attrAttempt), expression.Value(op.CurrentAttempt()+1)).
		Set(expression.Name(attrRestarts), expression.Value(0)).
		Set(expression.Name(attrReason), expression.Value("")).
		Set(expression.Name(attrUpdatedAt), expression.Value(now)).
		Set(expression.Name(attrGSI1PK), expression.Value(opStatePK(capacity.OpPendingStart, op.ID))).
		Set(expression.Name(attrGSI1SK), expression.Value(opStateSKAt(now, op.ID))).
		// Live again, its VMs terminating: no expiry until its end sets one.
		Remove(expression.Name(attrExpiresAt))
	opUpd, err := s.update(operationKey(op), stateAt(op.State, op), upd)
	if err != nil {
		return fmt.Errorf("re-drive operation %s: %w", op.ID, err)
	}
	// The record goes on the node's audit chain in the same transaction.
	return s.appendChained(ctx, "re-drive operation "+op.ID, audit, s.nodeHead(audit.NodeID), []types.TransactWriteItem{opUpd}, nil)
}

func operationKey(op capacity.Operation) map[string]types.AttributeValue {
	return itemKey(opPK(op.NodeID, op.ID), skOperation)
}

// stateAt holds when the operation is in the state at op's attempt. Items written before
// attempts existed have no Attempt attribute: they are at the first.
func stateAt(state capacity.OperationState, op capacity.Operation) expression.ConditionBuilder {
	attempt := expression.Name(attrAttempt).Equal(expression.Value(op.CurrentAttempt()))
	if op.CurrentAttempt() == 1 {
		attempt = expression.Name(attrAttempt).AttributeNotExists().Or(expression.Name(attrAttempt).LessThanEqual(expression.Value(1)))
	}
	return expression.Name(attrState).Equal(expression.Value(state)).And(attempt)
}

// retryConflicts makes the SDK's retryer, for one call, also retry TransactionConflict, which
// AWS answers a single-item write that meets a transaction on the item (nothing was applied)
// and which the standard retryer does not retry; with up to 5 attempts, with its backoff. A
// write that still conflicts then is returned, never dropped.
func retryConflicts(o *dynamodb.Options) {
	o.Retryer = retry.AddWithMaxAttempts(retry.AddWithErrorCodes(o.Retryer, "TransactionConflictException"), 5)
}

// updateItem runs one conditional UpdateItem (built as in a transaction); a failed
// condition wraps capacity.ErrConflict.
func (s *Store) updateItem(ctx context.Context, k map[string]types.AttributeValue, cond expression.ConditionBuilder, upd expression.UpdateBuilder, rv types.ReturnValue) (map[string]types.AttributeValue, error) {
	it, err := s.update(k, cond, upd)
	if err != nil {
		return nil, err
	}
	u := it.Update
	out, err := s.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: u.TableName, Key: u.Key, ReturnValues: rv,
		ConditionExpression: u.ConditionExpression, UpdateExpression: u.UpdateExpression,
		ExpressionAttributeNames: u.ExpressionAttributeNames, ExpressionAttributeValues: u.ExpressionAttributeValues,
	}, retryConflicts)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil, fmt.Errorf("%w: %s", capacity.ErrConflict, aws.ToString(ccf.Message))
	}
	if err != nil {
		return nil, err
	}
	return out.Attributes, nil
}

// attrOutcomes holds an ended operation's folded outcomes (operationItem.Outcomes).
const attrOutcomes = "vms"

// mergeOutcomes is the folded outcomes updated by the outcome items read.
func mergeOutcomes(folded, items map[string]capacity.VMOutcome) map[string]capacity.VMOutcome {
	out := make(map[string]capacity.VMOutcome, len(folded)+len(items))
	for vm, o := range folded {
		out[vm] = o
	}
	for vm, o := range items {
		out[vm] = o
	}
	return out
}
