package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ActionScheduleReclaim and ActionCancelScheduledReclaim are the audit actions of scheduling
// a reclaim and of cancelling one.
const (
	ActionScheduleReclaim        = "schedule-reclaim"
	ActionCancelScheduledReclaim = "cancel-scheduled-reclaim"
)

// MaxScheduleAhead bounds how far ahead a reclaim may be scheduled.
const MaxScheduleAhead = 365 * 24 * time.Hour

// DefaultMaxPendingScheduled is an org's cap on pending scheduled reclaims when the
// environment sets none (Service.MaxPendingScheduled).
const DefaultMaxPendingScheduled = 100

// FiringSkew is how long before its at a scheduled reclaim's firing is still accepted.
// Scheduler fires on time or late, never early: only the clocks of Scheduler and of the
// firing function may differ, by far less. An earlier firing did not come from the schedule.
const FiringSkew = 30 * time.Second

// ScheduledState is the state of a scheduled reclaim.
type ScheduledState string

const (
	ScheduledPending   ScheduledState = "scheduled"
	ScheduledCancelled ScheduledState = "cancelled"
	ScheduledCompleted ScheduledState = "completed"
	ScheduledRefused   ScheduledState = "refused"
)

// ScheduledReclaim is a reclaim to run at a later time, as its creator, by a one-time
// schedule that puts the request into the inbound event path: every check runs again then.
type ScheduledReclaim struct {
	ID            string
	NodeID        string
	ReservationID string
	UnitIDs       []string
	Reason        string
	GraceSeconds  int
	At            time.Time
	State         ScheduledState
	// The creator, as whom the reclaim runs when it fires.
	CreatorKeyID    string
	CreatorOrgID    string
	CreatorOperator bool
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// Outcome: ReclaimID (completed; empty when the reclaim evicted nothing), Code and Detail
	// (refused; or cancelled by its reservation's cancel: CodeReservationNotActive and why),
	// FiredAt (completed or refused), CancelledAt (cancelled).
	ReclaimID   string
	Code        Code
	Detail      string
	FiredAt     *time.Time
	CancelledAt *time.Time
	Version     int64
	// CountedOrgID is the org whose count of pending scheduled reclaims holds this one while
	// it is pending (its creator's), and which its end (firing, refusal or cancel) decrements
	// in the same write. Empty for those written before the count existed: never counted,
	// so their end decrements nothing.
	CountedOrgID string
}

// creator is the principal the scheduled reclaim runs as: it held reservation.capacity when
// it scheduled the reclaim.
func (sr ScheduledReclaim) creator() Principal {
	return Principal{KeyID: sr.CreatorKeyID, OrgID: sr.CreatorOrgID, Permissions: []string{PermCapacity}, Operator: sr.CreatorOperator}
}

// request is the reclaim the scheduled reclaim runs.
func (sr ScheduledReclaim) request() CapacityRequest {
	return CapacityRequest{
		NodeID: sr.NodeID, ReservationID: sr.ReservationID, UnitIDs: slices.Clone(sr.UnitIDs),
		Reason: sr.Reason, GraceSeconds: sr.GraceSeconds, IdempotencyKey: FireIdempotencyKey(sr.ID),
	}
}

// FireIdempotencyKey is the Idempotency-Key a scheduled reclaim's firing runs under, so that
// a schedule delivered twice reclaims once and answers the same.
func FireIdempotencyKey(id string) string { return "scheduled:" + id }

// KeyReader reads API keys by id: the firing of a scheduled reclaim reads its creator's key
// through it. Implementations: shared/dynamo.Store (KeyByID: GetItem only).
type KeyReader interface {
	// KeyByID returns the key (strongly consistent), or an *Error CodeNotFound.
	KeyByID(ctx context.Context, keyID string) (*APIKey, error)
}

// Scheduler creates and deletes the one-time schedules that fire scheduled reclaims.
// Implementations: shared/scheduler (EventBridge Scheduler).
type Scheduler interface {
	// Create creates the schedule of sr (named by sr.ID) to fire at sr.At. Creating one that
	// exists already (a retry after a lost answer) succeeds.
	Create(ctx context.Context, sr ScheduledReclaim) error
	// Delete deletes the schedule of sr; deleting one that does not exist succeeds.
	Delete(ctx context.Context, sr ScheduledReclaim) error
}

