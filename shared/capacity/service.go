package capacity

import (
	"context"
	"log/slog"
	"time"
)

// Store reads and writes the state of nodes. Implementations: shared/dynamo.
type Store interface {
	// LoadNode reads the node's partition in one strongly consistent read. idempotencyScope,
	// if not empty, names the caller's Idempotency-Key record to read with it. A missing
	// node is an *Error with CodeNotFound.
	LoadNode(ctx context.Context, nodeID, idempotencyScope string) (*NodeState, error)
	// Commit writes every item of the commit in one all-or-nothing transaction, each write
	// conditioned on what the decision read. It returns an error wrapping ErrConflict when a
	// condition failed.
	Commit(ctx context.Context, c Commit) error
	// AppendAudit appends a record for a call that wrote nothing else (dry runs, refusals).
	AppendAudit(ctx context.Context, rec AuditRecord) error
	// RecordUnchanged records a call whose decision changes nothing (a repeat of a change
	// already made): its audit record goes on the node's calls chain, with its
	// Idempotency-Key record (if any) in the same transaction, which writes nothing a commit
	// conditions on. It fails with ErrConflict (wrapped) when a record under that key exists
	// (the next round replays it), and with ErrAmbiguous when the outcome is unknown.
	RecordUnchanged(ctx context.Context, rec AuditRecord, idem *IdempotencyRecord) error
	// GetOperation returns a reclaim operation, or an *Error with CodeNotFound.
	GetOperation(ctx context.Context, nodeID, opID string) (*Operation, error)
	// Landed reports whether a commit whose Commit failed with ErrAmbiguous (a timeout or a
	// server error, possibly after the write was applied) was applied after all.
	Landed(ctx context.Context, c Commit) (bool, error)
	// RedriveOperation moves an ended operation, still in op.State at op's attempt, to
	// pending-start at the next attempt (restarts reset, reason cleared) and appends the
	// audit record, in one transaction; ErrConflict if the operation changed since read.
	RedriveOperation(ctx context.Context, op Operation, audit AuditRecord, now time.Time) error
}

// Commit is one decision's writes. Versions are the ones read: the store conditions on them
// and writes Version+1.
type Commit struct {
	Node Node
	// BumpNode serialises the write with every other capacity change on the node. A commit
	// that changes nothing at all (changesNothing) is not written as a commit: the service
	// records it with Store.RecordUnchanged.
	BumpNode    bool
	Reservation *Reservation // new released set and UpdatedAt; Version as read
	Evict       []VM         // VMs as read (running); they become terminating for Operation
	NewVM       *VM
	Operation   *Operation
	Idempotency *IdempotencyRecord
	Audit       AuditRecord
	// Scheduled, when a scheduled reclaim fires, is it moved to completed (Version as read,
	// in the state scheduled): a cancel and the firing cannot both win.
	Scheduled *ScheduledReclaim
}

// changesNothing reports whether the commit writes no state: a repeat of a change already
// made (units already exclusive with nothing to evict, units already released). Writing it
// would only move the node's changes chain, which every commit conditions on.
func (c *Commit) changesNothing() bool {
	return !c.BumpNode && c.Reservation == nil && len(c.Evict) == 0 && c.NewVM == nil && c.Operation == nil && c.Scheduled == nil
}

// Service applies capacity calls: read, decide, write in one transaction, re-deciding when a
// concurrent write won.
type Service struct {
	Store Store
	// Workflow starts the termination workflow of a committed reclaim. Nil: operations stay
	// pending-start until the reconciler starts them.
	Workflow Workflow
	// Now and NewID are replaceable for tests.
	Now   func() time.Time
	NewID func() string
	// Attempts bounds the read-decide-write rounds of every write (default 3): those that lost
	// a real race, or ended throttled or of unknown outcome (see commitRounds). Retry says how
	// the call goes on after a loss to a capacity commit elsewhere on the node.
	Attempts int
	// Retry shapes the rounds after a write that did not land (zero: the defaults).
	Retry RetryPolicy
	// IdempotencyTTL is how long an Idempotency-Key is remembered (default 24h).
	IdempotencyTTL time.Duration
	Logger         *slog.Logger
	// Metrics records each call's outcome (nil: none).
	Metrics Metrics
	// Scheduler and Schedules back scheduled reclaims (nil: scheduling answers
	// CodeSchedulingUnavailable).
	Scheduler Scheduler
	Schedules ScheduleStore
	// MaxPendingScheduled caps an org's pending scheduled reclaims (0: the default,
	// DefaultMaxPendingScheduled), so that no org's schedules can crowd out another's.
	MaxPendingScheduled int
	// CreatorKeys reads the key a scheduled reclaim runs as when it fires (nil: firings fail
	// as internal errors, so they wait in the queue rather than run unchecked).
	CreatorKeys KeyReader
	// Keys backs key management (nil: its calls fail as internal errors).
	Keys KeyStore
	// AgentKeySealer seals the random agent key a node gets at registration, at an owner
	// change and at a rotation (nil: nodes keep the key derived from the agent master secret,
	// which the api cannot read, so none is handed out and none can be rotated).
	// AllowHTTPAgents admits http agent endpoints (the local environment).
	AgentKeySealer  AgentKeySealer
	AllowHTTPAgents bool
	// RateLimit is the environment's per-key rate limit (nil: none known), the most a key
	// created with a limit of its own may have.
	RateLimit *RateLimit
}

