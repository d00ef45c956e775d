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
)

// The operator lifecycle's writes (capacity.OperatorStore): a node's registration and
// updates, reservation creation and status changes, and topology changes. Each is one
// TransactWriteItems whose single write of the node item (through auditWrites) both applies
// the change under the node's Version as read and advances the node's audit chain.

var _ capacity.OperatorStore = (*Store)(nil)

// Stored names of node and reservation attributes the operator writes set (the item structs'
// tags in items.go).
const (
	attrNodeID        = "ID"
	attrOwnerOrgID    = "OwnerOrgID"
	attrAgentEndpoint = "AgentEndpoint"
	attrUnitIDs       = "UnitIDs"
	attrTopologyGen   = "TopologyGen"
	attrStatus        = "Status"
	// The node agent's key (nodeItem).
	attrAgentKeyGen       = "AgentKeyGen"
	attrAgentKey          = "AgentKey"
	attrPrevAgentKey      = "PrevAgentKey"
	attrAgentKeyRotatedAt = "AgentKeyRotatedAt"
	attrAgentKeyEndedGen  = "AgentKeyOverlapEndedGen"
)

// LoadNodeOrNew is LoadNode for a write that may create the node: a missing node answers an
// empty state carrying the caller's idempotency record (which lives in the node's partition
// whether the node exists or not), so a retried registration finds its stored answer.
func (s *Store) LoadNodeOrNew(ctx context.Context, nodeID, idempotencyScope string) (*capacity.NodeState, error) {
	st, err := s.LoadNode(ctx, nodeID, idempotencyScope)
	if capacity.ErrorCode(err) != capacity.CodeNotFound {
		return st, err
	}
	st = &capacity.NodeState{}
	if idempotencyScope != "" {
		// Read after the node query found nothing: a record written with the node is then
		// seen whenever the node would have been.
		if st.Idempotency, err = s.idempotencyRecord(ctx, nodeID, idempotencyScope); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// GetNode reads the node item with one strongly consistent GetItem.
func (s *Store) GetNode(ctx context.Context, nodeID string) (*capacity.Node, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.Table), Key: itemKey(nodePK(nodeID), skNode), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", nodeID, classify(err))
	}
	if out.Item == nil || attr(out.Item, attrType) != typeNode {
		return nil, capacity.Errorf(capacity.CodeNotFound, "node %s not found", nodeID)
	}
	capacity.CallStatsFrom(ctx).AddRead(1, ItemSize(out.Item))
	var it nodeItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return nil, fmt.Errorf("decode node %s: %w", nodeID, err)
	}
	n := it.node()
	return &n, nil
}

// CommitOperator writes an operator decision in one transaction and returns the node's audit
// head after it. A transaction that failed only because the audit head moved (another call
// appended a record; the node's Version is as read) goes again on the new head without a new
// decision, up to headTries, as Commit does.
func (s *Store) CommitOperator(ctx context.Context, c capacity.OperatorCommit) (capacity.AuditHead, error) {
	var chained capacity.AuditRecord
	var start capacity.ChainStart
	// The list index entries the commit makes true go in its transaction; memberships that do
	// not fit (a reservation naming many orgs) go just before it (see putAhead).
	dirEntry, memberEntries := listEntries(c)
	dir, err := s.putItems(dirEntry)
	if err != nil {
		return capacity.AuditHead{}, fmt.Errorf("%s on node %s: %w", c.Audit.Action, c.Node.ID, err)
	}
	members, err := s.putItems(memberEntries)
	if err != nil {
		return capacity.AuditHead{}, fmt.Errorf("%s on node %s: %w", c.Audit.Action, c.Node.ID, err)
	}
	ahead, err := s.putItems(unlisted(memberEntries))
	if err != nil {
		return capacity.AuditHead{}, fmt.Errorf("%s on node %s: %w", c.Audit.Action, c.Node.ID, err)
	}
	err = s.transactAtHead(ctx, fmt.Sprintf("%s on node %s", c.Audit.Action, c.Node.ID), c.Node,
		func(head capacity.AuditHead, pin *capacity.ChainStart) ([]types.TransactWriteItem, error) {
			c.Node.AuditHead, start = head, head.Start
			if pin != nil {
				start = *pin
			}
			items, rec, err := s.operatorItems(c, pin, append(slices.Clone(dir), members...))
			if err == nil && len(items) > MaxTransactItems && len(members) > 0 {
				if err = s.putAhead(ctx, c.Node.ID, ahead); err != nil {
					return nil, err
				}
				members = nil
				items, rec, err = s.operatorItems(c, pin, dir)
			}
			chained = rec
			if err != nil {
				return nil, fmt.Errorf("%s on node %s: %w", c.Audit.Action, c.Node.ID, err)
			}
			return items, nil
		}, nil)
	if err != nil {
		return capacity.AuditHead{}, err
	}
	return capacity.AuditHead{Seq: chained.Seq, Hash: chained.Hash, Start: start}, nil
}

