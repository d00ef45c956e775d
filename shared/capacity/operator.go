package capacity

import (
	"context"
	"errors"
	"fmt"
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
	// OrgReservations gives, for each org NewReservation names, the ids in order of every
	// reservation of the node as read that names it, NewReservation's too: the reservations
	// the org's list reads (NodeDirectory.NamedOn). The node's Version, bumped, makes it
	// complete: a creation meanwhile fails the commit.
	OrgReservations map[string][]string
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
