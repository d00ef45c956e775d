package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

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
