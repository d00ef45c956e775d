package capacity

import (
	"errors"
	"fmt"
	"time"
)

// Code is a stable, machine-readable error code. Clients branch on it; the HTTP layer maps
// each code to a status in exactly one place (shared/httpapi). Never rename a code.
type Code string

const (
	// CodeUnauthenticated: no, unknown, revoked or expired API key.
	CodeUnauthenticated Code = "unauthenticated"
	// CodeNotFound: the thing does not exist, or the caller may not know whether it does.
	CodeNotFound Code = "not_found"
	// CodeForbidden: the caller may see the reservation but not change its capacity.
	CodeForbidden Code = "forbidden"

	// Preconditions on the reservation or node (409).
	CodeReservationNotActive Code = "reservation_not_active"
	CodeOutsideTerm          Code = "outside_term"
	CodeTopologyChanged      Code = "topology_changed"
	CodeUnitsInUse           Code = "units_in_use"
	CodeUnitsUnavailable     Code = "units_unavailable"
	CodeVMExists             Code = "vm_exists"
	// CodeConcurrentModification: concurrent writes kept winning; retrying the call is safe.
	CodeConcurrentModification Code = "concurrent_modification"
	// CodeOperationRunning: a re-drive of a reclaim operation whose workflow still runs.
	CodeOperationRunning Code = "operation_running"
	// CodeScheduledReclaimCancelled: a schedule fired for a scheduled reclaim that was cancelled.
	CodeScheduledReclaimCancelled Code = "scheduled_reclaim_cancelled"
	// CodeScheduledReclaimFired: a cancel of a scheduled reclaim that has already fired
	// (completed or refused).
	CodeScheduledReclaimFired Code = "scheduled_reclaim_fired"
	// CodeCreatorKeyInvalid: a scheduled reclaim fired after the key that scheduled it was
	// revoked, expired or no longer held what the reclaim needs; it ends refused.
	CodeCreatorKeyInvalid Code = "creator_key_invalid"
	// CodeScheduledReclaimNotDue: a scheduled reclaim's firing came before its at (beyond
	// FiringSkew); refused, and the scheduled reclaim stays scheduled.
	CodeScheduledReclaimNotDue Code = "scheduled_reclaim_not_due"
	// CodeScheduledReclaimLimit: the org already has the most pending scheduled reclaims its
	// environment allows; nothing was scheduled. One that fires, is refused or is cancelled
	// frees a slot.
	CodeScheduledReclaimLimit Code = "scheduled_reclaim_limit"
	// CodeReservationExists: a reservation with the requested id exists on the node.
	CodeReservationExists Code = "reservation_exists"
	// CodeReservationOverlap: units are held by another reservation whose term overlaps.
	CodeReservationOverlap Code = "reservation_overlap"
	// CodeInvalidTransition: the node or reservation is not in a state the call applies to.
	CodeInvalidTransition Code = "invalid_transition"
	// CodePlanChanged: a reclaim sent with If-Match whose plan is no longer the one named (412);
	// Error.Plan holds the plan as it is now.
	CodePlanChanged Code = "plan_changed"

	// Request validity (422).
	CodeInvalidRequest       Code = "invalid_request"
	CodeUnitsNotReserved     Code = "units_not_reserved"
	CodeUnknownUnits         Code = "unknown_units"
	CodeIdempotencyKeyReused Code = "idempotency_key_reused"
	// CodeInsufficientUnits: a reclaim plan asked for more units than the reservation can
	// take back; Error.Available says how many it can.
	CodeInsufficientUnits Code = "insufficient_units"

	// CodeThrottled: the database refused the call for capacity, nothing was applied, and
	// retrying after a moment is safe (503 with Retry-After).
	CodeThrottled Code = "throttled"

	// CodeUnavailable: the database did not answer a read (connection refused or broken, or no
	// answer in time) after the SDK's retries; retrying after a moment is safe (503 with
	// Retry-After). A write whose outcome is unknown never answers it (see ErrorCode).
	CodeUnavailable Code = "unavailable"

	// CodeRateLimited: the calling API key is over its rate limit; nothing was written for
	// the call (a capacity call's read, run beside the limiter, is discarded), and
	// Error.RetryAfter says when one would be admitted (429).
	CodeRateLimited Code = "rate_limited"

	// CodeSchedulingUnavailable: this deployment has no scheduler for scheduled reclaims (501).
	CodeSchedulingUnavailable Code = "scheduling_unavailable"

	// CodeInternal: a fault of ours or of a dependency; details are logged, not returned.
	CodeInternal Code = "internal"
)