// setAgentKey adds the agent key's attributes to u when n moved to another generation than
// was read, and the generation whose overlap was ended when that changed. Only SETs (the emulator drops the SET part of an update that also REMOVEs): a
// previous key is absent only at generation 1, whose previous is the derived key, and then
// the attribute is absent already.
func setAgentKey(u expression.UpdateBuilder, read, n capacity.Node) expression.UpdateBuilder {
	if n.AgentKeyOverlapEndedGen != read.AgentKeyOverlapEndedGen {
		u = u.Set(expression.Name(attrAgentKeyEndedGen), expression.Value(n.AgentKeyOverlapEndedGen))
	}
	if n.AgentKeyGen == read.AgentKeyGen {
		return u
	}
	u = u.Set(expression.Name(attrAgentKeyGen), expression.Value(n.AgentKeyGen)).
		Set(expression.Name(attrAgentKey), expression.Value(n.AgentKey))
	if len(n.PrevAgentKey) > 0 {
		u = u.Set(expression.Name(attrPrevAgentKey), expression.Value(n.PrevAgentKey))
	}
	if !n.AgentKeyRotatedAt.IsZero() {
		u = u.Set(expression.Name(attrAgentKeyRotatedAt), expression.Value(n.AgentKeyRotatedAt))
	}
	return u
}