// ScheduleStore keeps scheduled reclaims. Implementations: shared/dynamo.
type ScheduleStore interface {
	// CreateScheduled writes a new scheduled reclaim, its Idempotency-Key record (if any)
	// and its audit record in one transaction, conditioned on the reservation's version as
	// read, and counts it in its CountedOrgID's pending scheduled reclaims, conditioned on
	// that count being below c.MaxPending (else an *Error CodeScheduledReclaimLimit).
	// ErrConflict when the reservation changed or the item exists; ErrAmbiguous when
	// the outcome is unknown (Store.Landed tells by the audit record). UpdateScheduled and a
	// Commit that fires one take a scheduled reclaim that leaves the pending state off its
	// org's count in the same transaction.
	CreateScheduled(ctx context.Context, c ScheduleCommit) error
	// GetScheduled returns a scheduled reclaim, or an *Error with CodeNotFound.
	GetScheduled(ctx context.Context, nodeID, id string) (*ScheduledReclaim, error)
	// UpdateScheduled replaces a scheduled reclaim read at from.Version in from.State with
	// to (written at from.Version+1), with its audit record if any, in one transaction;
	// ErrConflict if the item changed since read.
	UpdateScheduled(ctx context.Context, from, to ScheduledReclaim, audit *AuditRecord) error
	// ListScheduled returns a page of a reservation's scheduled reclaims in order of at, and
	// the cursor of the next ("" when none); a bad cursor is an *Error CodeInvalidRequest.
	ListScheduled(ctx context.Context, nodeID, reservationID string, limit int, cursor string) ([]ScheduledReclaim, string, error)
}

// ScheduledPage is a page of a reservation's scheduled reclaims.
type ScheduledPage struct {
	Scheduled  []ScheduledReclaim
	NextCursor string
}

// ScheduleCommit is the write of a new scheduled reclaim.
type ScheduleCommit struct {
	Scheduled   ScheduledReclaim
	Reservation Reservation // as read: the write conditions on its version
	Idempotency *IdempotencyRecord
	Audit       AuditRecord
	// MaxPending caps the pending scheduled reclaims of Scheduled.CountedOrgID, this one
	// included.
	MaxPending int
}

// ScheduleResult is the answer of ScheduleReclaim.
type ScheduleResult struct {
	Scheduled ScheduledReclaim `json:"scheduled"`
	Replayed  bool             `json:"-"`
}

// scheduling checks that scheduled reclaims can be created and cancelled: that needs the
// scheduler and the store.
func (s *Service) scheduling() error {
	if s.Scheduler == nil {
		return Errorf(CodeSchedulingUnavailable, "scheduled reclaims are not available in this deployment")
	}
	return s.scheduledReads()
}

// scheduledReads checks that scheduled reclaims can be read and fired: that needs only the
// store (the firing function has no scheduler).
func (s *Service) scheduledReads() error {
	if s.Schedules == nil {
		return Errorf(CodeSchedulingUnavailable, "scheduled reclaims are not available in this deployment")
	}
	return nil
}

// ScheduleReclaim schedules a reclaim of req's units at at. It runs every check a dry run of
// the same request runs now, and at must be in the future, at most MaxScheduleAhead ahead and
// inside the reservation's term. The schedule is created before the scheduled reclaim is
// written (scheduledCreates).
func (s *Service) ScheduleReclaim(ctx context.Context, p Principal, req CapacityRequest, at time.Time, meta RequestMeta) (*ScheduleResult, error) {
	if err := req.admitFor(p, ActionReclaim); err != nil {
		return nil, err
	}
	if req.DryRun {
		return nil, Errorf(CodeInvalidRequest, "a dry run is answered with today's plan, not scheduled")
	}
	if err := s.scheduling(); err != nil {
		return nil, err
	}
	at = at.UTC().Truncate(time.Second) // the schedule's resolution
	key, err := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionScheduleReclaim, struct {
		Request CapacityRequest
		At      time.Time
	}{sortedUnits(req), at}))
	if err != nil {
		return nil, err
	}
	var replayed *ScheduleResult
	var refused AuditRecord // the audit record of the last round's write, for a refusal of it
	landed, err := commitRounds(s, ctx, s.scheduledCreates(req.NodeID, key.scope), func(st *NodeState, now time.Time, pending *scheduleWrite) (*scheduleWrite, error) {
		audit := s.auditRecord(p, st, req, meta, ActionScheduleReclaim, now)
		r, err := authorizeCapacityCall(p, st, req.ReservationID)
		if err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		var res ScheduleResult
		if ok, err := replay(st.Idempotency, key.fingerprint, now, &res); ok || err != nil {
			if ok {
				res.Replayed = true
				replayed = &res
				s.append(ctx, *replayAudit(audit))
			}
			return nil, err
		}
		dry := req
		dry.DryRun = true
		if _, err := DecideReclaim(p, st, dry, now); err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		if err := checkAt(p, *r, at, now); err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		if pending != nil {
			// Another scheduled reclaim could land beside the pending one: it goes again,
			// the same, and at most one of the two lands.
			refused = pending.Audit
			return pending, nil
		}
		sr := ScheduledReclaim{
			ID: "srcl_" + s.newID(), NodeID: req.NodeID, ReservationID: req.ReservationID,
			UnitIDs: slices.Sorted(slices.Values(req.UnitIDs)), Reason: req.Reason, GraceSeconds: req.GraceSeconds,
			At: at, State: ScheduledPending, CreatorKeyID: p.KeyID, CreatorOrgID: p.OrgID, CreatorOperator: p.Operator,
			CreatedAt: now, UpdatedAt: now, CountedOrgID: p.OrgID,
		}
		audit.Outcome, audit.ReclaimID = "ok", sr.ID
		idem, err := s.idempotencyRecord(key, req.NodeID, ScheduleResult{Scheduled: sr}, now)
		if err != nil {
			return nil, err
		}
		refused = audit
		return &scheduleWrite{node: st.Node, ScheduleCommit: ScheduleCommit{Scheduled: sr, Reservation: *r, Idempotency: idem, Audit: audit,
			MaxPending: s.maxPendingScheduled()}}, nil
	})
	switch {
	case errors.Is(err, errNodeNotFound):
		return nil, notFound()
	case ErrorCode(err) == CodeScheduledReclaimLimit:
		s.auditRefusal(ctx, refused, err)
		return nil, err
	case err != nil:
		return nil, err
	case landed != nil:
		return &ScheduleResult{Scheduled: landed.Scheduled}, nil
	}
	return replayed, nil
}

