package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// RetryPolicy is how the read-decide-commit rounds of a write go on after a write that did not
// land, or whose outcome is unknown (see commitRounds). Zero fields take the defaults. The
// number of rounds is Service.Attempts.
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
	// ThrottlePause is the pause after the n-th throttled write (n from 0), doubled each time:
	// ThrottlePause<<n. The SDK has backed off already; the pause keeps rounds from piling
	// on (default DefaultThrottlePause).
	ThrottlePause time.Duration
	// CheckRetries is how often a failed read that checks whether a write of unknown outcome
	// landed is read again, after CheckBase<<try (try from 0): the call's answer hangs on it,
	// and a read is safe to repeat (defaults DefaultCheckRetries and DefaultCheckBase).
	CheckRetries int
	CheckBase    time.Duration
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
	// A throttled write pauses 25, 50, 100 ms; a failed check is read again up to 5 times,
	// after 50 ms doubling to 800 ms (1.55 s in all, to outlast a throttling burst).
	DefaultThrottlePause = 25 * time.Millisecond
	DefaultCheckRetries  = 5
	DefaultCheckBase     = 50 * time.Millisecond
)

func (p RetryPolicy) withDefaults() RetryPolicy {
	p.Detours = cmp.Or(p.Detours, DefaultDetours)
	p.Base = cmp.Or(p.Base, DefaultRetryBase)
	p.Cap = cmp.Or(p.Cap, DefaultRetryCap)
	p.Margin = cmp.Or(p.Margin, DefaultRetryMargin)
	p.ThrottlePause = cmp.Or(p.ThrottlePause, DefaultThrottlePause)
	p.CheckRetries = cmp.Or(p.CheckRetries, DefaultCheckRetries)
	p.CheckBase = cmp.Or(p.CheckBase, DefaultCheckBase)
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

// errNodeNotFound is what a node's read answers for a missing node; each call words its own
// 404. It is a not-found refusal, so the commit loop ends the call with it.
var errNodeNotFound = &Error{Code: CodeNotFound, Message: "node not found"}

// nodeRead reads a node's partition with load (Store.LoadNode, or LoadNodeOrNew), with the
// caller's idempotency record when scope is set.
func nodeRead(load func(ctx context.Context, nodeID, scope string) (*NodeState, error), nodeID, scope string) func(ctx context.Context) (*NodeState, error) {
	return func(ctx context.Context) (*NodeState, error) {
		st, err := load(ctx, nodeID, scope)
		if ErrorCode(err) == CodeNotFound {
			return nil, errNodeNotFound
		}
		if err != nil {
			return nil, fmt.Errorf("load node %s: %w", nodeID, err)
		}
		return st, nil
	}
}

// writer is one kind of write as the commit loop (commitRounds) needs it: every write of the
// service goes through the loop, and the kinds differ only here. S is what a round reads, C
// what it writes.
type writer[S, C any] struct {
	kind    string // names the write in logs: "capacity", "operator", "key revoke", ...
	subject string // what kept changing, in the answer when every round lost its race
	// logAttrs name what the call writes to, in its logs.
	logAttrs []any
	// read reads what a round decides on. A not-found refusal (an *Error) ends the call with
	// it; any other error is a failed read.
	read func(ctx context.Context) (*S, error)
	// commit sends a round's write. A failure wraps ErrConflict (a condition failed: what the
	// round read has changed), ErrThrottled (nothing was applied) or ErrAmbiguous (the outcome
	// is unknown); any other ends the call.
	commit func(ctx context.Context, c *C) error
	// audit is c's audit record: every write has one, and it names the write in logs.
	audit func(c *C) AuditRecord
	// landed reads whether a write of unknown outcome was applied after all; when it was, it
	// may complete c with what only the store knew.
	landed func(ctx context.Context, c *C) (bool, error)
	// raced, if set, tells a lost write's real race from a loss to a write elsewhere (see
	// Raced), by the state it was decided on and the state read after. Nil: every loss is a
	// real race.
	raced func(before, after *S, c *C) bool
	// dropped, if set, undoes what a write that was refused left outside the store (a
	// scheduled reclaim's schedule). It is not called for a write of unknown outcome.
	dropped func(ctx context.Context, c *C)
}

// commitRounds runs read-decide-commit rounds until a write lands, the decision needs no
// write (decide returns a nil commit: a refusal, a replay or nothing to change), or the retry
// budget runs out: each lost race is read and decided again, since the state the decision was
// made on has changed. It returns the write that landed (nil if none did), whose round's
// answer is the call's answer.
//
// The budget: Service.Attempts rounds that lost a real race (another write changed what the
// decision read of what its write touches: w.raced, told on the next round's read), or ended
// throttled or of unknown outcome. A write lost to a write elsewhere (capacity commits on other
// units of the node serialise on the node's version and audit head) does not count: up to
// RetryPolicy.Detours of them are retried on top. Before each read after a lost write the call
// waits a full-jitter backoff, so that calls that lost together spread out, and no such round
// starts within RetryPolicy.Margin of the call's deadline. A throttled write pauses
// (RetryPolicy.ThrottlePause) and goes again; the call answers throttled if its last round was
// and no write of unknown outcome is pending (then the outcome is unknown, not "nothing applied").
// Every write conditions on exactly what its own round read.
//
// A write whose outcome is unknown (ErrAmbiguous: a timeout or server error, possibly after it
// was applied) stays pending: every later round first reads and then asks (w.landed) whether a
// pending write landed, and so does the call before it gives up. Reading first matters: a write
// visible in the read is found by the check after it, so a round never decides on the state
// its own earlier write left (a reclaim would evict nothing and answer `terminated: []`). The
// round's decision is told the latest pending write: where nothing else keeps two writes of
// one call from both landing (a new API key; a new scheduled reclaim), it sends that one again
// as it was. Elsewhere two writes of one call cannot both land: each conditions on a version
// that every write bumps.
func commitRounds[S, C any](s *Service, ctx context.Context, w writer[S, C],
	decide func(st *S, now time.Time, pending *C) (*C, error)) (*C, error) {
	var pending []*C
	var last error // the last round's failure, to word the final answer
	stats := CallStatsFrom(ctx)
	retry := s.Retry.withDefaults()
	spent, detours, losses, rounds := 0, 0, 0, 0
	// The last round's write, while its loss is not yet told a real race or not, and the
	// state it was decided on.
	var lost *C
	var lostOn *S
	settle := func(after *S) {
		if after != nil && w.raced != nil && !w.raced(lostOn, after, lost) {
			detours++
		} else {
			spent++
		}
		lost, lostOn = nil, nil
	}
	refused := func(c *C) {
		if w.dropped != nil && !slices.Contains(pending, c) {
			w.dropped(ctx, c)
		}
	}
	for spent < s.attempts() {
		if lost != nil {
			wait := retry.Wait(losses)
			if !retry.timeFor(ctx, wait) {
				break // the answer would come too late to be of use
			}
			if err := Sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
		rounds++
		stats.AddRound()
		now := s.now()
		start := time.Now()
		st, err := w.read(ctx)
		stats.Since(PhaseRead, start)
		// The rate limiter ran beside the read (see Admission): nothing is written, nor
		// answered from the read, before it has admitted the call. A refusal discards the
		// read, whatever it found. Later rounds find the answer already in.
		if aerr := Admitted(ctx); aerr != nil {
			return nil, aerr
		}
		if ErrorCode(err) == CodeNotFound {
			return nil, err
		}
		if err != nil && len(pending) > 0 {
			if lost != nil {
				settle(nil) // no read to tell it by
			}
			// Not "throttled, nothing was applied": an earlier round's write may have landed.
			if c, lerr := landed(s, ctx, w, retry, pending); c != nil || lerr != nil {
				return c, lerr
			}
			last = fmt.Errorf("read after a %s write of unknown outcome: %v: %w", w.kind, err, ErrAmbiguous)
			spent++
			continue // read again next round
		}
		if err != nil {
			return nil, err
		}
		if lost != nil {
			settle(st)
			if spent >= s.attempts() || detours >= retry.Detours {
				break
			}
		}
		if c, err := landed(s, ctx, w, retry, pending); c != nil || err != nil {
			return c, err
		}
		var latest *C
		if len(pending) > 0 {
			latest = pending[len(pending)-1]
		}
		start = time.Now()
		commit, err := decide(st, now, latest)
		stats.Since(PhaseDecide, start)
		if err != nil || commit == nil {
			return nil, err
		}
		audit := w.audit(commit)
		logAttrs := append(slices.Clone(w.logAttrs), "action", audit.Action, "audit_id", audit.ID)
		start = time.Now()
		err = w.commit(ctx, commit)
		stats.Since(PhaseCommit, start)
		last = err
		switch {
		case err == nil:
			return commit, nil
		case errors.Is(err, ErrAmbiguous):
			s.logger().WarnContext(ctx, w.kind+" write outcome unknown; checking before deciding again", append(logAttrs, "err", err)...)
			if !slices.Contains(pending, commit) {
				pending = append(pending, commit)
			}
			spent++
		case errors.Is(err, ErrConflict):
			s.logger().InfoContext(ctx, w.kind+" write lost a race; deciding again", logAttrs...)
			refused(commit)
			lost, lostOn = commit, st
			losses++
		case errors.Is(err, ErrThrottled):
			s.logger().WarnContext(ctx, w.kind+" write throttled; deciding again", append(logAttrs, "err", err)...)
			refused(commit)
			if err := Sleep(ctx, retry.ThrottlePause<<spent); err != nil {
				return nil, err
			}
			spent++
		default:
			refused(commit)
			// Such as vm_exists for the VM an earlier round of this call placed after all.
			if c, lerr := landed(s, ctx, w, retry, pending); c != nil || lerr != nil {
				return c, lerr
			}
			return nil, fmt.Errorf("%s write %s: %w", w.kind, audit.Action, err)
		}
	}
	if c, err := landed(s, ctx, w, retry, pending); c != nil || err != nil {
		return c, err
	}
	switch {
	case errors.Is(last, ErrThrottled) && len(pending) == 0:
		return nil, errThrottled()
	case errors.Is(last, ErrAmbiguous) || len(pending) > 0:
		// Not applied as of the check; every later write conditions on what it reads. A last
		// round throttled does not make the pending write's outcome "nothing was applied".
		if !errors.Is(last, ErrAmbiguous) {
			last = fmt.Errorf("%v: %w", last, ErrAmbiguous)
		}
		return nil, fmt.Errorf("%s write: outcome still unknown after %d rounds: %w", w.kind, rounds, last)
	}
	if detours > 0 {
		s.logger().WarnContext(ctx, w.kind+" write gave up", append(slices.Clone(w.logAttrs), "rounds", rounds,
			"real_races", spent, "losses_elsewhere", detours)...)
	}
	return nil, Errorf(CodeConcurrentModification, "%s kept changing while this call was applied; retrying is safe", w.subject)
}

func errThrottled() *Error {
	return Errorf(CodeThrottled, "the database is throttling this node; nothing was applied and retrying shortly is safe")
}

// landed returns the pending write that landed, if any.
func landed[S, C any](s *Service, ctx context.Context, w writer[S, C], retry RetryPolicy, pending []*C) (*C, error) {
	if len(pending) == 0 {
		return nil, nil
	}
	// Learning a write's outcome is part of committing.
	defer CallStatsFrom(ctx).Since(PhaseCommit, time.Now())
	for _, c := range pending {
		ok, err := w.landed(ctx, c)
		// The call's answer hangs on this read, and a read is safe to repeat: outlast a
		// throttling burst (beyond the SDK's own retries) before giving up.
		for try := 0; err != nil && try < retry.CheckRetries; try++ {
			if serr := Sleep(ctx, retry.CheckBase<<try); serr != nil {
				break
			}
			ok, err = w.landed(ctx, c)
		}
		audit := w.audit(c)
		if err != nil {
			// %v: whatever the read's error, the write's outcome is unknown, not "throttled".
			return nil, fmt.Errorf("check %s write %s: outcome unknown: %v", w.kind, audit.ID, err)
		}
		if ok {
			s.logger().InfoContext(ctx, w.kind+" write had landed; answering with it", append(slices.Clone(w.logAttrs), "audit_id", audit.ID)...)
			return c, nil
		}
	}
	return nil, nil
}

// Sleep waits d, or until ctx ends (then it returns ctx's error). It is the one wait of the
// service's retries: the commit loop's and the adapters' own (the audit head's, the bus's).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Pause sleeps the full-jitter wait after the n-th lost write (Wait(n)), or until ctx ends.
func (p RetryPolicy) Pause(ctx context.Context, n int) error {
	return Sleep(ctx, p.Wait(n))
}
