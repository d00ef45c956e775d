package capacity

import (
	"context"
	"errors"
	"time"
)

// Reclaim returns units to the reservation's exclusive use and evicts the spot VMs on them.
func (s *Service) Reclaim(ctx context.Context, p Principal, req CapacityRequest, meta RequestMeta) (*CapacityResult, error) {
	res, err := s.capacityCall(ctx, p, req, meta, ActionReclaim)
	s.recordCapacity(ctx, ActionReclaim, meta, res, err)
	return res, err
}

// Release puts idle exclusive units of the reservation on the spot market.
func (s *Service) Release(ctx context.Context, p Principal, req CapacityRequest, meta RequestMeta) (*CapacityResult, error) {
	res, err := s.capacityCall(ctx, p, req, meta, ActionRelease)
	s.recordCapacity(ctx, ActionRelease, meta, res, err)
	return res, err
}

func (s *Service) capacityCall(ctx context.Context, p Principal, req CapacityRequest, meta RequestMeta, action string) (*CapacityResult, error) {
	return s.capacityCallWith(ctx, p, req, meta, action, nil)
}

// capacityCallWith is capacityCall with a hook that adds to each round's commit (a scheduled
// reclaim's firing) or refuses it.
func (s *Service) capacityCallWith(ctx context.Context, p Principal, req CapacityRequest, meta RequestMeta, action string,
	hook func(c *Commit, res *CapacityResult, now time.Time) error) (*CapacityResult, error) {
	if err := req.admitFor(p, action); err != nil {
		return nil, err
	}
	key, err := keyed(p, meta, req.IdempotencyKey, fingerprintOf(action, req))
	if err != nil {
		return nil, err
	}
	var result *CapacityResult
	answers := map[string]*CapacityResult{} // each round's answer, by its commit's audit id
	var dryRun *AuditRecord                 // a dry run's or replay's audit record, appended after the rounds
	landed, err := s.apply(ctx, req.NodeID, key, func(st *NodeState, now time.Time) (*Commit, error) {
		// Access first: a caller who has lost access since gets the 404 (or 403), not the
		// answer stored under its key.
		if _, err := authorizeCapacityCall(p, st, req.ReservationID); err != nil {
			s.auditRefusal(ctx, s.auditRecord(p, st, req, meta, action, now), err)
			return nil, err
		}
		var res CapacityResult
		if replayed, err := replay(st.Idempotency, key.fingerprint, now, &res); replayed || err != nil {
			result = &res
			if replayed {
				dryRun = replayAudit(s.auditRecord(p, st, req, meta, action, now))
			}
			return nil, err
		}
		commit, decided, audit, err := s.decideCapacity(p, st, req, action, now, s.auditRecord(p, st, req, meta, action, now))
		if err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		result = decided
		if commit == nil { // a dry run: nothing to write but its audit record
			dryRun = &audit
			return nil, nil
		}
		if hook != nil {
			if err := hook(commit, result, now); err != nil {
				return nil, err
			}
		}
		answers[commit.Audit.ID] = result
		idem, err := s.idempotencyRecord(key, req.NodeID, result, now)
		commit.Idempotency = idem
		return commit, err
	})
	if errors.Is(err, errNodeNotFound) {
		return nil, notFound()
	}
	if dryRun != nil && err == nil {
		// Outside the decide phase: appending the record is a dry run's (or replay's) write.
		start := time.Now()
		s.append(ctx, *dryRun)
		CallStatsFrom(ctx).Since(PhaseCommit, start)
	}
	if landed != nil {
		// The round whose commit landed answers, even if a later round decided again.
		result = answers[landed.Audit.ID]
		if landed.Operation != nil {
			start := time.Now()
			s.startWorkflow(ctx, *landed.Operation)
			CallStatsFrom(ctx).Since(PhaseStart, start)
		}
	}
	if ErrorCode(err) == CodeConcurrentModification {
		st := &NodeState{Node: Node{ID: req.NodeID}}
		s.auditRefusal(ctx, s.auditRecord(p, st, req, meta, action, s.now()), err)
	}
	if err != nil {
		return nil, err
	}
	return result, nil
}

// capacityCommits writes capacity commits on a node with Store.Commit, each round reading the
// node (with the caller's idempotency record under scope).
func (s *Service) capacityCommits(nodeID, scope string) writer[NodeState, Commit] {
	return writer[NodeState, Commit]{
		kind: "capacity", subject: "the node's capacity", logAttrs: []any{"node", nodeID},
		read: nodeRead(s.Store.LoadNode, nodeID, scope),
		commit: func(ctx context.Context, c *Commit) error {
			if c.changesNothing() {
				return s.Store.RecordUnchanged(ctx, c.Audit, c.Idempotency)
			}
			return s.Store.Commit(ctx, *c)
		},
		audit:  func(c *Commit) AuditRecord { return c.Audit },
		landed: func(ctx context.Context, c *Commit) (bool, error) { return s.Store.Landed(ctx, *c) },
		raced:  func(before, after *NodeState, c *Commit) bool { return Raced(before, after, *c) },
	}
}

// apply runs read-decide-commit rounds of capacity commits (see commitRounds).
func (s *Service) apply(ctx context.Context, nodeID string, key idempotency, decide func(st *NodeState, now time.Time) (*Commit, error)) (*Commit, error) {
	return commitRounds(s, ctx, s.capacityCommits(nodeID, key.scope), anew(decide))
}

