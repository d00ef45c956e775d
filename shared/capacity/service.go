package capacity

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
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
	// Attempts bounds read-decide-write rounds under contention (default 3). In a node's
	// capacity and operator writes it bounds the rounds that lost a real race (see
	// applyRounds); Retry says how the call goes on after a loss to a commit elsewhere.
	Attempts int
	// Retry shapes the rounds after a lost commit (zero: the defaults).
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

// RetryPolicy is how a node's read-decide-commit rounds go on after a lost commit (see
// applyRounds). Zero fields take the defaults.
type RetryPolicy struct {
	// Detours is how many commits a call may lose to commits that left its own units as its
	// decision read them (losses elsewhere on the node) before it gives up; they do not count
	// against Service.Attempts (default DefaultDetours).
	Detours int
	// Base and Cap shape the wait before the read after the n-th lost commit: a uniformly
	// random time below min(Cap, Base*2^(n-1)) ("full jitter"; defaults DefaultRetryBase and
	// DefaultRetryCap).
	Base, Cap time.Duration
	// Margin is the time a round needs before the call's deadline: no round starts later
	// than the context's deadline less Margin (default DefaultRetryMargin).
	Margin time.Duration
}

// Defaults of Service.Attempts and RetryPolicy. With them one call's waits add up to under
// 6.4 s (at most 32 waits, each under 200 ms; about 3 s on average were every round to
// lose), and within the api function's 10 s the margin stops it sooner.
const (
	DefaultAttempts    = 3
	DefaultDetours     = 30
	DefaultRetryBase   = 5 * time.Millisecond
	DefaultRetryCap    = 200 * time.Millisecond
	DefaultRetryMargin = time.Second
)

func (p RetryPolicy) withDefaults() RetryPolicy {
	p.Detours = cmp.Or(p.Detours, DefaultDetours)
	p.Base = cmp.Or(p.Base, DefaultRetryBase)
	p.Cap = cmp.Or(p.Cap, DefaultRetryCap)
	p.Margin = cmp.Or(p.Margin, DefaultRetryMargin)
	return p
}

// Wait returns the full-jitter wait after the n-th lost commit (n >= 1): spread over the
// whole window, the callers that lost together do not meet again at once.
func (p RetryPolicy) Wait(n int) time.Duration {
	window := p.Cap
	if n <= 16 && p.Base<<(n-1) < p.Cap {
		window = p.Base << (n - 1)
	}
	if window <= 0 {
		return 0
	}
	return rand.N(window)
}

