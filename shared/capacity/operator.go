package capacity

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// The operator lifecycle: registering nodes, creating, cancelling and re-affirming
// reservations, and changing a node's topology. Only an operator may call these (everyone else
// gets the one 404, which says nothing about what exists); reads of a node and its
// reservations are also open to the node's owner and, scoped, to the reservations' orgs.
// Every write is one transaction conditioned on what the decision read, re-decided when a
// concurrent write won, audited, and repeat-safe under an Idempotency-Key.

// OperatorStore is what the operator lifecycle needs from the store besides Store. The
// service finds it on its Store (shared/dynamo implements both).
type OperatorStore interface {
	// LoadNodeOrNew is LoadNode for a call that may create the node: a missing node answers
	// a NodeState with a zero Node (ID "") and nothing else but the caller's idempotency
	// record, which lives in the node's partition whether or not the node exists.
	LoadNodeOrNew(ctx context.Context, nodeID, idempotencyScope string) (*NodeState, error)
	// GetNode reads the node item alone, strongly consistent; CodeNotFound when missing.
	GetNode(ctx context.Context, nodeID string) (*Node, error)
	// CommitOperator writes an operator decision in one transaction, every write conditioned
	// on what the decision read, and returns the node's audit head after it. Failures wrap
	// ErrConflict, ErrAmbiguous or ErrThrottled as Commit's do.
	CommitOperator(ctx context.Context, c OperatorCommit) (AuditHead, error)
	// ListReservations returns up to limit reservations of the node in id order, after the
	// reservation afterID ("" from the first; it need not exist), and whether more follow.
	ListReservations(ctx context.Context, nodeID string, limit int, afterID string) ([]Reservation, bool, error)
}

// OperatorCommit is one operator decision's writes.
type OperatorCommit struct {
	// Node is the node as read: the store conditions on its Version (on its absence when
	// Create) and chains Audit after its AuditHead. Its ID is always set.
	Node Node
	// Create: the node did not exist; NewNode is created.
	Create bool
	// NewNode, when set, is the node after the write (owner, endpoint, units, topologyGen);
	// the store writes it with Version+1. Nil with BumpNode: only the version moves; nil
	// without, and nothing else to write (changesNothing): the service records the call with
	// Store.RecordUnchanged instead.
	NewNode  *Node
	BumpNode bool
	// NewReservation is put; its id must be free.
	NewReservation *Reservation
	// Reservations are changed ones (Status, Reason, TopologyGen, ReleasedUnitIDs,
	// UpdatedAt written), each conditioned on its Version as read and bumped.
	Reservations []Reservation
	Idempotency  *IdempotencyRecord
	// AnswerAt, when set, gives Idempotency's Result for the audit head the commit leaves
	// on the node: an answer that names that head (a node put's, a topology change's) is
	// stored as it is answered, so a replay answers it too. Only the store knows the head,
	// once it has chained the record (it chains again on a head that moved meanwhile).
	AnswerAt func(head AuditHead) ([]byte, error)
	Audit    AuditRecord
	// ForceEnd, when set, ends a VM's termination on its operation (see ForceEnd).
	ForceEnd *ForceEnd
}

// changesNothing reports whether the commit writes no state (a repeat: a node put or a
// topology as they are, a reservation cancelled again, a force-end of a VM already ended).
func (c *OperatorCommit) changesNothing() bool {
	return !c.Create && c.NewNode == nil && !c.BumpNode && c.NewReservation == nil && len(c.Reservations) == 0 && c.ForceEnd == nil
}

// NodeRequest registers a node or updates its owner and agent endpoint.
type NodeRequest struct {
	NodeID, OwnerOrgID, AgentEndpoint, Reason, IdempotencyKey string
	UnitIDs                                                   []string
}

// NodeResult is the answer to PutNode. AgentKey, the node agent's key, is set only in the
// answer that created the node or changed its owner (which rotates the key: the former owner's
// copy stops working after AgentKeyOverlap): it is never stored, so a replay carries
// SecretShown instead.
type NodeResult struct {
	Node        Node
	Created     bool
	AgentKey    []byte `json:"-"`
	SecretShown bool
	Replayed    bool `json:"-"`
}