// RequestMeta carries facts about the call that the domain records but does not decide on.
type RequestMeta struct {
	RequestID string
	// Via is how the call came: ViaHTTP (also ""), ViaEvent, ViaSchedule or ViaDirect.
	Via string
	// EventID names the event that carried the call, if one did.
	EventID string
}

// via is how the call came, for its audit record: HTTP unless said otherwise.
func (m RequestMeta) via() string {
	if m.Via == "" {
		return ViaHTTP
	}
	return m.Via
}

// CapacityResult is the outcome of a reclaim or release.
type CapacityResult struct {
	Reservation Reservation `json:"reservation"`
	DryRun      bool        `json:"dryRun,omitempty"`
	// ReclaimID names the reclaim operation whose workflow terminates the evicted VMs.
	ReclaimID  string   `json:"reclaimId,omitempty"`
	Terminated []string `json:"terminated,omitempty"`
	Skipped    []string `json:"skipped,omitempty"`
	// Reason echoes the call's reason.
	Reason string `json:"reason,omitempty"`
	// TerminateAfter is when the evicted VMs' termination may begin (commit time plus the
	// grace); zero when nothing was evicted or for a dry run.
	TerminateAfter time.Time `json:"terminateAfter,omitzero"`
	// PlanETag names a dry-run reclaim's plan (see PlanETag): a real reclaim sent with it in
	// If-Match runs only while the plan is the same.
	PlanETag string `json:"planEtag,omitempty"`
	// Replayed is set when the result was stored under the request's Idempotency-Key.
	Replayed bool `json:"-"`
}

// PlacementResult is the outcome of a placement.
type PlacementResult struct {
	VM       VM   `json:"vm"`
	Replayed bool `json:"-"`
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

func (s *Service) attempts() int {
	if s.Attempts > 0 {
		return s.Attempts
	}
	return DefaultAttempts
}

func (s *Service) idempotencyTTL() time.Duration {
	if s.IdempotencyTTL > 0 {
		return s.IdempotencyTTL
	}
	return 24 * time.Hour
}

func (s *Service) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

func (s *Service) newID() string {
	if s.NewID != nil {
		return s.NewID()
	}
	return NewID()
}

// auditRefusal records a refused call. 404s are not recorded against the reservation (the
// caller may not know it exists) but are logged by the HTTP layer like every call.
func (s *Service) auditRefusal(ctx context.Context, rec AuditRecord, err error) {
	code := ErrorCode(err)
	if code == CodeNotFound || code == CodeInternal {
		return
	}
	rec.Outcome = string(code)
	s.append(ctx, rec)
}

// append writes an audit record outside a transaction. A failure is logged, not returned:
// the call's answer must not depend on the audit trail of a call that changed nothing.
func (s *Service) append(ctx context.Context, rec AuditRecord) {
	err := s.Store.AppendAudit(ctx, rec)
	switch {
	case err == nil:
	case ErrorCode(err) == CodeNotFound:
		// A call on a node that does not exist (yet) has no chain to go on: the log keeps it.
		s.logger().WarnContext(ctx, "audit record of a call on a node that does not exist, not kept", "audit_id", rec.ID,
			"action", rec.Action, "node_id", rec.NodeID, "outcome", rec.Outcome, "actor_key_id", rec.ActorKeyID,
			"caller_org_id", rec.CallerOrgID, "request_id", rec.RequestID)
	default:
		s.logger().ErrorContext(ctx, "audit append failed", "err", err, "audit_id", rec.ID, "action", rec.Action)
	}
}