// timeFor reports whether a round may start after waiting d: ctx has no deadline, or d and
// the margin fit before it.
func (p RetryPolicy) timeFor(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return !ok || time.Until(deadline) > d+p.Margin
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
	// A caller without the permission learns nothing, not even whether its input was valid.
	if err := AdmitCapacityCall(p, req.NodeID, req.ReservationID); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := req.validateFor(action); err != nil {
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

// idempotency identifies a request made under an Idempotency-Key.
type idempotency struct {
	scope       string // "" when the request carries no key
	fingerprint string
}

// errNodeNotFound is what apply returns for a missing node; each call words its own 404.
var errNodeNotFound = errors.New("node not found")

// committer is what apply needs to write one kind of commit: capacity commits (Commit) and
// operator commits (OperatorCommit) share the read-decide-commit loop and differ only here.
type committer[C any] struct {
	kind    string // names the write in logs: "capacity" or "operator"
	subject string // what kept changing, in the answer when every round lost its race
	load    func(ctx context.Context, nodeID, idempotencyScope string) (*NodeState, error)
	commit  func(ctx context.Context, c *C) error
	// probe is c as Store.Landed looks for it: its node and audit record.
	probe func(c *C) Commit
	// found, if set, completes a pending commit that turned out to have landed.
	found func(ctx context.Context, c *C)
	// raced, if set, tells a lost commit's real race from a loss to a commit elsewhere on the
	// node, by the state it was decided on and the state read after (see Raced). Nil: every
	// loss is a real race.
	raced func(before, after *NodeState, c *C) bool
}

// capacityCommits writes capacity commits with Store.Commit.
func (s *Service) capacityCommits() committer[Commit] {
	return committer[Commit]{
		kind: "capacity", subject: "the node's capacity",
		load: s.Store.LoadNode,
		commit: func(ctx context.Context, c *Commit) error {
			if c.changesNothing() {
				return s.Store.RecordUnchanged(ctx, c.Audit, c.Idempotency)
			}
			return s.Store.Commit(ctx, *c)
		},
		probe: func(c *Commit) Commit { return *c },
		raced: func(before, after *NodeState, c *Commit) bool { return Raced(before, after, *c) },
	}
}

// apply runs read-decide-commit rounds of capacity commits (see applyRounds).
func (s *Service) apply(ctx context.Context, nodeID string, key idempotency, decide func(st *NodeState, now time.Time) (*Commit, error)) (*Commit, error) {
	return applyRounds(s, ctx, nodeID, key, s.capacityCommits(), decide)
}

// applyRounds runs read-decide-commit rounds on one node until a commit lands, the decision
// needs no write (it returns a nil commit), or the retry budget runs out: each lost race is
// re-read and re-decided, since the state the decision was made on has changed. It returns
// the commit that landed (nil if none did), whose round's answer is the call's answer.
//
// The budget: Service.Attempts rounds that lost a real race (another write changed what the
// decision read of the units its commit touches: w.raced, told on the next round's read) or
// ended throttled or of unknown outcome. A commit lost to a commit on other units of the node
// (they serialise on the node's version and audit head) does not count: up to
// RetryPolicy.Detours of them are retried on top, while the call's deadline allows. Before
// each read after a lost commit the call waits a full-jitter backoff, so that calls that lost
// together spread out. Every commit still conditions on exactly what its own round read.
//
// A commit whose outcome is unknown (ErrAmbiguous: a timeout or server error, possibly after
// the write was applied) stays pending: every later round first reads the node and then
// asks the store whether a pending commit landed. Reading first matters: a commit visible
// in the read is found by the check after it, so a round never decides on the state its
// own earlier commit left (which would evict nothing and answer `terminated: []`). Two
// commits of one call cannot both land: each conditions on the node version it read, and
// every commit that changes anything bumps it.
func applyRounds[C any](s *Service, ctx context.Context, nodeID string, key idempotency, w committer[C],
	decide func(st *NodeState, now time.Time) (*C, error)) (*C, error) {
	var pending []*C
	var last error // the last round's failure, to word the final answer
	stats := CallStatsFrom(ctx)
	retry := s.Retry.withDefaults()
	spent, detours, losses, rounds := 0, 0, 0, 0
	// The last round's commit, while its loss is not yet told a real race or not, and the
	// state it was decided on.
	var lost *C
	var lostOn *NodeState
	settle := func(after *NodeState) {
		if after != nil && w.raced != nil && !w.raced(lostOn, after, lost) {
			detours++
		} else {
			spent++
		}
		lost, lostOn = nil, nil
	}
	for spent < s.attempts() {
		if lost != nil {
			wait := retry.Wait(losses)
			if !retry.timeFor(ctx, wait) {
				break // the answer would come too late to be of use
			}
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
		rounds++
		stats.AddRound()
		now := s.now()
		start := time.Now()
		st, err := w.load(ctx, nodeID, key.scope)
		stats.Since(PhaseRead, start)
		if ErrorCode(err) == CodeNotFound {
			return nil, errNodeNotFound
		}
		if err != nil && len(pending) > 0 {
			if lost != nil {
				settle(nil) // no read to tell it by
			}
			// Not "throttled, nothing was applied": an earlier round's commit may have landed.
			if c, lerr := landed(s, ctx, w, pending); c != nil || lerr != nil {
				return c, lerr
			}
			last = fmt.Errorf("load node %s after a commit of unknown outcome: %v: %w", nodeID, err, ErrAmbiguous)
			spent++
			continue // read again next round
		}
		if err != nil {
			return nil, fmt.Errorf("load node %s: %w", nodeID, err)
		}
		if lost != nil {
			settle(st)
			if spent >= s.attempts() || detours >= retry.Detours {
				break
			}
		}
		if c, err := landed(s, ctx, w, pending); c != nil || err != nil {
			return c, err
		}
		start = time.Now()
		commit, err := decide(st, now)
		stats.Since(PhaseDecide, start)
		if err != nil || commit == nil {
			return nil, err
		}
		audit := w.probe(commit).Audit
		start = time.Now()
		err = w.commit(ctx, commit)
		stats.Since(PhaseCommit, start)
		last = err
		switch {
		case err == nil:
			return commit, nil
		case errors.Is(err, ErrAmbiguous):
			s.logger().WarnContext(ctx, w.kind+" write outcome unknown; checking before deciding again",
				"node", nodeID, "action", audit.Action, "audit_id", audit.ID, "err", err)
			pending = append(pending, commit)
			spent++
		case errors.Is(err, ErrConflict):
			s.logger().InfoContext(ctx, w.kind+" write lost a race; deciding again", "node", nodeID, "action", audit.Action)
			lost, lostOn = commit, st
			losses++
		case errors.Is(err, ErrThrottled):
			s.logger().WarnContext(ctx, w.kind+" write throttled; deciding again", "node", nodeID, "action", audit.Action, "err", err)
			// The SDK already backed off; a short pause more keeps rounds from piling on.
			if err := sleep(ctx, time.Duration(25<<spent)*time.Millisecond); err != nil {
				return nil, err
			}
			spent++
		default:
			// Such as vm_exists for the VM an earlier round of this call placed after all.
			if c, lerr := landed(s, ctx, w, pending); c != nil || lerr != nil {
				return c, lerr
			}
			return nil, fmt.Errorf("commit %s on node %s: %w", audit.Action, nodeID, err)
		}
	}
	if c, err := landed(s, ctx, w, pending); c != nil || err != nil {
		return c, err
	}
	switch {
	case errors.Is(last, ErrThrottled) && len(pending) == 0:
		return nil, errThrottled()
	case errors.Is(last, ErrAmbiguous) || len(pending) > 0:
		// Not applied as of the check; every later write conditions on the versions it reads.
		return nil, fmt.Errorf("commit on node %s: outcome still unknown after %d rounds: %w", nodeID, rounds, last)
	}
	if detours > 0 {
		s.logger().WarnContext(ctx, w.kind+" write gave up", "node", nodeID, "rounds", rounds,
			"real_races", spent, "losses_elsewhere", detours)
	}
	return nil, Errorf(CodeConcurrentModification, "%s kept changing while this call was applied; retrying is safe", w.subject)
}

func errThrottled() *Error {
	return Errorf(CodeThrottled, "the database is throttling this node; nothing was applied and retrying shortly is safe")
}

// landed returns the pending commit that landed, if any.
func landed[C any](s *Service, ctx context.Context, w committer[C], pending []*C) (*C, error) {
	if len(pending) == 0 {
		return nil, nil
	}
	// Learning a commit's outcome is part of committing.
	defer CallStatsFrom(ctx).Since(PhaseCommit, time.Now())
	for _, c := range pending {
		probe := w.probe(c)
		ok, err := s.Store.Landed(ctx, probe)
		// The call's answer hangs on this read, and a read is safe to repeat: outlast a
		// throttling burst (beyond the SDK's own retries) before giving up.
		for try := 0; err != nil && try < 5; try++ {
			if serr := sleep(ctx, time.Duration(50<<try)*time.Millisecond); serr != nil {
				break
			}
			ok, err = s.Store.Landed(ctx, probe)
		}
		if err != nil {
			// %v: whatever the read's error, the commit's outcome is unknown, not "throttled".
			return nil, fmt.Errorf("check commit %s on node %s: outcome unknown: %v", probe.Audit.ID, probe.Node.ID, err)
		}
		if ok {
			s.logger().InfoContext(ctx, w.kind+" write had landed; answering with it", "node", probe.Node.ID, "audit_id", probe.Audit.ID)
			if w.found != nil {
				w.found(ctx, c)
			}
			return c, nil
		}
	}
	return nil, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// idempotencyRecord is the record that replays result for a request made with a key (nil for
// a request without one). Every write that honours Idempotency-Key stores it with its commit.
func (s *Service) idempotencyRecord(key idempotency, nodeID string, result any, now time.Time) (*IdempotencyRecord, error) {
	if key.scope == "" {
		return nil, nil
	}
	body, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("encode result for idempotency record: %w", err)
	}
	return &IdempotencyRecord{
		Scope: key.scope, NodeID: nodeID, Fingerprint: key.fingerprint, Result: body,
		CreatedAt: now, ExpiresAt: now.Add(s.idempotencyTTL()),
	}, nil
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

// GetOperation returns a reclaim operation to a caller who may see its reservation: whole to
// an operator, the node owner or a managing org; redacted (see OperationView) to the
// reservation's audience.
func (s *Service) GetOperation(ctx context.Context, p Principal, nodeID, reservationID, opID string) (*OperationView, error) {
	if !ValidID(opID) {
		return nil, notFound() // names nothing; checked before any read, like the other path ids
	}
	_, access, err := s.visibleReservation(ctx, p, nodeID, reservationID)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	op, err := s.Store.GetOperation(ctx, nodeID, opID)
	CallStatsFrom(ctx).Since(PhaseRead, start)
	if ErrorCode(err) == CodeNotFound || (err == nil && op.ReservationID != reservationID) {
		return nil, Errorf(CodeNotFound, "reclaim operation not found")
	}
	if err != nil {
		return nil, fmt.Errorf("read operation %s: %w", opID, err)
	}
	if access == AccessManage {
		return &OperationView{Operation: *op}, nil
	}
	return op.redacted(), nil
}

// GetReservation returns a reservation to a caller who may see it, with the status a reader
// sees now (expired once its term has ended).
func (s *Service) GetReservation(ctx context.Context, p Principal, nodeID, reservationID string) (*Reservation, error) {
	r, _, err := s.visibleReservation(ctx, p, nodeID, reservationID)
	if err != nil {
		return nil, err
	}
	out := *r
	out.Status = r.StatusAt(s.now())
	return &out, nil
}

// visibleReservation reads a reservation for a caller who may see it, and the caller's access.
func (s *Service) visibleReservation(ctx context.Context, p Principal, nodeID, reservationID string) (*Reservation, Access, error) {
	if err := AdmitReservationRead(p, nodeID, reservationID); err != nil {
		return nil, AccessNone, err
	}
	start := time.Now()
	st, err := s.Store.LoadNode(ctx, nodeID, "")
	CallStatsFrom(ctx).Since(PhaseRead, start)
	if err != nil {
		if ErrorCode(err) == CodeNotFound {
			return nil, AccessNone, notFound()
		}
		return nil, AccessNone, fmt.Errorf("load node %s: %w", nodeID, err)
	}
	r := st.Reservation(reservationID)
	if r == nil {
		return nil, AccessNone, notFound()
	}
	access := AccessOf(p, st.Node, *r)
	if access == AccessNone {
		return nil, AccessNone, notFound()
	}
	return r, access, nil
}

func (s *Service) newID() string {
	if s.NewID != nil {
		return s.NewID()
	}
	return NewID()
}

func (s *Service) auditRecord(p Principal, st *NodeState, req CapacityRequest, meta RequestMeta, action string, now time.Time) AuditRecord {
	return AuditRecord{
		ID: s.newID(), Time: now, RequestID: meta.RequestID, ActorKeyID: p.KeyID, CallerOrgID: p.OrgID,
		ActingFor: st.Node.OwnerOrgID, Action: action, NodeID: req.NodeID, ReservationID: req.ReservationID,
		UnitIDs: req.UnitIDs, DryRun: req.DryRun, Reason: req.Reason, TopologyGen: st.Node.TopologyGen,
		Via: meta.via(), EventID: meta.EventID,
	}
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

// OutcomeReplayed is the audit outcome of a call answered from its Idempotency-Key record:
// nothing was applied, but who asked again for the stored answer is on record.
const OutcomeReplayed = "replayed"

// replayAudit is the audit record of a replayed call: the call's own facts, with nothing
// moved.
func replayAudit(rec AuditRecord) *AuditRecord {
	rec.Outcome = OutcomeReplayed
	return &rec
}

// replay decodes a stored result into out when the record matches the request. An expired
// record (TTL deletion lags expiry by up to days) no longer binds the key.
func replay(rec *IdempotencyRecord, fingerprint string, now time.Time, out any) (bool, error) {
	if rec == nil || !now.Before(rec.ExpiresAt) {
		return false, nil
	}
	if rec.Fingerprint != fingerprint {
		return false, Errorf(CodeIdempotencyKeyReused, "Idempotency-Key was already used for a different request")
	}
	if err := json.Unmarshal(rec.Result, out); err != nil {
		return false, fmt.Errorf("decode stored idempotent result: %w", err)
	}
	switch r := out.(type) {
	case *CapacityResult:
		r.Replayed = true
	case *PlacementResult:
		r.Replayed = true
	case *NodeResult:
		r.Replayed = true
	case *ReservationResult:
		r.Replayed = true
	case *TopologyResult:
		r.Replayed = true
	case *ForceEndResult:
		r.Replayed = true
	case *AgentKeyResult:
		r.Replayed = true
	}
	return true, nil
}

// Prefixes of the Idempotency-Keys the service chooses itself: a scheduled reclaim fires
// under "scheduled:<id>" (FireIdempotencyKey), an event without a key of its own runs under
// "event:<event id>". A client may not choose them.
const (
	ScheduledKeyPrefix = "scheduled:"
	EventKeyPrefix     = "event:"
)

// keyed is the idempotency of a request made with Idempotency-Key key (none when ""). A key
// with one of the service's own prefixes is refused unless the service chose it: were a
// client to take "scheduled:<id>" first, the scheduled reclaim's firing would replay the
// client's answer (or be refused as a reuse) instead of running.
func keyed(p Principal, meta RequestMeta, key, fingerprint string) (idempotency, error) {
	reserved := false
	switch {
	case strings.HasPrefix(key, ScheduledKeyPrefix):
		reserved = meta.via() != ViaSchedule
	case strings.HasPrefix(key, EventKeyPrefix):
		reserved = meta.via() != ViaEvent || key != EventKeyPrefix+meta.EventID
	}
	if reserved {
		return idempotency{}, Errorf(CodeInvalidRequest, "Idempotency-Key may not start with %q or %q: the service keys its own scheduled reclaims and events with them",
			ScheduledKeyPrefix, EventKeyPrefix)
	}
	return idempotency{scope: idempotencyScope(p, key), fingerprint: fingerprint}, nil
}

// ValidateClientIdempotencyKey checks an Idempotency-Key a client sent to a call that keeps
// no record of it (a key revocation): its form, and that it is none of the service's own.
func ValidateClientIdempotencyKey(key string) error {
	if err := ValidateIdempotencyKey(key); err != nil {
		return err
	}
	_, err := keyed(Principal{}, RequestMeta{}, key, "")
	return err
}

// idempotencyScope keys a caller's Idempotency-Key by the calling key and its org: a retry
// by the same key replays, and the same Idempotency-Key sent with another key (of the same
// org or not) is another request, which neither replays nor is refused by the first one's
// record. Events act as "event:<source>" for an org, scheduled reclaims as the key that
// created them. The "@" that starts it is no first character of an org id, so a scope never
// equals one written before keys were in it (LegacyIdempotencyScope).
func idempotencyScope(p Principal, key string) string {
	if key == "" {
		return ""
	}
	return "@" + scopePart.Replace(p.KeyID) + "#" + scopePart.Replace(p.OrgID) + "#" + key
}

// scopePart escapes the separator (and the escape) in a scope's key id and org id, so that
// no two (key, org, Idempotency-Key) share a scope.
var scopePart = strings.NewReplacer("%", "%25", "#", "%23")

// LegacyIdempotencyScope is the scope that the same call had before scopes named the calling
// key (org "#" Idempotency-Key), "" for a scope of no such form. Records under it are still
// honoured until they expire (24 h after they were written), so that a retry across the
// change replays rather than applies again; the store reads them alongside.
func LegacyIdempotencyScope(scope string) string {
	rest, ok := strings.CutPrefix(scope, "@")
	if !ok {
		return ""
	}
	_, rest, ok = strings.Cut(rest, "#")
	if !ok {
		return ""
	}
	org, key, ok := strings.Cut(rest, "#")
	if !ok {
		return ""
	}
	org = strings.NewReplacer("%23", "#", "%25", "%").Replace(org)
	return org + "#" + key
}

// fingerprintOf hashes what a request asks for, to tell a retry from a reuse of its key.
// Unit ids are a set (validation refuses duplicates): their order does not make a request
// different.
func fingerprintOf(action string, req any) string {
	switch r := req.(type) {
	case CapacityRequest:
		r.UnitIDs = slices.Sorted(slices.Values(r.UnitIDs))
		req = r
	case PlacementRequest:
		r.UnitIDs = slices.Sorted(slices.Values(r.UnitIDs))
		req = r
	}
	b, _ := json.Marshal(struct {
		Action  string
		Request any
	}{action, req})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