// ReservationRequest creates a reservation. ID is optional (generated when empty), Status
// active (default) or pending.
type ReservationRequest struct {
	NodeID, ID                                     string
	Status                                         Status
	StartsAt                                       time.Time
	EndsAt                                         *time.Time
	AllowedOrgIDs, ManagingOrgIDs, ReservedUnitIDs []string
	ContractRef, Reason, IdempotencyKey            string
}

// ReservationChange cancels or re-affirms a reservation.
type ReservationChange struct {
	NodeID, ReservationID, Reason, IdempotencyKey string
}

// ReservationResult is the answer to a reservation write. VMsOnUnits (cancel only) are the
// live VMs on the reservation's units, which a cancel leaves running.
type ReservationResult struct {
	Reservation Reservation
	VMsOnUnits  []VM
	Replayed    bool `json:"-"`
}

// TopologyRequest replaces a node's unit list.
type TopologyRequest struct {
	NodeID         string
	UnitIDs        []string
	Reason         string
	IdempotencyKey string
	// ExpectedTopologyGen, when set, is the generation the change was made against: a node at
	// another one refuses it (topology_changed), so a stale change delivered late (SQS is
	// unordered) never undoes a newer one. Left out of the fingerprint when nil, so records
	// stored before it existed still match.
	ExpectedTopologyGen *int64 `json:",omitempty"`
}

// TopologyResult is the answer to SetTopology.
type TopologyResult struct {
	Node                         Node
	Changed                      bool
	AddedUnitIDs, RemovedUnitIDs []string
	// NeedsReview are the reservations moved to needs-review.
	NeedsReview       []string
	VMsOnRemovedUnits []VM
	Replayed          bool `json:"-"`
}

// PageRequest asks for one page of a list: Limit 0 means DefaultPageLimit.
type PageRequest struct {
	Limit  int
	Cursor string
}

// ReservationPage is one page of a node's reservations.
type ReservationPage struct {
	Reservations []Reservation
	NextCursor   string
}

// Limits of the operator calls.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 100
	// MaxTopologyReviews bounds the reservations one topology change moves to needs-review:
	// they are written in the node's transaction (at most 100 actions).
	MaxTopologyReviews = 90
	MaxOrgIDs          = 100
	MaxContractRefLen  = 256
	MaxEndpointLen     = 2048
)

// Limit returns the page size asked for, or an invalid_request.
func (p PageRequest) limit() (int, error) {
	switch {
	case p.Limit == 0:
		return DefaultPageLimit, nil
	case p.Limit < 1 || p.Limit > MaxPageLimit:
		return 0, Errorf(CodeInvalidRequest, "limit must be 1 to %d", MaxPageLimit)
	}
	return p.Limit, nil
}

func invalidID(member string) *Error {
	return Errorf(CodeInvalidRequest, "%s is required: letters, digits, '.', '_', ':' or '-', at most %d", member, MaxIDLen)
}