// operatorItems returns the transaction of an operator commit: the node's Update with the
// audit record (auditWrites), the new or changed reservations, the list index entries, the
// idempotency record (the audit record's put last: transactAtHead looks for it there).
func (s *Store) operatorItems(c capacity.OperatorCommit, pin *capacity.ChainStart, entries []types.TransactWriteItem) ([]types.TransactWriteItem, capacity.AuditRecord, error) {
	var upd *expression.UpdateBuilder
	var cond expression.ConditionBuilder
	switch {
	case c.Create:
		n := c.NewNode
		if n == nil || n.ID != c.Node.ID {
			return nil, c.Audit, fmt.Errorf("create of node %s without the node", c.Node.ID)
		}
		// An Update that creates the item: the node and its audit head in one write.
		u := expression.Set(expression.Name(attrType), expression.Value(typeNode)).
			Set(expression.Name(attrNodeID), expression.Value(n.ID)).
			Set(expression.Name(attrOwnerOrgID), expression.Value(n.OwnerOrgID)).
			Set(expression.Name(attrAgentEndpoint), expression.Value(n.AgentEndpoint)).
			Set(expression.Name(attrUnitIDs), expression.Value(n.UnitIDs)).
			Set(expression.Name(attrTopologyGen), expression.Value(n.TopologyGen)).
			Set(expression.Name(attrVersion), expression.Value(int64(1)))
		u = setAgentKey(u, capacity.Node{}, *n)
		upd = &u
		cond = expression.Name(attrPK).AttributeNotExists()
	case c.NewNode != nil:
		n := c.NewNode
		u := bump(expression.Set(expression.Name(attrOwnerOrgID), expression.Value(n.OwnerOrgID)).
			Set(expression.Name(attrAgentEndpoint), expression.Value(n.AgentEndpoint)).
			Set(expression.Name(attrUnitIDs), expression.Value(n.UnitIDs)).
			Set(expression.Name(attrTopologyGen), expression.Value(n.TopologyGen)), c.Node.Version)
		u = setAgentKey(u, c.Node, *n)
		upd = &u
		cond = versionIs(c.Node.Version)
	case c.BumpNode:
		u := bump(expression.UpdateBuilder{}, c.Node.Version)
		upd = &u
		cond = versionIs(c.Node.Version)
	default:
		cond = versionIs(c.Node.Version)
	}
	audit, chained, err := s.auditWrites(c.Audit, c.Node.AuditHead, pin, s.nodeHead(c.Node.ID), upd, &cond)
	if err != nil {
		return nil, c.Audit, fmt.Errorf("node %s: %w", c.Node.ID, err)
	}
	items := []types.TransactWriteItem{audit[0]}
	if r := c.NewReservation; r != nil {
		put, err := s.putNew(s.Table, newReservationItem(*r), nil)
		if err != nil {
			return nil, c.Audit, fmt.Errorf("reservation %s: %w", r.ID, err)
		}
		items = append(items, put)
	}
	for _, r := range c.Reservations {
		u := bump(expression.Set(expression.Name(attrStatus), expression.Value(string(r.Status))).
			Set(expression.Name(attrReason), expression.Value(r.Reason)).
			Set(expression.Name(attrTopologyGen), expression.Value(r.TopologyGen)).
			Set(expression.Name(attrReleasedUnitIDs), expression.Value(r.ReleasedUnitIDs)).
			Set(expression.Name(attrUpdatedAt), expression.Value(r.UpdatedAt)), r.Version)
		it, err := s.update(itemKey(nodePK(c.Node.ID), prefixReserv+r.ID), versionIs(r.Version), u)
		if err != nil {
			return nil, c.Audit, fmt.Errorf("reservation %s: %w", r.ID, err)
		}
		items = append(items, it)
	}
	if c.ForceEnd != nil {
		fe, err := s.forceEndItems(*c.ForceEnd)
		if err != nil {
			return nil, c.Audit, fmt.Errorf("force-end of VM %s: %w", c.ForceEnd.VMID, err)
		}
		items = append(items, fe...)
	}
	items = append(items, entries...)
	if c.Idempotency != nil {
		rec := *c.Idempotency
		if c.AnswerAt != nil {
			// The answer names the head this transaction leaves (as CommitOperator returns it).
			head := capacity.AuditHead{Seq: chained.Seq, Hash: chained.Hash, Start: c.Node.AuditHead.Start}
			if pin != nil {
				head.Start = *pin
			}
			if rec.Result, err = c.AnswerAt(head); err != nil {
				return nil, c.Audit, fmt.Errorf("encode the answer of %s on node %s: %w", c.Audit.Action, c.Node.ID, err)
			}
		}
		put, err := s.idempotencyPut(rec)
		if err != nil {
			return nil, c.Audit, err
		}
		items = append(items, put)
	}
	return append(items, audit[1:]...), chained, nil
}