// scheduleWrite is one round's write of a new scheduled reclaim: its schedule, then the
// scheduled reclaim (ScheduleCommit) on the node as the round read it.
type scheduleWrite struct {
	ScheduleCommit
	node      Node
	scheduled bool // its schedule was created
}

// scheduledCreates writes new scheduled reclaims: the schedule is created first and the
// scheduled reclaim written after, so a scheduled reclaim never lacks its schedule; a write
// refused deletes the schedule it created. One whose outcome stays unknown keeps it: if the
// write landed it is needed, and if not its firing finds no scheduled reclaim and is refused.
func (s *Service) scheduledCreates(nodeID, scope string) writer[NodeState, scheduleWrite] {
	return writer[NodeState, scheduleWrite]{
		kind: "scheduled reclaim", subject: "the reservation", logAttrs: []any{"node", nodeID},
		read: nodeRead(s.Store.LoadNode, nodeID, scope),
		commit: func(ctx context.Context, c *scheduleWrite) error {
			if err := s.Scheduler.Create(ctx, c.Scheduled); err != nil {
				return fmt.Errorf("create schedule of %s: %w", c.Scheduled.ID, err)
			}
			c.scheduled = true
			return s.Schedules.CreateScheduled(ctx, c.ScheduleCommit)
		},
		audit:  func(c *scheduleWrite) AuditRecord { return c.Audit },
		landed: func(ctx context.Context, c *scheduleWrite) (bool, error) { return s.landedOn(ctx, c.node, c.Audit) },
		dropped: func(ctx context.Context, c *scheduleWrite) {
			if !c.scheduled {
				return
			}
			if err := s.Scheduler.Delete(ctx, c.Scheduled); err != nil {
				s.logger().WarnContext(ctx, "schedule of an unwritten scheduled reclaim not deleted; its firing will be refused",
					"scheduled_reclaim_id", c.Scheduled.ID, "node", nodeID, "err", err)
			}
		},
	}
}

// landedOn reads whether a write that chains audit on node's changes chain, decided on node as
// read, landed: its audit record tells (Store.Landed).
func (s *Service) landedOn(ctx context.Context, node Node, audit AuditRecord) (bool, error) {
	return s.Store.Landed(ctx, Commit{Node: node, Audit: audit})
}

func (s *Service) maxPendingScheduled() int {
	if s.MaxPendingScheduled > 0 {
		return s.MaxPendingScheduled
	}
	return DefaultMaxPendingScheduled
}

// checkAt checks a scheduled reclaim's time against now, the reservation's term and the
// expiry of the key that schedules it: the reclaim runs as that key, so not after it ends.
func checkAt(p Principal, r Reservation, at, now time.Time) error {
	switch {
	case !at.After(now):
		return Errorf(CodeInvalidRequest, "at must be in the future")
	case at.After(now.Add(MaxScheduleAhead)):
		return Errorf(CodeInvalidRequest, "at must be at most 365 days ahead")
	case !r.InTerm(at):
		return Errorf(CodeInvalidRequest, "at must be inside the reservation's term")
	case p.ExpiresAt != nil && !at.Before(*p.ExpiresAt):
		return Errorf(CodeInvalidRequest, "at must be before this API key's expiresAt (%s): the reclaim runs as the key", p.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return nil
}

func sortedUnits(req CapacityRequest) CapacityRequest {
	req.UnitIDs = slices.Sorted(slices.Values(req.UnitIDs))
	return req
}
