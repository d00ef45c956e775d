package capacity_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// scriptedWrites is the store with the outcomes of its writes (and of its checks of writes of
// unknown outcome) scripted by method: each call takes the next outcome of its method's script;
// past the end, the call runs as it is.
type scriptedWrites struct {
	*dynamo.Store
	mu     sync.Mutex
	script map[string][]scripted
	calls  map[string]int
	// readsFail, if set, fails every read of the node (LoadNode) once a write was sent: the
	// reads after a write, as a throttling burst that outlasts the SDK's retries.
	readsFail error
	wrote     bool
}

// scripted is one call's outcome: err, after the call ran (applied: a lost answer) or without
// it.
type scripted struct {
	err     error
	applied bool
}

var (
	lostRace       = scripted{err: capacity.ErrConflict}
	throttledWrite = scripted{err: capacity.ErrThrottled}
	unknownUnsent  = scripted{err: capacity.ErrAmbiguous}
	unknownLanded  = scripted{err: capacity.ErrAmbiguous, applied: true}
)

// every is a script longer than any call's budget.
func every(o scripted) []scripted { return slices.Repeat([]scripted{o}, 40) }

func (w *scriptedWrites) run(method string, call func() error) error {
	w.mu.Lock()
	w.calls[method]++
	w.wrote = w.wrote || !checks[method]
	q := w.script[method]
	var o *scripted
	if len(q) > 0 {
		o, w.script[method] = &q[0], q[1:]
	}
	w.mu.Unlock()
	switch {
	case o == nil:
		return call()
	case o.applied:
		if err := call(); err != nil {
			return err
		}
	}
	return o.err
}

// checks are the scripted methods that read: the others write.
var checks = map[string]bool{"Landed": true, "GetKey": true}

func (w *scriptedWrites) LoadNode(ctx context.Context, nodeID, scope string) (*capacity.NodeState, error) {
	w.mu.Lock()
	fail := w.wrote && w.readsFail != nil
	w.mu.Unlock()
	if fail {
		return nil, fmt.Errorf("query partition of node %s: %w", nodeID, w.readsFail)
	}
	return w.Store.LoadNode(ctx, nodeID, scope)
}

func (w *scriptedWrites) count(method string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls[method]
}

func (w *scriptedWrites) Commit(ctx context.Context, c capacity.Commit) error {
	return w.run("Commit", func() error { return w.Store.Commit(ctx, c) })
}

func (w *scriptedWrites) CommitOperator(ctx context.Context, c capacity.OperatorCommit) (capacity.AuditHead, error) {
	var head capacity.AuditHead
	err := w.run("CommitOperator", func() (err error) { head, err = w.Store.CommitOperator(ctx, c); return err })
	return head, err
}

func (w *scriptedWrites) CreateScheduled(ctx context.Context, c capacity.ScheduleCommit) error {
	return w.run("CreateScheduled", func() error { return w.Store.CreateScheduled(ctx, c) })
}

func (w *scriptedWrites) UpdateScheduled(ctx context.Context, from, to capacity.ScheduledReclaim, audit *capacity.AuditRecord) error {
	return w.run("UpdateScheduled", func() error { return w.Store.UpdateScheduled(ctx, from, to, audit) })
}

func (w *scriptedWrites) RedriveOperation(ctx context.Context, op capacity.Operation, audit capacity.AuditRecord, now time.Time) error {
	return w.run("RedriveOperation", func() error { return w.Store.RedriveOperation(ctx, op, audit, now) })
}

func (w *scriptedWrites) CreateKey(ctx context.Context, k capacity.APIKey, idem *capacity.IdempotencyRecord, audit capacity.AuditRecord) error {
	return w.run("CreateKey", func() error { return w.Store.CreateKey(ctx, k, idem, audit) })
}

func (w *scriptedWrites) RevokeKey(ctx context.Context, k capacity.APIKey, at time.Time, audit capacity.AuditRecord) error {
	return w.run("RevokeKey", func() error { return w.Store.RevokeKey(ctx, k, at, audit) })
}

func (w *scriptedWrites) Landed(ctx context.Context, c capacity.Commit) (bool, error) {
	var ok bool
	err := w.run("Landed", func() (err error) { ok, err = w.Store.Landed(ctx, c); return err })
	return ok, err
}