// Error is an application error: a code, a message safe to show the caller, and optional
// unit ids that the message is about (e.g. the ids not in the reservation).
type Error struct {
	Code    Code
	Message string
	UnitIDs []string
	// Plan is the current plan (a dry-run result with its PlanETag) for CodePlanChanged.
	Plan *CapacityResult
	// RetryAfter is how long the caller should wait before trying again (CodeRateLimited).
	RetryAfter time.Duration
	// Available is how many units a reclaim could take (CodeInsufficientUnits).
	Available *int
	// ExpiredAt is when the caller's own API key expired (CodeUnauthenticated): said only to
	// the holder of the key's secret, never for a key unknown or revoked.
	ExpiredAt *time.Time
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Errorf returns an application error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the application error in err's chain, or CodeInternal. A
// store error the database kept throttling (ErrThrottled), on any read or write, is
// CodeThrottled: nothing was applied and retrying later is safe; a read the database did not
// answer (ErrUnavailable) is CodeUnavailable. An error that also says a write's outcome is
// unknown (ErrAmbiguous) is neither, whatever a check after it met: the write may have landed.
func ErrorCode(err error) Code {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Code
	case errors.Is(err, ErrAmbiguous):
		return CodeInternal
	case errors.Is(err, ErrThrottled):
		return CodeThrottled
	case errors.Is(err, ErrUnavailable):
		return CodeUnavailable
	}
	return CodeInternal
}

// ErrorMessage returns the caller-safe message of err, hiding internal details.
func ErrorMessage(err error) string {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Message
	case errors.Is(err, ErrAmbiguous):
		return "internal error" // as ErrorCode: whatever a check after the write met
	case errors.Is(err, ErrThrottled):
		return errThrottled().Message
	case errors.Is(err, ErrUnavailable):
		return "the database did not answer; retry in a moment"
	}
	return "internal error"
}

// ErrConflict is returned (wrapped) by Store.Commit when a condition of the write failed: the
// state the decision read has changed since. The service re-reads and decides again.
var ErrConflict = errors.New("condition failed: state changed since it was read")

// ErrVMExists is returned (wrapped) by Store.Commit when the new VM's id is already taken on
// the node, by a VM the decision did not read (a terminated one). VM ids are never reused.
var ErrVMExists = errors.New("a VM with this id exists on the node")

// notFound is the single 404 the capacity calls return, whatever the reason, so that a caller
// cannot tell a missing permission, node or reservation from one another.
func notFound() *Error { return Errorf(CodeNotFound, "reservation not found") }

// nodeNotFound is the single 404 of placements, whatever the reason.
func nodeNotFound() *Error { return Errorf(CodeNotFound, "node not found") }

// ErrThrottled is returned (wrapped) by Store methods when the database refused the call for
// capacity (after the SDK's own retries): nothing was applied. ErrorCode maps it to
// CodeThrottled.
var ErrThrottled = errors.New("throttled: nothing was applied")

// ErrUnavailable is returned (wrapped) by Store methods when a read got no answer from the
// database (connection refused or broken, or no answer in time) after the SDK's retries: it
// changed nothing. ErrorCode maps it to CodeUnavailable.
var ErrUnavailable = errors.New("the database did not answer")

// ErrAmbiguous is returned (wrapped) by Store.Commit when the write may or may not have been
// applied (a timeout or server error on some attempt, which may have landed even if a later
// attempt failed). The service asks the store (CommitChecker) whether it landed before
// deciding again.
var ErrAmbiguous = errors.New("the outcome of the write is unknown")