// Validate checks the request on its own. allowHTTP admits http agent endpoints (the local
// environment only).
func (r NodeRequest) Validate(allowHTTP bool) error {
	if !ValidID(r.NodeID) {
		return invalidID("nodeId")
	}
	if !ValidID(r.OwnerOrgID) {
		return invalidID("ownerOrgId")
	}
	if err := validateUnitIDs(r.UnitIDs); err != nil {
		return err
	}
	if _, err := ParseAgentEndpoint(r.AgentEndpoint, allowHTTP); err != nil {
		return err
	}
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// validateOrgIDs checks an org list: well-formed, unique ids (it may be empty).
func validateOrgIDs(member string, ids []string) error {
	if len(ids) > MaxOrgIDs {
		return Errorf(CodeInvalidRequest, "%s names %d orgs; at most %d", member, len(ids), MaxOrgIDs)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if !ValidID(id) {
			return Errorf(CodeInvalidRequest, "%s holds a malformed org id", member)
		}
		if seen[id] {
			return Errorf(CodeInvalidRequest, "%s names org %s more than once", member, id)
		}
		seen[id] = true
	}
	return nil
}

// Validate checks the request on its own, before anything is read (path ids excepted).
func (r ReservationRequest) Validate(now time.Time) error {
	if r.ID != "" && !ValidID(r.ID) {
		return invalidID("id")
	}
	switch r.Status {
	case "", StatusActive, StatusPending:
	default:
		return Errorf(CodeInvalidRequest, "status must be active or pending")
	}
	if r.StartsAt.IsZero() {
		return Errorf(CodeInvalidRequest, "startsAt is required")
	}
	if r.EndsAt != nil {
		if !r.EndsAt.After(r.StartsAt) {
			return Errorf(CodeInvalidRequest, "endsAt must be after startsAt")
		}
		if !r.EndsAt.After(now) {
			return Errorf(CodeInvalidRequest, "endsAt is in the past")
		}
	}
	if err := validateOrgIDs("allowedOrgIds", r.AllowedOrgIDs); err != nil {
		return err
	}
	if err := validateOrgIDs("managingOrgIds", r.ManagingOrgIDs); err != nil {
		return err
	}
	if err := validateUnitIDs(r.ReservedUnitIDs); err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Message = strings.Replace(e.Message, "unitIds", "reservedUnitIds", 1)
		}
		return err
	}
	if !utf8.ValidString(r.ContractRef) || len(r.ContractRef) > MaxContractRefLen {
		return Errorf(CodeInvalidRequest, "contractRef must be valid UTF-8 of at most %d bytes", MaxContractRefLen)
	}
	if err := validateText("contractRef", r.ContractRef); err != nil {
		return err
	}
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// Validate checks the request on its own (path ids are checked by the gate).
func (r ReservationChange) Validate() error {
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// Validate checks the request on its own (the node id is checked by the gate).
func (r TopologyRequest) Validate() error {
	if err := validateUnitIDs(r.UnitIDs); err != nil {
		return err
	}
	if r.ExpectedTopologyGen != nil && *r.ExpectedTopologyGen < 1 {
		return Errorf(CodeInvalidRequest, "expectedTopologyGen must be at least 1")
	}
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// operatorStore is the store's operator part.
func (s *Service) operatorStore() (OperatorStore, error) {
	ops, ok := s.Store.(OperatorStore)
	if !ok {
		return nil, fmt.Errorf("store %T does not implement the operator lifecycle", s.Store)
	}
	return ops, nil
}

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

// operatorCommits writes operator commits with CommitOperator. create reads a missing node as
// a zero node (PUT node); otherwise a missing node is errNodeNotFound.
func (s *Service) operatorCommits(ops OperatorStore, create bool) committer[OperatorCommit] {
	load := s.Store.LoadNode
	if create {
		load = ops.LoadNodeOrNew
	}
	return committer[OperatorCommit]{
		kind: "operator", subject: "the node",
		load: load,
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
		// Found by its audit record, as for capacity commits.
		probe: func(c *OperatorCommit) Commit { return Commit{Node: c.Node, Audit: c.Audit} },
		// A commit found to have landed: the store may have chained its record on a head
		// that moved after the decision's read, so the head is read back (it may be past the
		// record if more were appended since). Only if that read fails is it computed from
		// the head as read, right when nothing else was appended.
		found: func(ctx context.Context, c *OperatorCommit) {
			n, err := ops.GetNode(ctx, c.Node.ID)
			if err == nil {
				c.Node.AuditHead = n.AuditHead
				return
			}
			s.logger().WarnContext(ctx, "read back the audit head of a landed commit failed; answering the head computed from the one read",
				"node", c.Node.ID, "audit_id", c.Audit.ID, "err", err)
			_, c.Node.AuditHead = ChainAuditRecord(c.Audit, c.Node.AuditHead)
		},
	}
}

// applyOperator runs read-decide-commit rounds like apply, for operator commits. It returns
// the commit that landed, its Node.AuditHead the node's audit head after it.
func (s *Service) applyOperator(ctx context.Context, nodeID string, key idempotency, create bool,
	decide func(st *NodeState, now time.Time) (*OperatorCommit, error)) (*OperatorCommit, error) {
	ops, err := s.operatorStore()
	if err != nil {
		return nil, err
	}
	return applyRounds(s, ctx, nodeID, key, s.operatorCommits(ops, create), decide)
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

// readNode reads the node item alone, for the read calls; a missing node is the node's 404.
func (s *Service) readNode(ctx context.Context, nodeID string) (OperatorStore, *Node, error) {
	ops, err := s.operatorStore()
	if err != nil {
		return nil, nil, err
	}
	n, err := ops.GetNode(ctx, nodeID)
	if ErrorCode(err) == CodeNotFound {
		return nil, nil, nodeNotFound()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read node %s: %w", nodeID, err)
	}
	return ops, n, nil
}

// GetNode returns a node to an operator holding node.manage or reservation.read, or to its
// owner org with reservation.read.
func (s *Service) GetNode(ctx context.Context, p Principal, nodeID string) (*Node, error) {
	anyNode := p.CanOperate(PermNodeManage) || p.CanOperate(PermRead)
	if !anyNode && !p.Can(PermRead) || !ValidID(nodeID) {
		return nil, nodeNotFound()
	}
	_, n, err := s.readNode(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	if !anyNode && n.OwnerOrgID != p.OrgID {
		return nil, nodeNotFound()
	}
	return n, nil
}

// AdmitReservationList is ListReservations' first gate, before anything is read: the HTTP
// layer calls it before the query, so a caller who may not list gets the same 404 whatever
// the query says. Anyone without reservation.read (an operator too), or a node id that names
// nothing, gets the 404 of a missing node.
func AdmitReservationList(p Principal, nodeID string) error {
	if !p.Can(PermRead) || !ValidID(nodeID) {
		return nodeNotFound()
	}
	return nil
}

// AdmitReservationRead is the first gate of every read of one reservation (itself, its
// audit), before anything is read: a caller with neither reservation.read nor
// reservation.capacity, or ids that name nothing, gets the 404 of a missing reservation.
// The finer checks (owner, managing or audience org) follow once the reservation is read.
func AdmitReservationRead(p Principal, nodeID, reservationID string) error {
	if !p.Can(PermRead) && !p.Can(PermCapacity) || !ValidID(nodeID) || !ValidID(reservationID) {
		return notFound()
	}
	return nil
}

// ListReservations returns a page of the node's reservations as the caller may see them: all
// to an operator and to the node's owner; to another caller with reservation.read, those whose
// audience or managing orgs hold its org (its pages are read on until they are full). Such a
// caller who sees nothing on the node gets the 404 of a missing node, whatever its cursor
// says, so it cannot tell a node without reservations for it from no node. The next cursor
// names the last reservation on the page (one the caller may see) and is answered only when
// something the caller may see follows it.
func (s *Service) ListReservations(ctx context.Context, p Principal, nodeID string, page PageRequest) (*ReservationPage, error) {
	if err := AdmitReservationList(p, nodeID); err != nil {
		return nil, err
	}
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	ops, n, err := s.readNode(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	all := p.Operator || p.OrgID == n.OwnerOrgID
	visible := func(r Reservation) bool {
		return all || slices.Contains(r.AllowedOrgIDs, p.OrgID) || slices.Contains(r.ManagingOrgIDs, p.OrgID)
	}
	after, cerr := "", error(nil)
	if parts, err := parseCursor(page.Cursor, "reservations", 2); err != nil {
		cerr = err
	} else if parts != nil {
		if parts[0] != nodeID || !ValidID(parts[1]) {
			cerr = Errorf(CodeInvalidRequest, "invalid cursor")
		}
		after = parts[1]
	}
	if cerr == nil {
		rs, more, err := s.visibleReservations(ctx, ops, nodeID, after, limit, visible)
		if err != nil {
			return nil, err
		}
		if len(rs) > 0 || all {
			out := &ReservationPage{Reservations: rs}
			if more {
				out.NextCursor = listCursor("reservations", nodeID, rs[len(rs)-1].ID)
			}
			return out, nil
		}
	}
	// Nothing to show, or a cursor this list never hands out: whether the caller sees anything
	// on the node at all decides between the node's 404 and the cursor's answer.
	if !all {
		first, _, err := s.visibleReservations(ctx, ops, nodeID, "", 1, visible)
		if err != nil {
			return nil, err
		}
		if len(first) == 0 {
			return nil, nodeNotFound()
		}
	}
	if cerr != nil {
		return nil, cerr
	}
	return &ReservationPage{Reservations: []Reservation{}}, nil
}

// visibleReservations reads the node's reservations after afterID in id order and keeps the
// visible ones, until it has limit of them and knows whether another visible one follows
// (more), or the node has no more.
func (s *Service) visibleReservations(ctx context.Context, ops OperatorStore, nodeID, afterID string, limit int,
	visible func(Reservation) bool) ([]Reservation, bool, error) {
	out := []Reservation{}
	now := s.now()
	for {
		rs, more, err := ops.ListReservations(ctx, nodeID, limit+1, afterID)
		if err != nil {
			if e := (*Error)(nil); errors.As(err, &e) {
				return nil, false, err
			}
			return nil, false, fmt.Errorf("list reservations of node %s: %w", nodeID, err)
		}
		for _, r := range rs {
			if !visible(r) {
				continue
			}
			if len(out) == limit {
				return out, true, nil
			}
			r.Status = r.StatusAt(now)
			out = append(out, r)
		}
		if !more || len(rs) == 0 {
			return out, false, nil
		}
		afterID = rs[len(rs)-1].ID
	}
}

// CreateReservation creates a reservation on a node's units (see DecideCreateReservation).
func (s *Service) CreateReservation(ctx context.Context, p Principal, req ReservationRequest, meta RequestMeta) (*ReservationResult, error) {
	if !p.CanOperate(PermReservationManage) || !ValidID(req.NodeID) {
		return nil, nodeNotFound()
	}
	id := req.ID
	if id == "" {
		id = "res-" + s.newID() // once per call: every round creates the same reservation
	}
	fp := req
	fp.ReservedUnitIDs, fp.AllowedOrgIDs, fp.ManagingOrgIDs = sortedSet(req.ReservedUnitIDs), sortedSet(req.AllowedOrgIDs), sortedSet(req.ManagingOrgIDs)
	fp.StartsAt = req.StartsAt.UTC()
	if req.EndsAt != nil {
		fp.EndsAt = ptrTo(req.EndsAt.UTC())
	}
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionReservationCreate, fp))
	return runOp(s, ctx, opCall[ReservationResult]{
		rec:     s.opAudit(p, meta, ActionReservationCreate, req.NodeID, id, req.ReservedUnitIDs, req.Reason),
		invalid: cmp.Or(req.Validate(s.now()), kerr),
		key:     key,
		missing: nodeNotFound,
		decide: func(st *NodeState, _ *AuditRecord, now time.Time) (*OperatorCommit, *ReservationResult, error) {
			return DecideCreateReservation(st, req, id, now)
		},
	})
}

func ptrTo[T any](v T) *T { return &v }

// termsOverlap reports whether [a.StartsAt, a.EndsAt) and [b.StartsAt, b.EndsAt) meet.
func termsOverlap(a, b Reservation) bool {
	return (b.EndsAt == nil || a.StartsAt.Before(*b.EndsAt)) && (a.EndsAt == nil || b.StartsAt.Before(*a.EndsAt))
}

// claims reports whether a reservation still claims its units for its term: active,
// pending or needs-review, and not ended at now.
func claims(r Reservation, now time.Time) bool {
	switch r.StatusAt(now) {
	case StatusActive, StatusPending, StatusNeedsReview:
		return true
	}
	return false
}

// DecideCreateReservation decides the creation of reservation id on the state read: units on
// the node (unknown_units), not claimed by another reservation whose term overlaps
// (reservation_overlap), not carrying a reserved or on-demand VM (units_in_use); units under
// a spot VM start released, so a reclaim evicts it.
func DecideCreateReservation(st *NodeState, req ReservationRequest, id string, now time.Time) (*OperatorCommit, *ReservationResult, error) {
	if st.Reservation(id) != nil {
		return nil, nil, Errorf(CodeReservationExists, "reservation %s exists on this node", id)
	}
	if unknown := notIn(req.ReservedUnitIDs, st.Node.UnitIDs); len(unknown) > 0 {
		return nil, nil, &Error{Code: CodeUnknownUnits, Message: "units do not exist on this node", UnitIDs: unknown}
	}
	status := req.Status
	if status == "" {
		status = StatusActive
	}
	r := Reservation{
		ID: id, NodeID: st.Node.ID, AllowedOrgIDs: nonNil(slices.Clone(req.AllowedOrgIDs)),
		ReservedUnitIDs: slices.Clone(req.ReservedUnitIDs), ManagingOrgIDs: nonNil(slices.Clone(req.ManagingOrgIDs)),
		StartsAt: req.StartsAt.UTC(), Status: status, ContractRef: req.ContractRef, CreatedAt: now, UpdatedAt: now,
		Reason: req.Reason, TopologyGen: st.Node.TopologyGen, Version: 1, ReleasedUnitIDs: []string{},
	}
	if req.EndsAt != nil {
		r.EndsAt = ptrTo(req.EndsAt.UTC())
	}
	var overlap []string
	for _, o := range st.Reservations {
		if !claims(o, now) || !termsOverlap(r, o) {
			continue
		}
		for _, u := range r.ReservedUnitIDs {
			if slices.Contains(o.ReservedUnitIDs, u) && !slices.Contains(overlap, u) {
				overlap = append(overlap, u)
			}
		}
	}
	if len(overlap) > 0 {
		slices.Sort(overlap)
		return nil, nil, &Error{Code: CodeReservationOverlap, Message: "units are held by another reservation whose term overlaps", UnitIDs: overlap}
	}
	var inUse []string
	for _, vm := range st.VMs {
		if !vm.occupies() {
			continue
		}
		for _, u := range vm.UnitIDs {
			if !slices.Contains(r.ReservedUnitIDs, u) {
				continue
			}
			if vm.Tier == TierSpot {
				if !slices.Contains(r.ReleasedUnitIDs, u) {
					r.ReleasedUnitIDs = append(r.ReleasedUnitIDs, u)
				}
			} else {
				inUse = append(inUse, u)
			}
		}
	}
	if len(inUse) > 0 {
		slices.Sort(inUse)
		return nil, nil, &Error{Code: CodeUnitsInUse, Message: "units carry reserved or on-demand VMs", UnitIDs: inUse}
	}
	slices.Sort(r.ReleasedUnitIDs)
	return &OperatorCommit{Node: st.Node, BumpNode: true, NewReservation: &r}, &ReservationResult{Reservation: r}, nil
}

// CancelReservation cancels a reservation: its units stop being withheld and the VMs on them
// keep running (listed in the answer). A cancelled one answers as it is; an expired one is
// invalid_transition. Its pending scheduled reclaims are then cancelled (cancelScheduledOf),
// after every answer that says cancelled: a repeat finishes what an earlier sweep left.
func (s *Service) CancelReservation(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta) (*ReservationResult, error) {
	res, err := s.changeReservation(ctx, p, req, meta, ActionReservationCancel, DecideCancel)
	if err == nil && res.Reservation.Status == StatusCancelled {
		s.cancelScheduledOf(ctx, p, req, meta)
	}
	return res, err
}

// ReaffirmReservation moves a needs-review reservation back to active at the node's current
// topology generation.
func (s *Service) ReaffirmReservation(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta) (*ReservationResult, error) {
	return s.changeReservation(ctx, p, req, meta, ActionReservationReaffirm, DecideReaffirm)
}

func (s *Service) changeReservation(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta, action string,
	decide func(st *NodeState, req ReservationChange, now time.Time) (*OperatorCommit, *ReservationResult, error)) (*ReservationResult, error) {
	if !p.CanOperate(PermReservationManage) || !ValidID(req.NodeID) || !ValidID(req.ReservationID) {
		return nil, notFound()
	}
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(action, req))
	return runOp(s, ctx, opCall[ReservationResult]{
		rec:     s.opAudit(p, meta, action, req.NodeID, req.ReservationID, nil, req.Reason),
		invalid: cmp.Or(req.Validate(), kerr),
		key:     key,
		missing: notFound,
		decide: func(st *NodeState, audit *AuditRecord, now time.Time) (*OperatorCommit, *ReservationResult, error) {
			if r := st.Reservation(req.ReservationID); r != nil {
				audit.UnitIDs = slices.Clone(r.ReservedUnitIDs)
				audit.ReleasedBefore = nonNil(slices.Clone(r.ReleasedUnitIDs))
			}
			c, r, err := decide(st, req, now)
			if err == nil {
				audit.ReleasedAfter = nonNil(slices.Clone(r.Reservation.ReleasedUnitIDs))
			}
			return c, r, err
		},
	})
}

// DecideCancel decides the cancel of a reservation.
func DecideCancel(st *NodeState, req ReservationChange, now time.Time) (*OperatorCommit, *ReservationResult, error) {
	r := st.Reservation(req.ReservationID)
	if r == nil {
		return nil, nil, notFound()
	}
	res := &ReservationResult{VMsOnUnits: vmsOn(st.VMs, r.ReservedUnitIDs)}
	switch r.StatusAt(now) {
	case StatusCancelled:
		// Repeat-safe: nothing to write but the audit record, on the calls chain.
		res.Reservation = *r
		return &OperatorCommit{Node: st.Node}, res, nil
	case StatusExpired:
		return nil, nil, Errorf(CodeInvalidTransition, "reservation has expired; only a reservation that has not ended can be cancelled")
	}
	c := *r
	c.Status, c.UpdatedAt = StatusCancelled, now
	if req.Reason != "" {
		c.Reason = req.Reason
	}
	res.Reservation = c
	res.Reservation.Version++
	return &OperatorCommit{Node: st.Node, BumpNode: true, Reservations: []Reservation{c}}, res, nil
}

// DecideReaffirm decides the re-affirmation of a needs-review reservation: active again at the
// node's topology generation, with every reserved unit still on the node (else unknown_units:
// cancel it and create another). Its released units are kept (those still on the node).
func DecideReaffirm(st *NodeState, req ReservationChange, now time.Time) (*OperatorCommit, *ReservationResult, error) {
	r := st.Reservation(req.ReservationID)
	if r == nil {
		return nil, nil, notFound()
	}
	if status := r.StatusAt(now); status != StatusNeedsReview {
		return nil, nil, Errorf(CodeInvalidTransition, "reservation is %s; only a needs-review reservation can be reaffirmed", status)
	}
	if gone := notIn(r.ReservedUnitIDs, st.Node.UnitIDs); len(gone) > 0 {
		return nil, nil, &Error{Code: CodeUnknownUnits,
			Message: "reserved units are no longer on the node; cancel the reservation and create a new one", UnitIDs: gone}
	}
	c := *r
	c.Status, c.TopologyGen, c.UpdatedAt = StatusActive, st.Node.TopologyGen, now
	c.Reason = req.Reason
	if c.Reason == "" {
		c.Reason = fmt.Sprintf("reaffirmed at topology gen %d", st.Node.TopologyGen)
	}
	released := []string{}
	for _, u := range r.ReleasedUnitIDs {
		if slices.Contains(st.Node.UnitIDs, u) {
			released = append(released, u)
		}
	}
	c.ReleasedUnitIDs = released
	out := c
	out.Version++
	return &OperatorCommit{Node: st.Node, BumpNode: true, Reservations: []Reservation{c}}, &ReservationResult{Reservation: out}, nil
}

// notIn returns the ids that are not in set, in their order (nil when there are none).
func notIn(ids, set []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(set, id) {
			out = append(out, id)
		}
	}
	return out
}

// vmsOn returns the live VMs standing on any of the units, by id.
func vmsOn(vms []VM, units []string) []VM {
	out := []VM{}
	for _, vm := range vms {
		if vm.occupies() && overlaps(vm.UnitIDs, units) {
			out = append(out, vm)
		}
	}
	sortVMs(out)
	return out
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