func (w *scriptedWrites) GetKey(ctx context.Context, keyID string) (*capacity.APIKey, error) {
	var k *capacity.APIKey
	err := w.run("GetKey", func() (err error) { k, err = w.Store.GetKey(ctx, keyID); return err })
	return k, err
}

// loopWrite is one of the service's writes, set up on the emulator with its store scripted.
type loopWrite struct {
	name   string
	method string // the store write it sends
	action string // the audit action of its record, one per write that landed
	// check is the read that tells whether a write of unknown outcome landed ("": not
	// scripted here).
	check string
	// detours: its losses are told real or not by what changed, and a scripted loss changes
	// nothing (see TestOnlyRealRacesSpendTheBudget), so every-conflict does not apply.
	detours bool
	// readsNode: its rounds read the node (LoadNode), which scriptedWrites.readsFail fails.
	readsNode bool
	// swept: the write is a reservation cancel's sweep, whose failures are logged, not answered.
	swept bool
	// setup makes the world the call runs in, and names what the call acts on (a scheduled
	// reclaim, an operation); the test then puts the scripted store under svc.
	setup func(t *testing.T) (env *dynamotest.Env, svc *capacity.Service, id string)
	call  func(ctx context.Context, svc *capacity.Service, id string) (any, error)
}

// scripting puts the store of env, scripted, under every store of svc.
func scripting(env *dynamotest.Env, svc *capacity.Service) *scriptedWrites {
	w := &scriptedWrites{Store: env.Store, script: map[string][]scripted{}, calls: map[string]int{}}
	svc.Store, svc.Keys = w, w
	if svc.Schedules != nil {
		svc.Schedules = w
	}
	return w
}

// The worlds the writes run in.
func inWorld(t *testing.T) (*dynamotest.Env, *capacity.Service, string) {
	env, svc := world(t)
	return env, svc, ""
}

func withSchedules(t *testing.T) (*dynamotest.Env, *capacity.Service, string) {
	env, svc, _, _ := schedWorld(t)
	return env, svc, ""
}

// withScheduled is schedWorld with a reclaim of u1 scheduled on r1 in an hour.
func withScheduled(t *testing.T) (*dynamotest.Env, *capacity.Service, string) {
	env, svc, _, clock := schedWorld(t)
	return env, svc, scheduleOn(t, svc, owner, "r1", "u1", clock.Add(time.Hour), 1)[0]
}

func withFailedOp(t *testing.T) (*dynamotest.Env, *capacity.Service, string) {
	env, svc, o, _ := failedOp(t)
	return env, svc, o.ID
}

func withKey(t *testing.T) (*dynamotest.Env, *capacity.Service, string) {
	env, svc := world(t)
	putKeys(t, env, capacity.APIKey{KeyID: "key-a", Hash: capacity.HashKeySecret("secret-a"), OrgID: "org-1", Permissions: []string{capacity.PermRead}})
	return env, svc, "key-a"
}

var cancelR1 = capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}