// anew is a decision that decides every round anew, whatever write is pending: the writes of
// a node's rounds condition on the node's version, which each of them bumps, so two cannot
// both land.
func anew[S, C any](decide func(st *S, now time.Time) (*C, error)) func(st *S, now time.Time, pending *C) (*C, error) {
	return func(st *S, now time.Time, _ *C) (*C, error) { return decide(st, now) }
}

// decideCapacity decides a reclaim or release and turns the plan into the commit (nil for a
// dry run), the caller's result and the audit record.
func (s *Service) decideCapacity(p Principal, st *NodeState, req CapacityRequest, action string, now time.Time, audit AuditRecord) (*Commit, *CapacityResult, AuditRecord, error) {
	plan, err := DecideCapacity(action, p, st, req, now)
	if err != nil {
		return nil, nil, audit, err
	}
	if err := plan.checkIfMatch(req.IfMatch, audit, now); err != nil {
		return nil, nil, audit, err
	}
	c, result, audit := plan.Commit("rcl_"+s.newID(), audit, now)
	return c, &result, audit, nil
}

// Place records a VM placed by the marketplace scheduler, if its tier may use the units.
func (s *Service) Place(ctx context.Context, p Principal, req PlacementRequest, meta RequestMeta) (*PlacementResult, error) {
	res, err := s.place(ctx, p, req, meta)
	c := CallOutcome{Action: ActionPlace, RequestID: meta.RequestID}
	if res != nil {
		c.Replayed, c.Applied = res.Replayed, !res.Replayed
	}
	s.recordCall(ctx, c, err)
	return res, err
}

func (s *Service) place(ctx context.Context, p Principal, req PlacementRequest, meta RequestMeta) (*PlacementResult, error) {
	if err := AdmitPlacement(p, req.NodeID); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	key, err := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionPlace, req))
	if err != nil {
		return nil, err
	}
	var result *PlacementResult
	var last AuditRecord      // the audit record of the last round's decision
	var replayed *AuditRecord // a replay's, appended after the rounds
	// each round's answer, by its commit's audit id
	answers := map[string]*PlacementResult{}
	landed, err := s.apply(ctx, req.NodeID, key, func(st *NodeState, now time.Time) (*Commit, error) {
		audit := AuditRecord{
			ID: s.newID(), Time: now, RequestID: meta.RequestID, ActorKeyID: p.KeyID, CallerOrgID: p.OrgID,
			ActingFor: st.Node.OwnerOrgID, Action: ActionPlace, NodeID: st.Node.ID, UnitIDs: req.UnitIDs,
			TopologyGen: st.Node.TopologyGen, VMID: req.VMID, Via: meta.via(), EventID: meta.EventID,
		}
		var res PlacementResult
		if ok, err := replay(st.Idempotency, key.fingerprint, now, &res); ok || err != nil {
			result = &res
			if ok {
				replayed = replayAudit(audit)
			}
			return nil, err
		}
		vm, err := DecidePlacement(p, st, req, now)
		if err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		last = audit
		audit.Outcome = "ok"
		result = &PlacementResult{VM: *vm}
		c := &Commit{Node: st.Node, BumpNode: true, NewVM: vm, Audit: audit}
		answers[audit.ID] = result
		idem, err := s.idempotencyRecord(key, req.NodeID, result, now)
		c.Idempotency = idem
		return c, err
	})
	if landed != nil {
		result = answers[landed.Audit.ID]
	}
	if replayed != nil && err == nil {
		s.append(ctx, *replayed)
	}
	if errors.Is(err, errNodeNotFound) {
		return nil, nodeNotFound()
	}
	if errors.Is(err, ErrVMExists) {
		err = Errorf(CodeVMExists, "VM %s existed on this node; VM ids are never reused", req.VMID)
		s.auditRefusal(ctx, last, err)
	}
	if err != nil {
		return nil, err
	}
	return result, nil
}

// startWorkflow starts the operation's termination workflow. The boundary change is
// committed whatever happens here: on failure the operation stays pending-start and the
// reconciler starts it later under the same execution name.
func (s *Service) startWorkflow(ctx context.Context, op Operation) {
	if s.Workflow == nil {
		return
	}
	if err := s.Workflow.Start(ctx, op); err != nil {
		s.logger().WarnContext(ctx, "termination workflow not started; the reconciler will start it",
			"reclaim_id", op.ID, "node", op.NodeID, "err", err)
	}
}

func (s *Service) auditRecord(p Principal, st *NodeState, req CapacityRequest, meta RequestMeta, action string, now time.Time) AuditRecord {
	return AuditRecord{
		ID: s.newID(), Time: now, RequestID: meta.RequestID, ActorKeyID: p.KeyID, CallerOrgID: p.OrgID,
		ActingFor: st.Node.OwnerOrgID, Action: action, NodeID: req.NodeID, ReservationID: req.ReservationID,
		UnitIDs: req.UnitIDs, DryRun: req.DryRun, Reason: req.Reason, TopologyGen: st.Node.TopologyGen,
		Via: meta.via(), EventID: meta.EventID,
	}
}
