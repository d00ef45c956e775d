package capacity

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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