var loopWrites = []loopWrite{
	{name: "reclaim", readsNode: true, method: "Commit", action: capacity.ActionReclaim, check: "Landed", detours: true, setup: inWorld,
		call: func(ctx context.Context, svc *capacity.Service, _ string) (any, error) {
			return svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{})
		}},
	{name: "reservation cancel", readsNode: true, method: "CommitOperator", action: capacity.ActionReservationCancel, check: "Landed", setup: inWorld,
		call: func(ctx context.Context, svc *capacity.Service, _ string) (any, error) {
			return svc.CancelReservation(ctx, op, cancelR1, capacity.RequestMeta{})
		}},
	{name: "schedule reclaim", readsNode: true, method: "CreateScheduled", action: capacity.ActionScheduleReclaim, check: "Landed", setup: withSchedules,
		call: func(ctx context.Context, svc *capacity.Service, _ string) (any, error) {
			return svc.ScheduleReclaim(ctx, owner, reclaim("u1"), svc.Now().Add(time.Hour), capacity.RequestMeta{})
		}},
	{name: "scheduled reclaim cancel", readsNode: true, method: "UpdateScheduled", action: capacity.ActionCancelScheduledReclaim, check: "Landed", setup: withScheduled,
		call: func(ctx context.Context, svc *capacity.Service, id string) (any, error) {
			return svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", id, capacity.RequestMeta{})
		}},
	{name: "a reservation cancel's sweep", method: "UpdateScheduled", action: capacity.ActionCancelScheduledReclaim, check: "Landed", swept: true,
		setup: withScheduled,
		call: func(ctx context.Context, svc *capacity.Service, _ string) (any, error) {
			return svc.CancelReservation(ctx, op, cancelR1, capacity.RequestMeta{})
		}},
	{name: "re-drive", readsNode: true, method: "RedriveOperation", action: capacity.ActionRetry, check: "Landed", setup: withFailedOp,
		call: func(ctx context.Context, svc *capacity.Service, id string) (any, error) {
			return svc.Redrive(ctx, owner, "n1", "r1", id, capacity.RequestMeta{})
		}},
	{name: "key creation", method: "CreateKey", action: capacity.ActionKeyCreate, check: "GetKey", setup: inWorld,
		call: func(ctx context.Context, svc *capacity.Service, _ string) (any, error) {
			return svc.CreateKey(ctx, operator, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}}, capacity.RequestMeta{})
		}},
	{name: "key revocation", method: "RevokeKey", action: capacity.ActionKeyRevoke, setup: withKey,
		call: func(ctx context.Context, svc *capacity.Service, id string) (any, error) {
			return svc.RevokeKey(ctx, operator, capacity.KeyRevocation{KeyID: id}, capacity.RequestMeta{})
		}},
}

// TestEveryWriteGoesThroughOneLoop: every write of the service (capacity and operator calls,
// scheduling and its cancels, re-drives, keys) meets a lost race, throttling and a lost answer
// the same way: one budget of Service.Attempts rounds, a throttled write tried again and
// answered throttled only when every round was, a write of unknown outcome checked (the check
// itself outlasting failed reads) before deciding again and answered as unknown when it stays
// so, no round started within RetryPolicy.Margin of the deadline; and a write lands at most
// once.
func TestEveryWriteGoesThroughOneLoop(t *testing.T) {
	attempts := capacity.DefaultAttempts
	for _, tc := range []struct {
		name   string
		script []scripted // the write's
		checks []scripted // the check's, when the write has one scripted here
		// readsFail fails every read of the node after the first write (writes that read it).
		readsFail error
		// deadline, if set, is the call's (within RetryPolicy.Margin).
		deadline time.Duration
		writes   int           // the write sent this often
		landed   int           // and landed this often
		code     capacity.Code // the call's answer ("": none)
		unknown  bool          // the answer says the outcome is unknown
	}{
		{name: "lost every race", script: every(lostRace), writes: attempts, code: capacity.CodeConcurrentModification},
		{name: "throttled once", script: []scripted{throttledWrite}, writes: 2, landed: 1},
		{name: "throttled every round", script: every(throttledWrite), writes: attempts, code: capacity.CodeThrottled},
		{name: "outcome unknown, not applied", script: []scripted{unknownUnsent}, writes: 2, landed: 1},
		{name: "outcome unknown, applied", script: []scripted{unknownLanded}, writes: 1, landed: 1},
		{name: "outcome unknown, applied, its check throttled twice", script: []scripted{unknownLanded},
			checks: []scripted{throttledWrite, throttledWrite}, writes: 1, landed: 1},
		{name: "outcome unknown every round", script: every(unknownUnsent), writes: attempts, code: capacity.CodeInternal, unknown: true},
		// After a write of unknown outcome, neither a failed read nor a throttled last round
		// answers "throttled, nothing was applied": the write may have landed.
		{name: "outcome unknown, not applied, every read after it failed", script: []scripted{unknownUnsent},
			readsFail: capacity.ErrThrottled, writes: 1, code: capacity.CodeInternal, unknown: true},
		{name: "outcome unknown, applied, every read after it failed", script: []scripted{unknownLanded},
			readsFail: capacity.ErrThrottled, writes: 1, landed: 1},
		{name: "outcome unknown, then throttled to the last round", script: append([]scripted{unknownUnsent}, every(throttledWrite)...),
			writes: attempts, code: capacity.CodeInternal, unknown: true},
		{name: "lost a race near the deadline", script: every(lostRace), deadline: 300 * time.Millisecond, writes: 1,
			code: capacity.CodeConcurrentModification},
	} {
		for _, lw := range loopWrites {
			if lw.detours && tc.name == "lost every race" || tc.checks != nil && lw.check == "" || tc.readsFail != nil && !lw.readsNode {
				continue
			}
			t.Run(tc.name+"/"+lw.name, func(t *testing.T) {
				env, svc, id := lw.setup(t)
				w := scripting(env, svc)
				w.script[lw.method] = tc.script
				w.readsFail = tc.readsFail
				if tc.checks != nil {
					w.script[lw.check] = tc.checks
				}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				_, err := lw.call(ctx, svc, id)
				if n := w.count(lw.method); n != tc.writes {
					t.Errorf("%d writes sent, want %d", n, tc.writes)
				}
				if n := auditsOf(t, env, lw.action); n != tc.landed {
					t.Errorf("%d writes landed, want %d", n, tc.landed)
				}
				if lw.swept {
					if err != nil {
						t.Errorf("the reservation cancel: %v", err)
					}
					return
				}
				if code := capacity.ErrorCode(err); tc.code == "" && err != nil || tc.code != "" && code != tc.code {
					t.Errorf("err = %v (code %q), want code %q", err, code, tc.code)
				}
				if errors.Is(err, capacity.ErrAmbiguous) != tc.unknown {
					t.Errorf("err = %v; outcome unknown: %t, want %t", err, !tc.unknown, tc.unknown)
				}
			})
		}
	}
}