// ListReservations reads up to limit reservations of the node after afterID, in id order,
// with a strongly consistent Query. It asks for one item more than the page, so that more is
// true only when another reservation follows.
func (s *Store) ListReservations(ctx context.Context, nodeID string, limit int, afterID string) ([]capacity.Reservation, bool, error) {
	sk := expression.Key(attrSK).BeginsWith(prefixReserv)
	if afterID != "" {
		// The range after afterID, which need not exist (the emulator would start an
		// ExclusiveStartKey that names no item from the top): ids are of capacity.ValidID's
		// characters, so the first id after x is x+"-" at the least, and every id sorts
		// before "~".
		sk = expression.Key(attrSK).Between(expression.Value(prefixReserv+afterID+"-"), expression.Value(prefixReserv+"~"))
	}
	keyCond := expression.Key(attrPK).Equal(expression.Value(nodePK(nodeID))).And(sk)
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).Build()
	if err != nil {
		return nil, false, fmt.Errorf("build reservations query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.Table), KeyConditionExpression: expr.KeyCondition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ConsistentRead: aws.Bool(true), Limit: aws.Int32(int32(limit + 1)),
	}
	var out []capacity.Reservation
	stats := capacity.CallStatsFrom(ctx)
	// A page may come back short (1 MB), so read on until limit+1 items or the end.
	for {
		page, err := s.Client.Query(ctx, in)
		if err != nil {
			return nil, false, fmt.Errorf("query reservations of node %s: %w", nodeID, classify(err))
		}
		for _, item := range page.Items {
			stats.AddRead(1, ItemSize(item))
			if len(out) == limit {
				return out, true, nil
			}
			var it reservationItem
			if err := attributevalue.UnmarshalMap(item, &it); err != nil {
				return nil, false, fmt.Errorf("decode reservation of node %s: %w", nodeID, err)
			}
			out = append(out, it.reservation())
		}
		if page.LastEvaluatedKey == nil {
			return out, false, nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
		in.Limit = aws.Int32(int32(limit + 1 - len(out)))
	}
}

// forceEndItems are a force-end's writes, each conditioned on what its decision read: the VM
// terminating for the operation at its version moves to the node's history as terminated
// (or, no longer live, is checked absent); its outcome replaces nothing but a failure; the
// operation is still failed at its attempt, and when this outcome is its last, completes
// with an expiry and its outcomes folded into it, else the other VMs still lack a success.
func (s *Store) forceEndItems(fe capacity.ForceEnd) ([]types.TransactWriteItem, error) {
	op := fe.Operation
	now := fe.Outcome.At
	var items []types.TransactWriteItem
	add := func(it types.TransactWriteItem, err error) error {
		items = append(items, it)
		return err
	}
	live := itemKey(nodePK(op.NodeID), prefixVM+fe.VMID)
	if vm := fe.VM; vm != nil {
		cond := expression.Name(attrState).Equal(expression.Value(capacity.VMTerminating)).
			And(expression.Name(attrReclaimID).Equal(expression.Value(op.ID))).
			And(versionIs(vm.Version))
		if err := add(s.deleteIf(live, cond)); err != nil {
			return nil, err
		}
		done := *vm
		done.State, done.UpdatedAt, done.Version = capacity.VMTerminated, now, vm.Version+1
		// Its history may be there already, this operation's: a move cut off before its
		// delete (moveToHistory).
		ours := historyOf(op)
		if err := add(s.putNew(s.Table, newHistoryItem(done, s.retention()), &ours)); err != nil {
			return nil, err
		}
	} else if err := add(s.check(live, expression.Name(attrPK).AttributeNotExists())); err != nil {
		return nil, err
	}
	failed := expression.Name(attrOutcome).Equal(expression.Value(capacity.OutcomeFailed))
	if err := add(s.putNew(s.Table, newOutcomeItem(op, fe.VMID, fe.Outcome, s.retention()), &failed)); err != nil {
		return nil, err
	}
	if !fe.Complete {
		// What kept it from completing the operation, as read: the other VMs without a
		// success. A force-end of one of them landing first fails this one, which, moving
		// no version, would otherwise go again on the new audit head (transactAtHead) and
		// leave the operation failed with every VM ended.
		for _, id := range op.VMIDs {
			if o, ok := op.Outcomes[id]; id == fe.VMID || ok && o.Outcome != capacity.OutcomeFailed {
				continue
			}
			if err := add(s.check(outcomeKey(op, id), expression.Name(attrPK).AttributeNotExists().Or(failed))); err != nil {
				return nil, err
			}
		}
		return items, add(s.check(operationKey(op), stateAt(capacity.OpFailed, op)))
	}
	// The end folds every outcome, this one too, into the operation, which keeps them for
	// the retention (the outcome items expire on their own).
	ended := op
	ended.Outcomes = mergeOutcomes(op.Outcomes, map[string]capacity.VMOutcome{fe.VMID: fe.Outcome})
	upd := s.endUpdate(ended, capacity.OpCompleted, now).Set(expression.Name(attrReason), expression.Value(""))
	if err := add(s.update(operationKey(op), stateAt(capacity.OpFailed, op), upd)); err != nil {
		return nil, err
	}
	return items, nil
}
