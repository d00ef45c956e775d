package capacity

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// PutNode registers a node (Created, with the agent's key once) or updates its owner org and
// agent endpoint. Its unit list changes only through SetTopology.
func (s *Service) PutNode(ctx context.Context, p Principal, req NodeRequest, meta RequestMeta) (*NodeResult, error) {
	if !p.CanOperate(PermNodeManage) {
		return nil, nodeNotFound()
	}
	fp := req
	fp.UnitIDs = sortedSet(req.UnitIDs)
	var agentKey *newAgentKey // made once per call, whatever the rounds
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionNodePut, fp))
	return runOp(s, ctx, opCall[NodeResult]{
		rec:     s.opAudit(p, meta, ActionNodePut, req.NodeID, "", req.UnitIDs, req.Reason),
		invalid: cmp.Or(req.Validate(s.AllowHTTPAgents), kerr),
		key:     key,
		create:  true, missing: nodeNotFound,
		decide: func(st *NodeState, audit *AuditRecord, now time.Time) (*OperatorCommit, *NodeResult, error) {
			c, r, err := DecideNodePut(st, req, now)
			if err != nil {
				return c, r, err
			}
			ownerChanged := !r.Created && r.Node.OwnerOrgID != st.Node.OwnerOrgID
			if !r.Created && !ownerChanged {
				return c, r, nil
			}
			if r.Created {
				audit.ActingFor, audit.TopologyGen = r.Node.OwnerOrgID, r.Node.TopologyGen
			}
			k, err := s.issueAgentKey(ctx, req.NodeID, &agentKey)
			if err != nil {
				// An internal error: not audited as a refusal.
				return nil, nil, err
			}
			if k == nil {
				s.logger().WarnContext(ctx, "no agent key sealer: the node keeps its derived agent key and none is handed out", "node", req.NodeID)
				return c, r, nil
			}
			if r.Created {
				// Generation 1, with no previous key to fall back on.
				c.NewNode.AgentKeyGen, c.NewNode.AgentKey = 1, k.sealed
			} else {
				// A new owner gets a new key, so that the former owner's stops working once
				// the overlap is over.
				rotateAgentKey(c.NewNode, k.sealed, now)
			}
			r.Node, r.AgentKey = *c.NewNode, k.plain
			return c, r, nil
		},
		// The secret is never stored: a replay says it was shown instead.
		stored: func(r *NodeResult) *NodeResult {
			stored := *r
			stored.AgentKey, stored.SecretShown = nil, r.AgentKey != nil
			return &stored
		},
	})
}

// DecideNodePut decides a PUT of a node on the state read (a zero Node: it does not exist).
func DecideNodePut(st *NodeState, req NodeRequest, now time.Time) (*OperatorCommit, *NodeResult, error) {
	if st.Node.ID == "" {
		n := Node{
			ID: req.NodeID, OwnerOrgID: req.OwnerOrgID, AgentEndpoint: req.AgentEndpoint,
			UnitIDs: slices.Clone(req.UnitIDs), TopologyGen: 1, Version: 1,
		}
		return &OperatorCommit{Node: Node{ID: req.NodeID}, Create: true, NewNode: &n}, &NodeResult{Node: n, Created: true}, nil
	}
	if !sameSet(st.Node.UnitIDs, req.UnitIDs) {
		return nil, nil, Errorf(CodeInvalidTransition,
			"the node's unit list differs; change it with PUT /v1/nodes/%s/topology (this bumps its topology generation)", req.NodeID)
	}
	c := &OperatorCommit{Node: st.Node}
	n := st.Node
	if n.OwnerOrgID != req.OwnerOrgID || n.AgentEndpoint != req.AgentEndpoint {
		n.OwnerOrgID, n.AgentEndpoint = req.OwnerOrgID, req.AgentEndpoint
		n.Version++
		c.NewNode = &n
	}
	return c, &NodeResult{Node: n}, nil
}

// SetTopology replaces a node's unit list: the topology generation moves on and every
// active reservation that has not ended moves to needs-review, in the node's transaction
// (pending ones keep their status and generation). Nothing is terminated: the answer names the VMs on removed units.
func (s *Service) SetTopology(ctx context.Context, p Principal, req TopologyRequest, meta RequestMeta) (*TopologyResult, error) {
	// node.topology is the narrower grant of an event source (the fleet): topology only.
	if !p.CanOperate(PermNodeManage) && !p.CanOperate(PermTopology) || !ValidID(req.NodeID) {
		return nil, nodeNotFound()
	}
	fp := req
	fp.UnitIDs = sortedSet(req.UnitIDs)
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionTopologySet, fp))
	return runOp(s, ctx, opCall[TopologyResult]{
		rec:     s.opAudit(p, meta, ActionTopologySet, req.NodeID, "", req.UnitIDs, req.Reason),
		invalid: cmp.Or(req.Validate(), kerr),
		key:     key,
		missing: nodeNotFound,
		decide: func(st *NodeState, audit *AuditRecord, now time.Time) (*OperatorCommit, *TopologyResult, error) {
			c, r, err := DecideTopology(st, req, now)
			if err == nil {
				audit.TopologyGen = r.Node.TopologyGen
			}
			return c, r, err
		},
	})
}

// DecideTopology decides a topology change on the state read.
func DecideTopology(st *NodeState, req TopologyRequest, now time.Time) (*OperatorCommit, *TopologyResult, error) {
	if want := req.ExpectedTopologyGen; want != nil && *want != st.Node.TopologyGen {
		return nil, nil, Errorf(CodeTopologyChanged,
			"node %s is at topology generation %d; the change was made against generation %d", st.Node.ID, st.Node.TopologyGen, *want)
	}
	res := &TopologyResult{
		AddedUnitIDs: nonNil(notIn(req.UnitIDs, st.Node.UnitIDs)), RemovedUnitIDs: nonNil(notIn(st.Node.UnitIDs, req.UnitIDs)),
		NeedsReview: []string{}, VMsOnRemovedUnits: []VM{},
	}
	slices.Sort(res.AddedUnitIDs)
	slices.Sort(res.RemovedUnitIDs)
	if len(res.AddedUnitIDs) == 0 && len(res.RemovedUnitIDs) == 0 {
		res.Node = st.Node
		return &OperatorCommit{Node: st.Node}, res, nil
	}
	n := st.Node
	n.UnitIDs, n.TopologyGen, n.Version = slices.Clone(req.UnitIDs), n.TopologyGen+1, n.Version+1
	var moved []Reservation
	for _, r := range st.Reservations {
		// Only active ones: a pending reservation keeps its status (reaffirm would otherwise
		// be a way to activate it).
		if r.StatusAt(now) == StatusActive {
			r.Status, r.UpdatedAt = StatusNeedsReview, now
			r.Reason = fmt.Sprintf("topology changed: gen %d", n.TopologyGen)
			moved = append(moved, r)
			res.NeedsReview = append(res.NeedsReview, r.ID)
		}
	}
	if len(moved) > MaxTopologyReviews {
		return nil, nil, Errorf(CodeInvalidTransition,
			"the change would move %d reservations to needs-review; at most %d move in one change (cancel ended or unneeded ones first)",
			len(moved), MaxTopologyReviews)
	}
	slices.Sort(res.NeedsReview)
	res.Node, res.Changed = n, true
	res.VMsOnRemovedUnits = vmsOn(st.VMs, res.RemovedUnitIDs)
	return &OperatorCommit{Node: st.Node, NewNode: &n, Reservations: moved}, res, nil
}