// A scheduled reclaim whose write's outcome is unknown, and which did not land, is sent again
// the same (its id, its schedule): at most one of the two can land, and no second schedule is
// made. It lands once, and only its schedule is live.
func TestScheduleWithAnUnknownOutcomeIsSentAgainTheSame(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	w := scripting(env, svc)
	w.script["CreateScheduled"] = []scripted{unknownUnsent}
	res, err := svc.ScheduleReclaim(context.Background(), owner, reclaim("u1"), clock.Add(time.Hour), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if w.count("CreateScheduled") != 2 || !slices.Equal(fs.created, []string{res.Scheduled.ID, res.Scheduled.ID}) || len(fs.deleted) != 0 {
		t.Errorf("%d writes; schedules created %v, deleted %v; want %s sent twice", w.count("CreateScheduled"), fs.created, fs.deleted, res.Scheduled.ID)
	}
	if !slices.Equal(fs.Live(), []string{res.Scheduled.ID}) {
		t.Errorf("live schedules %v, want %s", fs.Live(), res.Scheduled.ID)
	}
	if n := auditsOf(t, env, capacity.ActionScheduleReclaim); n != 1 {
		t.Errorf("%d scheduled, want 1", n)
	}
}

// A scheduled reclaim (under an Idempotency-Key) whose first write's outcome is unknown is
// sent again the same; when the first lands late, after its check said it had not, the
// repeat loses to it. The call answers the scheduled reclaim that landed, and its schedule is
// still live: the repeat's loss deletes no schedule the accepted scheduled reclaim needs, and
// it fires.
func TestScheduleRepeatLosingToTheFirstKeepsItsSchedule(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	w := scripting(env, svc)
	// The first write times out unapplied and its check finds nothing; the repeat then loses
	// to the first, which lands just before it.
	w.script["CreateScheduled"] = []scripted{unknownUnsent, {err: capacity.ErrConflict, applied: true}}
	w.script["Landed"] = []scripted{{}}
	ctx := context.Background()
	req := reclaim("u1")
	req.IdempotencyKey = "k-late"
	res, err := svc.ScheduleReclaim(ctx, owner, req, clock.Add(time.Hour), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Scheduled.ID
	if w.count("CreateScheduled") != 2 || !slices.Equal(fs.Live(), []string{id}) {
		t.Fatalf("%d writes; live schedules %v (deleted %v), want %s's live", w.count("CreateScheduled"), fs.Live(), fs.deleted, id)
	}
	if n := auditsOf(t, env, capacity.ActionScheduleReclaim); n != 1 {
		t.Errorf("%d scheduled, want 1", n)
	}
	// The schedule fires at its time, and the reclaim runs.
	*clock = clock.Add(time.Hour)
	if fired, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{}); err != nil || !slices.Equal(fired.Terminated, []string{"s1"}) {
		t.Fatalf("firing = %+v, %v", fired, err)
	}
}
