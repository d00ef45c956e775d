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
// inside the reservation's term. The schedule is created first and the scheduled reclaim
// written after, so a scheduled reclaim never lacks its schedule; a write that loses a race
// deletes the schedule it created and decides again.
func (s *Service) ScheduleReclaim(ctx context.Context, p Principal, req CapacityRequest, at time.Time, meta RequestMeta) (*ScheduleResult, error) {
	if err := AdmitCapacityCall(p, req.NodeID, req.ReservationID); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := req.validateFor(ActionReclaim); err != nil {
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
	for range s.attempts() {
		now := s.now()
		st, err := s.Store.LoadNode(ctx, req.NodeID, key.scope)
		if ErrorCode(err) == CodeNotFound {
			return nil, notFound()
		}
		if err != nil {
			return nil, fmt.Errorf("load node %s: %w", req.NodeID, err)
		}
		audit := s.auditRecord(p, st, req, meta, ActionScheduleReclaim, now)
		r, err := authorizeCapacityCall(p, st, req.ReservationID)
		if err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		var replayed ScheduleResult
		if ok, err := replay(st.Idempotency, key.fingerprint, now, &replayed); ok || err != nil {
			if ok {
				replayed.Replayed = true
				s.append(ctx, *replayAudit(audit))
			}
			return &replayed, err
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
		sr := ScheduledReclaim{
			ID: "srcl_" + s.newID(), NodeID: req.NodeID, ReservationID: req.ReservationID,
			UnitIDs: slices.Sorted(slices.Values(req.UnitIDs)), Reason: req.Reason, GraceSeconds: req.GraceSeconds,
			At: at, State: ScheduledPending, CreatorKeyID: p.KeyID, CreatorOrgID: p.OrgID, CreatorOperator: p.Operator,
			CreatedAt: now, UpdatedAt: now, CountedOrgID: p.OrgID,
		}
		audit.Outcome, audit.ReclaimID = "ok", sr.ID
		result := ScheduleResult{Scheduled: sr}
		idem, err := s.idempotencyRecord(key, req.NodeID, result, now)
		if err != nil {
			return nil, err
		}
		if err := s.Scheduler.Create(ctx, sr); err != nil {
			return nil, fmt.Errorf("create schedule of %s: %w", sr.ID, err)
		}
		err = s.Schedules.CreateScheduled(ctx, ScheduleCommit{Scheduled: sr, Reservation: *r, Idempotency: idem, Audit: audit,
			MaxPending: s.maxPendingScheduled()})
		if errors.Is(err, ErrAmbiguous) {
			landed, lerr := s.Store.Landed(ctx, Commit{Node: st.Node, Audit: audit})
			if lerr != nil {
				// The schedule stays: if the write landed it is needed; if not, its firing
				// finds no scheduled reclaim and is refused.
				return nil, fmt.Errorf("schedule reclaim %s: outcome unknown (%v): %w", sr.ID, err, lerr)
			}
			if landed {
				err = nil
			}
		}
		if err == nil {
			return &result, nil
		}
		if derr := s.Scheduler.Delete(ctx, sr); derr != nil {
			s.logger().WarnContext(ctx, "schedule of an unwritten scheduled reclaim not deleted; its firing will be refused",
				"scheduled_reclaim_id", sr.ID, "node", req.NodeID, "err", derr)
		}
		if ErrorCode(err) == CodeScheduledReclaimLimit {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		if errors.Is(err, ErrConflict) {
			s.logger().InfoContext(ctx, "scheduled reclaim write lost a race; deciding again", "node", req.NodeID)
			continue
		}
		return nil, fmt.Errorf("write scheduled reclaim %s: %w", sr.ID, err)
	}
	return nil, Errorf(CodeConcurrentModification, "the reservation kept changing while this call was applied; retrying is safe")
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

// GetScheduledReclaim returns a scheduled reclaim to a caller who may reclaim on its
// reservation, or to an operator; anyone else gets the reservation's 404.
func (s *Service) GetScheduledReclaim(ctx context.Context, p Principal, nodeID, reservationID, id string) (*ScheduledReclaim, error) {
	if err := s.mayReadScheduled(ctx, p, nodeID, reservationID); err != nil {
		return nil, err
	}
	return s.scheduled(ctx, nodeID, reservationID, id)
}

// ListScheduledReclaims returns a page of a reservation's scheduled reclaims, in every state
// (fired and cancelled ones until their retention ends), in order of at, to those who may
// read one of them; anyone else gets the reservation's 404.
func (s *Service) ListScheduledReclaims(ctx context.Context, p Principal, nodeID, reservationID string, page PageRequest) (*ScheduledPage, error) {
	if err := s.mayReadScheduled(ctx, p, nodeID, reservationID); err != nil {
		return nil, err
	}
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	if err := s.scheduledReads(); err != nil {
		return nil, err
	}
	list, next, err := s.Schedules.ListScheduled(ctx, nodeID, reservationID, limit, page.Cursor)
	if ErrorCode(err) == CodeInvalidRequest {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("list scheduled reclaims of reservation %s: %w", reservationID, err)
	}
	if list == nil {
		list = []ScheduledReclaim{}
	}
	return &ScheduledPage{Scheduled: list, NextCursor: next}, nil
}

// AdmitScheduledRead is the first gate of reading a reservation's scheduled reclaims, before
// anything of the request is read: a key that may reclaim, or an operator key that may read
// (anyone else: the reservation's 404). The service checks the reservation after it.
func AdmitScheduledRead(p Principal, nodeID, reservationID string) error {
	if !ValidID(nodeID) || !ValidID(reservationID) || !(p.Can(PermCapacity) || p.Operator && p.Can(PermRead)) {
		return notFound()
	}
	return nil
}

// mayReadScheduled admits a caller who may reclaim on the reservation, or an operator who
// may read it; anyone else gets the reservation's 404.
func (s *Service) mayReadScheduled(ctx context.Context, p Principal, nodeID, reservationID string) error {
	if err := AdmitScheduledRead(p, nodeID, reservationID); err != nil {
		return err
	}
	st, err := s.Store.LoadNode(ctx, nodeID, "")
	if ErrorCode(err) == CodeNotFound {
		return notFound()
	}
	if err != nil {
		return fmt.Errorf("load node %s: %w", nodeID, err)
	}
	r := st.Reservation(reservationID)
	if r == nil || AccessOf(p, st.Node, *r) != AccessManage {
		return notFound()
	}
	return nil
}

// scheduled reads a scheduled reclaim of the reservation.
func (s *Service) scheduled(ctx context.Context, nodeID, reservationID, id string) (*ScheduledReclaim, error) {
	if !ValidID(id) { // names nothing, in any deployment
		return nil, scheduledNotFound()
	}
	if err := s.scheduledReads(); err != nil {
		return nil, err
	}
	sr, err := s.Schedules.GetScheduled(ctx, nodeID, id)
	if ErrorCode(err) == CodeNotFound || err == nil && sr.ReservationID != reservationID {
		return nil, scheduledNotFound()
	}
	if err != nil {
		return nil, fmt.Errorf("read scheduled reclaim %s: %w", id, err)
	}
	return sr, nil
}

func scheduledNotFound() *Error { return Errorf(CodeNotFound, "scheduled reclaim not found") }

// CancelScheduledReclaim cancels a scheduled reclaim that has not fired, then deletes its
// schedule. Cancelling a cancelled one answers it again; one that has fired is refused
// (CodeScheduledReclaimFired). Callers are those who may reclaim on the reservation.
func (s *Service) CancelScheduledReclaim(ctx context.Context, p Principal, nodeID, reservationID, id string, meta RequestMeta) (*ScheduledReclaim, error) {
	if err := AdmitCapacityCall(p, nodeID, reservationID); err != nil {
		return nil, err
	}
	if !ValidID(id) { // names nothing, in any deployment: a 404, not scheduling_unavailable
		return nil, scheduledNotFound()
	}
	if err := s.scheduling(); err != nil {
		return nil, err
	}
	wrote := false // a round sent the cancel
	for range s.attempts() {
		now := s.now()
		st, err := s.Store.LoadNode(ctx, nodeID, "")
		if ErrorCode(err) == CodeNotFound {
			return nil, notFound()
		}
		if err != nil {
			return nil, fmt.Errorf("load node %s: %w", nodeID, err)
		}
		audit := s.auditRecord(p, st, CapacityRequest{NodeID: nodeID, ReservationID: reservationID}, meta, ActionCancelScheduledReclaim, now)
		if _, err := authorizeCapacityCall(p, st, reservationID); err != nil {
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		sr, err := s.scheduled(ctx, nodeID, reservationID, id)
		if err != nil {
			return nil, err
		}
		audit.ReclaimID, audit.UnitIDs = sr.ID, sr.UnitIDs
		switch sr.State {
		case ScheduledCancelled:
			if wrote {
				// Perhaps by this call's own write whose answer was lost: its schedule too.
				s.deleteSchedule(ctx, *sr)
			}
			return sr, nil
		case ScheduledCompleted, ScheduledRefused:
			err := Errorf(CodeScheduledReclaimFired, "scheduled reclaim %s has fired (%s); it can no longer be cancelled", sr.ID, sr.State)
			s.auditRefusal(ctx, audit, err)
			return nil, err
		}
		next := *sr
		next.State, next.CancelledAt, next.UpdatedAt = ScheduledCancelled, &now, now
		audit.Outcome = "ok"
		err = s.Schedules.UpdateScheduled(ctx, *sr, next, &audit)
		wrote = true
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrAmbiguous) {
			continue // fired or cancelled meanwhile, or perhaps by this write: read again
		}
		if err != nil {
			return nil, fmt.Errorf("cancel scheduled reclaim %s: %w", sr.ID, err)
		}
		next.Version++
		s.deleteSchedule(ctx, next)
		return &next, nil
	}
	return nil, Errorf(CodeConcurrentModification, "the scheduled reclaim kept changing while this call was applied; retrying is safe")
}

// cancelScheduledOf cancels the pending scheduled reclaims of a cancelled reservation, each
// in a transaction of its own (a reservation may have more than one transaction can hold)
// that moves it to cancelled, conditioned on its state and version as read, takes it off its
// org's pending count and puts its audit record on the node's changes chain; then its
// schedule is deleted. Were they left, each would hold its org's slot until it fired, only to
// be refused. Failures are logged, not returned: the cancel has landed, a repeat of it sweeps
// again, and one the sweep misses (the list is an index, a moment stale) is refused, and
// taken off the count, when it fires.
func (s *Service) cancelScheduledOf(ctx context.Context, p Principal, req ReservationChange, meta RequestMeta) {
	if s.Schedules == nil {
		return // no scheduled reclaims in this deployment
	}
	reason := "reservation " + req.ReservationID + " was cancelled"
	if req.Reason != "" {
		reason += ": " + req.Reason
	}
	var st *NodeState // read once, for the records, when there is one to cancel
	cursor := ""
	for {
		list, next, err := s.Schedules.ListScheduled(ctx, req.NodeID, req.ReservationID, MaxPageLimit, cursor)
		if err != nil {
			s.logger().WarnContext(ctx, "scheduled reclaims of a cancelled reservation not listed; they are refused when they fire",
				"node", req.NodeID, "reservation", req.ReservationID, "err", err)
			return
		}
		for _, sr := range list {
			if sr.State != ScheduledPending {
				continue
			}
			if st == nil {
				if st, err = s.Store.LoadNode(ctx, req.NodeID, ""); err != nil {
					st = &NodeState{Node: Node{ID: req.NodeID}} // the records still say who and what
				}
			}
			rec := s.roundAudit(s.opAudit(p, meta, ActionCancelScheduledReclaim, req.NodeID, req.ReservationID, sr.UnitIDs, reason), st, s.now())
			if err := s.cancelPending(ctx, sr, reason, rec); err != nil {
				s.logger().WarnContext(ctx, "scheduled reclaim of a cancelled reservation not cancelled; it is refused when it fires",
					"scheduled_reclaim_id", sr.ID, "node", req.NodeID, "reservation", req.ReservationID, "err", err)
			}
		}
		if next == "" {
			return
		}
		cursor = next
	}
}

// cancelPending moves one scheduled reclaim, listed as pending, to cancelled with the reason,
// and deletes its schedule. Each round reads it (consistently) and conditions the write on
// that read; a lost race or an unknown outcome is read again, so the write lands at most once
// and the org's count moves once. One found cancelled (perhaps by an earlier round) has its
// schedule deleted again, which is safe; one that fired or was refused is left as it is.
func (s *Service) cancelPending(ctx context.Context, listed ScheduledReclaim, reason string, audit AuditRecord) error {
	for range s.attempts() {
		sr, err := s.Schedules.GetScheduled(ctx, listed.NodeID, listed.ID)
		if err != nil {
			return fmt.Errorf("read scheduled reclaim %s: %w", listed.ID, err)
		}
		switch sr.State {
		case ScheduledCancelled:
			s.deleteSchedule(ctx, *sr)
			return nil
		case ScheduledCompleted, ScheduledRefused:
			return nil
		}
		now := s.now()
		next := *sr
		next.State, next.CancelledAt, next.UpdatedAt = ScheduledCancelled, &now, now
		next.Code, next.Detail = CodeReservationNotActive, reason
		audit.ID, audit.Time, audit.ReclaimID, audit.Outcome = s.newID(), now, sr.ID, "ok"
		err = s.Schedules.UpdateScheduled(ctx, *sr, next, &audit)
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrAmbiguous) || errors.Is(err, ErrThrottled) {
			continue // fired or cancelled meanwhile, or perhaps by this write: read again
		}
		if err != nil {
			return fmt.Errorf("cancel scheduled reclaim %s: %w", sr.ID, err)
		}
		next.Version++
		s.deleteSchedule(ctx, next)
		return nil
	}
	return fmt.Errorf("scheduled reclaim %s kept changing: %w", listed.ID, ErrConflict)
}

// deleteSchedule deletes a cancelled scheduled reclaim's schedule. The cancel is what counts:
// a schedule left behind fires into a refusal.
func (s *Service) deleteSchedule(ctx context.Context, sr ScheduledReclaim) {
	if s.Scheduler == nil {
		return
	}
	if err := s.Scheduler.Delete(ctx, sr); err != nil {
		s.logger().WarnContext(ctx, "schedule of a cancelled reclaim not deleted; its firing will be refused",
			"scheduled_reclaim_id", sr.ID, "node", sr.NodeID, "err", err)
	}
}

// FireScheduledReclaim runs a scheduled reclaim whose schedule fired: the reclaim as its
// creator, under the Idempotency-Key FireIdempotencyKey(id), moving the scheduled reclaim to
// completed in the reclaim's own transaction, so that a cancel cannot race it. A refusal
// moves it to refused and is returned. A cancelled one is refused with
// CodeScheduledReclaimCancelled, an unknown one with CodeNotFound; a repeated firing answers
// what the first did.
//
// Before the reclaim runs, a pending one's firing is refused and audited when it comes more
// than FiringSkew before at (CodeScheduledReclaimNotDue; the scheduled reclaim stays
// scheduled, so a forged early firing cannot cancel the real one), or when the creator's key
// is revoked, expired, gone, or no longer holds what the scheduled reclaim was created with
// (CodeCreatorKeyInvalid; it ends refused).
func (s *Service) FireScheduledReclaim(ctx context.Context, nodeID, reservationID, scheduledID string, meta RequestMeta) (*CapacityResult, error) {
	res, err := s.fireScheduled(ctx, nodeID, reservationID, scheduledID, meta)
	if ErrorCode(err) == CodeScheduledReclaimFired {
		// A copy of this firing (Scheduler and SQS deliver at least once) ended the scheduled
		// reclaim between this one's read of the node and its decision. Its answer is stored
		// under the same Idempotency-Key, or its refusal on the scheduled reclaim: one more
		// call answers with it, as a repeat after it does, never "has fired".
		res, err = s.fireScheduled(ctx, nodeID, reservationID, scheduledID, meta)
	}
	s.recordCapacity(ctx, ActionReclaim, meta, res, err)
	return res, err
}

// fireScheduled is one attempt of FireScheduledReclaim.
func (s *Service) fireScheduled(ctx context.Context, nodeID, reservationID, scheduledID string, meta RequestMeta) (*CapacityResult, error) {
	if !ValidID(nodeID) || !ValidID(reservationID) {
		return nil, scheduledNotFound()
	}
	sr, err := s.scheduled(ctx, nodeID, reservationID, scheduledID)
	if err != nil {
		return nil, err
	}
	switch sr.State {
	case ScheduledCancelled:
		return nil, cancelledErr(sr)
	case ScheduledRefused:
		return nil, &Error{Code: sr.Code, Message: sr.Detail}
	}
	if meta.Via == "" {
		meta.Via = ViaSchedule
	}
	if sr.State == ScheduledPending {
		if err := s.admitFiring(ctx, *sr, meta); err != nil {
			return nil, err
		}
	}
	// Each round re-reads the scheduled reclaim: the commit conditions on its state as read.
	fire := func(c *Commit, res *CapacityResult, now time.Time) error {
		cur, err := s.scheduled(ctx, nodeID, reservationID, scheduledID)
		if err != nil {
			return err
		}
		switch cur.State {
		case ScheduledCancelled:
			return cancelledErr(cur)
		case ScheduledCompleted, ScheduledRefused:
			return Errorf(CodeScheduledReclaimFired, "scheduled reclaim %s has fired (%s)", cur.ID, cur.State)
		}
		done := *cur
		done.State, done.ReclaimID, done.FiredAt, done.UpdatedAt = ScheduledCompleted, res.ReclaimID, &now, now
		c.Scheduled = &done
		return nil
	}
	res, err := s.capacityCallWith(ctx, sr.creator(), sr.request(), meta, ActionReclaim, fire)
	if err != nil && sr.State == ScheduledPending {
		s.refuse(ctx, *sr, err, nil)
	}
	return res, err
}

// admitFiring refuses a pending scheduled reclaim's firing that comes too early, or whose
// creator's key could no longer make the call, and audits the refusal. A key that cannot be
// read is a transient failure (the firing is retried), never a pass.
func (s *Service) admitFiring(ctx context.Context, sr ScheduledReclaim, meta RequestMeta) error {
	now := s.now()
	if now.Before(sr.At.Add(-FiringSkew)) {
		err := Errorf(CodeScheduledReclaimNotDue, "scheduled reclaim %s is due at %s; a firing at %s is refused",
			sr.ID, sr.At.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		s.logger().WarnContext(ctx, "scheduled reclaim fired before its time", "scheduled_reclaim_id", sr.ID, "node", sr.NodeID, "at", sr.At, "event_id", meta.EventID)
		s.auditRefusal(ctx, s.firingAudit(ctx, sr, meta, now), err)
		return err
	}
	if s.CreatorKeys == nil {
		return errors.New("fire scheduled reclaim: no key reader configured (Service.CreatorKeys)")
	}
	key, err := s.CreatorKeys.KeyByID(ctx, sr.CreatorKeyID)
	if err != nil && ErrorCode(err) != CodeNotFound {
		return fmt.Errorf("read the key %s that scheduled %s: %w", sr.CreatorKeyID, sr.ID, err)
	}
	if err := creatorStillMay(sr, key, now); err != nil {
		audit := s.firingAudit(ctx, sr, meta, now)
		audit.Outcome = string(ErrorCode(err))
		s.refuse(ctx, sr, err, &audit)
		return err
	}
	return nil
}

// creatorStillMay checks that the key that scheduled sr (nil: gone) still authenticates and
// still holds what sr was created with: reservation.capacity for its org, and the operator
// flag if its creator was an operator. The reclaim runs as that creator, so a key that lost
// any of it may not have the reclaim run in its name.
func creatorStillMay(sr ScheduledReclaim, key *APIKey, now time.Time) error {
	refuse := func(why string, args ...any) error {
		return Errorf(CodeCreatorKeyInvalid, "the API key %s that scheduled this reclaim %s", sr.CreatorKeyID, fmt.Sprintf(why, args...))
	}
	switch {
	case key == nil:
		return refuse("no longer exists")
	case key.Revoked:
		return refuse("was revoked%s", atSuffix(key.RevokedAt))
	case !key.Usable(now):
		return refuse("expired%s", atSuffix(key.ExpiresAt))
	}
	p := key.Principal()
	switch {
	case p.OrgID != sr.CreatorOrgID:
		return refuse("belongs to another org")
	case !p.Can(PermCapacity):
		return refuse("no longer holds %s", PermCapacity)
	case sr.CreatorOperator && !p.Operator:
		return refuse("is no longer an operator key")
	}
	return nil
}

// atSuffix formats an optional time as " at <RFC 3339>", or nothing.
func atSuffix(t *time.Time) string {
	if t == nil {
		return ""
	}
	return " at " + t.UTC().Format(time.RFC3339)
}

// firingAudit is the audit record of a firing refused before its reclaim ran: as the
// reclaim's own records, on the node's chain, naming the scheduled reclaim.
func (s *Service) firingAudit(ctx context.Context, sr ScheduledReclaim, meta RequestMeta, now time.Time) AuditRecord {
	st, err := s.Store.LoadNode(ctx, sr.NodeID, "")
	if err != nil {
		st = &NodeState{} // the record still says who and what; the node's owner is unknown
	}
	rec := s.auditRecord(sr.creator(), st, sr.request(), meta, ActionReclaim, now)
	rec.ReclaimID = sr.ID
	return rec
}

func cancelledErr(sr *ScheduledReclaim) *Error {
	return Errorf(CodeScheduledReclaimCancelled, "scheduled reclaim %s was cancelled", sr.ID)
}

// refuse records a firing's refusal on the scheduled reclaim, with its audit record if given
// (in the same transaction). Transient failures are not refusals (the firing is retried), nor
// are the scheduled reclaim's own states.
func (s *Service) refuse(ctx context.Context, sr ScheduledReclaim, err error, audit *AuditRecord) {
	switch code := ErrorCode(err); code {
	case CodeInternal, CodeThrottled, CodeConcurrentModification,
		CodeScheduledReclaimCancelled, CodeScheduledReclaimFired:
		return
	}
	now := s.now()
	next := sr
	next.State, next.Code, next.Detail, next.FiredAt, next.UpdatedAt = ScheduledRefused, ErrorCode(err), ErrorMessage(err), &now, now
	if uerr := s.Schedules.UpdateScheduled(ctx, sr, next, audit); uerr != nil {
		// Conditional: a cancel or a firing that won stays; the refusal is still answered,
		// and still audited.
		s.logger().WarnContext(ctx, "scheduled reclaim refusal not recorded", "scheduled_reclaim_id", sr.ID, "node", sr.NodeID, "err", uerr)
		if audit != nil {
			s.append(ctx, *audit)
		}
	}
}
