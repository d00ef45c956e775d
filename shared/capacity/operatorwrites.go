package capacity

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"
)

// opAudit is the audit record of an operator call, completed by each round.
func (s *Service) opAudit(p Principal, meta RequestMeta, action, nodeID, reservationID string, units []string, reason string) AuditRecord {
	return AuditRecord{
		ID: s.newID(), Time: s.now(), RequestID: meta.RequestID, ActorKeyID: p.KeyID, CallerOrgID: p.OrgID,
		Action: action, NodeID: nodeID, ReservationID: reservationID, UnitIDs: slices.Clone(units), Reason: reason,
		Via: meta.via(), EventID: meta.EventID,
	}
}

// refuseInput audits a request refused on its own (before anything was read), and returns err.
func (s *Service) refuseInput(ctx context.Context, rec AuditRecord, err error) error {
	if ValidID(rec.NodeID) {
		s.auditRefusal(ctx, rec, err)
	}
	return err
}

// operatorCommits writes operator commits on a node with CommitOperator. create reads a
// missing node as a zero node (PUT node); otherwise a missing node is errNodeNotFound.
func (s *Service) operatorCommits(ops OperatorStore, nodeID, scope string, create bool) writer[NodeState, OperatorCommit] {
	load := s.Store.LoadNode
	if create {
		load = ops.LoadNodeOrNew
	}
	return writer[NodeState, OperatorCommit]{
		kind: "operator", subject: "the node", logAttrs: []any{"node", nodeID},
		read: nodeRead(load, nodeID, scope),
		commit: func(ctx context.Context, c *OperatorCommit) error {
			if c.changesNothing() {
				// Recorded on the calls chain: the node's head stays as read, and is answered.
				return s.Store.RecordUnchanged(ctx, c.Audit, c.Idempotency)
			}
			head, err := ops.CommitOperator(ctx, *c)
			if err == nil {
				c.Node.AuditHead = head
			}
			return err
		},
		audit: func(c *OperatorCommit) AuditRecord { return c.Audit },
		// Found by its audit record, as for capacity commits.
		landed: func(ctx context.Context, c *OperatorCommit) (bool, error) {
			ok, err := s.landedOn(ctx, c.Node, c.Audit)
			if ok {
				s.readBackHead(ctx, ops, c)
			}
			return ok, err
		},
	}
}

// readBackHead completes an operator commit found to have landed: the store may have chained
// its record on a head that moved after the decision's read, so the head is read back (it may
// be past the record if more were appended since). Only if that read fails is it computed from
// the head as read, right when nothing else was appended.
func (s *Service) readBackHead(ctx context.Context, ops OperatorStore, c *OperatorCommit) {
	n, err := ops.GetNode(ctx, c.Node.ID)
	if err == nil {
		c.Node.AuditHead = n.AuditHead
		return
	}
	s.logger().WarnContext(ctx, "read back the audit head of a landed commit failed; answering the head computed from the one read",
		"node", c.Node.ID, "audit_id", c.Audit.ID, "err", err)
	_, c.Node.AuditHead = ChainAuditRecord(c.Audit, c.Node.AuditHead)
}

// applyOperator runs read-decide-commit rounds like apply, for operator commits. It returns
// the commit that landed, its Node.AuditHead the node's audit head after it.
func (s *Service) applyOperator(ctx context.Context, nodeID string, key idempotency, create bool,
	decide func(st *NodeState, now time.Time) (*OperatorCommit, error)) (*OperatorCommit, error) {
	ops, err := s.operatorStore()
	if err != nil {
		return nil, err
	}
	return commitRounds(s, ctx, s.operatorCommits(ops, nodeID, key.scope, create), anew(decide))
}

// opCall is what one operator write states; runOp does the rest, the same for every write.
type opCall[R any] struct {
	rec     AuditRecord // the call's audit record (opAudit); each round completes a copy
	invalid error       // the request's own check (Validate): a refusal before anything is read
	key     idempotency
	create  bool          // a missing node reads as a zero node (PUT node)
	missing func() *Error // the 404 of a missing node
	// decide decides one round on the state read, completing the round's audit record; its
	// error is the call's refusal, audited.
	decide func(st *NodeState, audit *AuditRecord, now time.Time) (*OperatorCommit, *R, error)
	// stored, if set, is what the idempotency record keeps of an answer (never a secret).
	stored func(r *R) *R
}

// runOp runs an operator write: the request's own check, then rounds that answer a replay
// under the Idempotency-Key, decide, audit a refusal and remember the answer in the commit.
// The answer is that of the round whose commit landed; a call that kept losing races is
// audited as refused.
func runOp[R any](s *Service, ctx context.Context, call opCall[R]) (*R, error) {
	if call.invalid != nil {
		return nil, s.refuseInput(ctx, call.rec, call.invalid)
	}
	nodeID := call.rec.NodeID
	var result *R
	var replayed *AuditRecord  // a replay's audit record, appended after the rounds
	answers := map[string]*R{} // each round's answer, by its commit's audit id
	landed, err := s.applyOperator(ctx, nodeID, call.key, call.create, func(st *NodeState, now time.Time) (*OperatorCommit, error) {
		var res R
		if ok, err := replay(st.Idempotency, call.key.fingerprint, now, &res); ok || err != nil {
			result = &res
			if ok {
				replayed = replayAudit(s.roundAudit(call.rec, st, now))
			}
			return nil, err
		}
		audit := s.roundAudit(call.rec, st, now)
		c, r, err := call.decide(st, &audit, now)
		if err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		audit.Outcome = "ok"
		c.Audit = audit
		answers[audit.ID] = r
		stored := r
		if call.stored != nil {
			stored = call.stored(r)
		}
		idem, err := s.idempotencyRecord(call.key, nodeID, stored, now)
		c.Idempotency = idem
		if _, ok := any(stored).(interface{ setHead(AuditHead) }); ok && idem != nil {
			c.AnswerAt = func(head AuditHead) ([]byte, error) {
				answer := *stored
				any(&answer).(interface{ setHead(AuditHead) }).setHead(head)
				return json.Marshal(answer)
			}
		}
		return c, err
	})
	if errors.Is(err, errNodeNotFound) {
		return nil, call.missing()
	}
	if replayed != nil && err == nil {
		s.append(ctx, *replayed)
	}
	if landed != nil {
		result = answers[landed.Audit.ID]
		if set, ok := any(result).(interface{ setHead(AuditHead) }); ok {
			set.setHead(landed.Node.AuditHead)
		}
	}
	if ErrorCode(err) == CodeConcurrentModification {
		rec := call.rec
		rec.ID, rec.Time = s.newID(), s.now()
		s.auditRefusal(ctx, rec, err)
	}
	if err != nil {
		return nil, err
	}
	return result, nil
}

func (r *NodeResult) setHead(h AuditHead)     { r.Node.AuditHead = h }
func (r *TopologyResult) setHead(h AuditHead) { r.Node.AuditHead = h }

// roundAudit is the call's audit record for one round: a fresh id and time, the node's
// owner and topology generation as read.
func (s *Service) roundAudit(rec AuditRecord, st *NodeState, now time.Time) AuditRecord {
	rec.ID, rec.Time = s.newID(), now
	rec.ActingFor, rec.TopologyGen = st.Node.OwnerOrgID, st.Node.TopologyGen
	return rec
}

// sortedSet returns a sorted copy (fingerprints treat id lists as sets).
func sortedSet(ids []string) []string { return slices.Sorted(slices.Values(ids)) }

func sameSet(a, b []string) bool { return slices.Equal(sortedSet(a), sortedSet(b)) }
