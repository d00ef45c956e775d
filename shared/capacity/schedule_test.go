package capacity_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// fakeScheduler records the schedules the service creates and deletes.
type fakeScheduler struct {
	mu      sync.Mutex
	created []string
	deleted []string
	live    map[string]capacity.ScheduledReclaim
}

func (f *fakeScheduler) Create(_ context.Context, sr capacity.ScheduledReclaim) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, sr.ID)
	f.live[sr.ID] = sr
	return nil
}

func (f *fakeScheduler) Delete(_ context.Context, sr capacity.ScheduledReclaim) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, sr.ID)
	delete(f.live, sr.ID)
	return nil
}

func (f *fakeScheduler) Live() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id := range f.live {
		out = append(out, id)
	}
	return out
}

// beforeCreate runs a function before the first CreateScheduled: a concurrent write.
type beforeCreate struct {
	*dynamo.Store
	once func()
	done atomic.Bool
}

func (b *beforeCreate) CreateScheduled(ctx context.Context, c capacity.ScheduleCommit) error {
	if !b.done.Swap(true) && b.once != nil {
		b.once()
	}
	return b.Store.CreateScheduled(ctx, c)
}

// schedWorld is world plus r2 (u3 only, term [t0, t0+48h)), a fake scheduler and a clock.
func schedWorld(t *testing.T) (*dynamotest.Env, *capacity.Service, *fakeScheduler, *time.Time) {
	t.Helper()
	env, svc := world(t)
	r2 := capacity.Reservation{
		ID: "r2", NodeID: "n1", ReservedUnitIDs: []string{"u3"}, ReleasedUnitIDs: []string{},
		StartsAt: t0, EndsAt: ptr(t0.Add(48 * time.Hour)), Status: capacity.StatusActive, TopologyGen: 1, Version: 1,
	}
	if err := env.Store.Put(context.Background(), dynamo.Seed{Reservations: []capacity.Reservation{r2}}); err != nil {
		t.Fatal(err)
	}
	clock := t0.Add(time.Hour)
	fs := &fakeScheduler{live: map[string]capacity.ScheduledReclaim{}}
	svc.Now = func() time.Time { return clock }
	svc.Scheduler, svc.Schedules, svc.CreatorKeys = fs, env.Store, env.Store
	putKeys(t, env, keyOf(owner), keyOf(audi), keyOf(opCap))
	return env, svc, fs, &clock
}

// scheduleU1 schedules the owner's reclaim of u1 an hour after the clock, and returns its id.
func scheduleU1(t *testing.T, svc *capacity.Service, clock *time.Time) string {
	t.Helper()
	res, err := svc.ScheduleReclaim(context.Background(), owner, reclaim("u1"), clock.Add(time.Hour), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Scheduled.ID
}

// firingRefusedAsCancelled fires the cancelled scheduled reclaim id of r1 and checks that it
// is refused as cancelled, and that r1 and the scheduled reclaim are unchanged.
func firingRefusedAsCancelled(t *testing.T, env *dynamotest.Env, svc *capacity.Service, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeScheduledReclaimCancelled {
		t.Fatalf("fire after cancel: %v", err)
	}
	st, _ := env.Store.LoadNode(ctx, "n1", "")
	if r := st.Reservation("r1"); r.Version != 1 {
		t.Errorf("r1 changed (the firing's reclaim landed): %+v", r)
	}
	if sr, _ := env.Store.GetScheduled(ctx, "n1", id); sr.State != capacity.ScheduledCancelled {
		t.Errorf("state = %s", sr.State)
	}
}

// opCap is an operator key that may reclaim: it may schedule on any reservation.
var opCap = capacity.Principal{KeyID: "k-opcap", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermCapacity}}

// keyOf is the stored key a principal authenticated with.
func keyOf(p capacity.Principal) capacity.APIKey {
	return capacity.APIKey{KeyID: p.KeyID, Hash: capacity.HashKeySecret("secret-of-" + p.KeyID), OrgID: p.OrgID,
		Permissions: p.Permissions, Operator: p.Operator, ExpiresAt: p.ExpiresAt}
}

func putKeys(t *testing.T, env *dynamotest.Env, keys ...capacity.APIKey) {
	t.Helper()
	if err := (&dynamo.Keys{Client: env.Store.Client, Table: env.Store.KeysTable}).Put(context.Background(), keys...); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestScheduleReclaimChecks(t *testing.T) {
	hour := t0.Add(time.Hour) // the clock
	for _, tc := range []struct {
		name string
		p    capacity.Principal
		req  capacity.CapacityRequest
		at   time.Time
		want capacity.Code // "" = scheduled
	}{
		{"in an hour", owner, reclaim("u1"), hour.Add(time.Hour), ""},
		{"a year ahead", owner, reclaim("u1"), hour.Add(365 * 24 * time.Hour), ""},
		{"now", owner, reclaim("u1"), hour, capacity.CodeInvalidRequest},
		{"past", owner, reclaim("u1"), hour.Add(-time.Minute), capacity.CodeInvalidRequest},
		{"over a year ahead", owner, reclaim("u1"), hour.Add(365*24*time.Hour + time.Second), capacity.CodeInvalidRequest},
		{"after the term", owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r2", UnitIDs: []string{"u3"}}, t0.Add(48 * time.Hour), capacity.CodeInvalidRequest},
		{"inside the term", owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r2", UnitIDs: []string{"u3"}}, t0.Add(47 * time.Hour), ""},
		{"units not reserved (as a dry run now)", owner, reclaim("u3"), hour.Add(time.Hour), capacity.CodeUnitsNotReserved},
		{"audience", audi, reclaim("u1"), hour.Add(time.Hour), capacity.CodeForbidden},
		{"no such reservation", owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "rx", UnitIDs: []string{"u1"}}, hour.Add(time.Hour), capacity.CodeNotFound},
		{"no permission", sched, reclaim("u1"), hour.Add(time.Hour), capacity.CodeNotFound},
		{"dry run", owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, DryRun: true}, hour.Add(time.Hour), capacity.CodeInvalidRequest},
		// The reclaim runs as the key: not after the key has expired.
		{"before the key expires", expiring(hour.Add(2 * time.Hour)), reclaim("u1"), hour.Add(2*time.Hour - time.Second), ""},
		{"when the key expires", expiring(hour.Add(2 * time.Hour)), reclaim("u1"), hour.Add(2 * time.Hour), capacity.CodeInvalidRequest},
		{"months after the key expires", expiring(hour.Add(30 * 24 * time.Hour)), reclaim("u1"), hour.Add(200 * 24 * time.Hour), capacity.CodeInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, svc, fs, _ := schedWorld(t)
			ctx := context.Background()
			res, err := svc.ScheduleReclaim(ctx, tc.p, tc.req, tc.at, capacity.RequestMeta{})
			if tc.want != "" {
				if capacity.ErrorCode(err) != tc.want {
					t.Fatalf("err = %v, want %s", err, tc.want)
				}
				if len(fs.created) != 0 {
					t.Errorf("schedules created: %v", fs.created)
				}
				st, _ := env.Store.LoadNode(ctx, "n1", "")
				if r := st.Reservation("r1"); r.Version != 1 || !slices.Equal(r.ReleasedUnitIDs, []string{"u1", "u2"}) {
					t.Errorf("reservation changed: %+v", r)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sr := res.Scheduled
			if sr.State != capacity.ScheduledPending || !sr.At.Equal(tc.at) || sr.CreatorOrgID != "owner" || !slices.Equal(fs.created, []string{sr.ID}) {
				t.Errorf("scheduled = %+v, created %v", sr, fs.created)
			}
			got, err := svc.GetScheduledReclaim(ctx, owner, "n1", tc.req.ReservationID, sr.ID)
			if err != nil || got.ID != sr.ID || got.State != capacity.ScheduledPending {
				t.Errorf("get = %+v, %v", got, err)
			}
			// The reclaim itself waits for its time.
			st, _ := env.Store.LoadNode(ctx, "n1", "")
			if r := st.Reservation(tc.req.ReservationID); r.Version != 1 {
				t.Errorf("reservation changed at scheduling: %+v", r)
			}
		})
	}
}

// expiring is the owner's key with an expiry.
func expiring(at time.Time) capacity.Principal {
	p := owner
	p.ExpiresAt = &at
	return p
}

func TestScheduleReclaimIdempotencyKey(t *testing.T) {
	_, svc, fs, clock := schedWorld(t)
	ctx := context.Background()
	req := reclaim("u1", "u2")
	req.IdempotencyKey = "k1"
	at := clock.Add(time.Hour)
	first, err := svc.ScheduleReclaim(ctx, owner, req, at, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	req.UnitIDs = []string{"u2", "u1"} // a set: the same request
	again, err := svc.ScheduleReclaim(ctx, owner, req, at, capacity.RequestMeta{})
	if err != nil || !again.Replayed || again.Scheduled.ID != first.Scheduled.ID {
		t.Fatalf("replay = %+v, %v; first %s", again, err, first.Scheduled.ID)
	}
	if _, err := svc.ScheduleReclaim(ctx, owner, req, at.Add(time.Minute), capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeIdempotencyKeyReused {
		t.Fatalf("another at under the key: %v", err)
	}
	if len(fs.created) != 1 {
		t.Errorf("schedules created: %v", fs.created)
	}
}

func TestScheduleReclaimConflictDeletesTheSchedule(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	ctx := context.Background()
	other := *svc
	other.Scheduler = nil
	svc.Schedules = &beforeCreate{Store: env.Store, once: func() {
		// A reclaim lands between the read and the write: the reservation's version moves.
		if _, err := other.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
			t.Errorf("concurrent reclaim: %v", err)
		}
	}}
	id := scheduleU1(t, svc, clock)
	if len(fs.created) != 2 || !slices.Equal(fs.deleted, fs.created[:1]) || !slices.Equal(fs.Live(), []string{id}) {
		t.Errorf("created %v, deleted %v, live %v; answer %s", fs.created, fs.deleted, fs.Live(), id)
	}
	if _, err := env.Store.GetScheduled(ctx, "n1", fs.created[0]); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("the lost round's scheduled reclaim: %v", err)
	}
}

func TestFireScheduledReclaim(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	ctx := context.Background()
	id := scheduleU1(t, svc, clock)
	*clock = clock.Add(time.Hour)
	fired, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-1"})
	if err != nil || !slices.Equal(fired.Terminated, []string{"s1"}) || fired.ReclaimID == "" {
		t.Fatalf("fire = %+v, %v", fired, err)
	}
	sr, _ := env.Store.GetScheduled(ctx, "n1", id)
	if sr.State != capacity.ScheduledCompleted || sr.ReclaimID != fired.ReclaimID || sr.FiredAt == nil {
		t.Errorf("after fire: %+v", sr)
	}
	// The schedule puts the event again: the same answer, nothing new.
	again, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-2"})
	if err != nil || !again.Replayed || again.ReclaimID != fired.ReclaimID {
		t.Fatalf("replayed fire = %+v, %v", again, err)
	}
	// Fired: a cancel is refused and deletes nothing.
	if _, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", id, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeScheduledReclaimFired {
		t.Fatalf("cancel after fire: %v", err)
	}
	if len(fs.deleted) != 0 {
		t.Errorf("deleted %v", fs.deleted)
	}
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", "srcl_nope", capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("unknown: %v", err)
	}
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r2", id, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("another reservation's: %v", err)
	}
}

func TestCancelBeforeFire(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	ctx := context.Background()
	id := scheduleU1(t, svc, clock)
	if _, err := svc.CancelScheduledReclaim(ctx, audi, "n1", "r1", id, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeForbidden {
		t.Fatalf("audience cancel: %v", err)
	}
	c, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", id, capacity.RequestMeta{})
	if err != nil || c.State != capacity.ScheduledCancelled || c.CancelledAt == nil {
		t.Fatalf("cancel = %+v, %v", c, err)
	}
	if !slices.Equal(fs.deleted, []string{id}) {
		t.Errorf("deleted %v", fs.deleted)
	}
	if c2, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", id, capacity.RequestMeta{}); err != nil || c2.State != capacity.ScheduledCancelled {
		t.Errorf("cancel again = %+v, %v", c2, err)
	}
	// A schedule that fires anyway (its delete lost) is refused and changes nothing.
	*clock = clock.Add(time.Hour)
	firingRefusedAsCancelled(t, env, svc, id)
}

func TestFireAfterTheTermIsRefused(t *testing.T) {
	env, svc, _, clock := schedWorld(t)
	ctx := context.Background()
	req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r2", UnitIDs: []string{"u3"}}
	res, err := svc.ScheduleReclaim(ctx, owner, req, t0.Add(47*time.Hour), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	*clock = t0.Add(49 * time.Hour) // delivered late, after the term
	for range 2 {                   // a second delivery answers the same
		_, err = svc.FireScheduledReclaim(ctx, "n1", "r2", res.Scheduled.ID, capacity.RequestMeta{})
		if capacity.ErrorCode(err) != capacity.CodeOutsideTerm {
			t.Fatalf("fire: %v", err)
		}
	}
	sr, _ := env.Store.GetScheduled(ctx, "n1", res.Scheduled.ID)
	if sr.State != capacity.ScheduledRefused || sr.Code != capacity.CodeOutsideTerm || sr.Detail == "" || sr.FiredAt == nil {
		t.Errorf("after refusal: %+v", sr)
	}
	if _, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r2", sr.ID, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeScheduledReclaimFired {
		t.Errorf("cancel after refusal: %v", err)
	}
}

func TestScheduledReclaimVisibility(t *testing.T) {
	_, svc, _, clock := schedWorld(t)
	ctx := context.Background()
	id := scheduleU1(t, svc, clock)
	operator := capacity.Principal{KeyID: "k-op", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermRead}}
	reader := capacity.Principal{KeyID: "k-r", OrgID: "owner", Permissions: []string{capacity.PermRead}}
	for _, tc := range []struct {
		name string
		p    capacity.Principal
		ok   bool
	}{
		{"owner", owner, true}, {"operator", operator, true},
		{"audience", audi, false}, {"owner without capacity", reader, false}, {"scheduler", sched, false},
	} {
		_, err := svc.GetScheduledReclaim(ctx, tc.p, "n1", "r1", id)
		if tc.ok != (err == nil) || !tc.ok && capacity.ErrorMessage(err) != "reservation not found" {
			t.Errorf("get as %s: %v", tc.name, err)
		}
		// The reservation's list: the same rule.
		page, err := svc.ListScheduledReclaims(ctx, tc.p, "n1", "r1", capacity.PageRequest{})
		if tc.ok != (err == nil) || !tc.ok && capacity.ErrorMessage(err) != "reservation not found" || tc.ok && len(page.Scheduled) != 1 {
			t.Errorf("list as %s: %+v, %v", tc.name, page, err)
		}
	}
}

func TestSchedulingUnavailable(t *testing.T) {
	_, svc := world(t)
	ctx := context.Background()
	_, err := svc.ScheduleReclaim(ctx, owner, reclaim("u1"), t0.Add(5*time.Hour), capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeSchedulingUnavailable {
		t.Fatalf("err = %v", err)
	}
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", "srcl_1", capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeSchedulingUnavailable {
		t.Fatalf("fire without a store: %v", err)
	}
}

// The firing function has the store but no scheduler: it can fire, but not schedule or cancel.
func TestFiringNeedsNoScheduler(t *testing.T) {
	env, svc, _, clock := schedWorld(t)
	ctx := context.Background()
	id := scheduleU1(t, svc, clock)
	*clock = clock.Add(time.Hour)
	firer := &capacity.Service{Store: env.Store, Schedules: env.Store, CreatorKeys: env.Store, Now: svc.Now, Logger: quiet}
	if _, err := firer.CancelScheduledReclaim(ctx, owner, "n1", "r1", id, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeSchedulingUnavailable {
		t.Errorf("cancel without a scheduler: %v", err)
	}
	if fired, err := firer.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{}); err != nil || len(fired.Terminated) != 1 {
		t.Fatalf("fire = %+v, %v", fired, err)
	}
}

// cancelFirst runs a cancel before the first commit: it lands between the firing's read of
// the scheduled reclaim and the firing's commit.
type cancelFirst struct {
	capacity.Store
	once func()
	done atomic.Bool
}

func (c *cancelFirst) Commit(ctx context.Context, cm capacity.Commit) error {
	if !c.done.Swap(true) {
		c.once()
	}
	return c.Store.Commit(ctx, cm)
}

func TestCancelRacingAFiringWins(t *testing.T) {
	env, svc, _, clock := schedWorld(t)
	ctx := context.Background()
	id := scheduleU1(t, svc, clock)
	*clock = clock.Add(time.Hour)
	svc.Store = &cancelFirst{Store: env.Store, once: func() {
		if _, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", id, capacity.RequestMeta{}); err != nil {
			t.Errorf("cancel: %v", err)
		}
	}}
	firingRefusedAsCancelled(t, env, svc, id)
}

// failingScheduler refuses every Create as AWS does when it keeps throttling.
type failingScheduler struct{ fakeScheduler }

func (f *failingScheduler) Create(context.Context, capacity.ScheduledReclaim) error {
	return capacity.ErrThrottled
}

// lostAnswer writes the scheduled reclaim, then reports the outcome unknown (a timeout after
// the write landed).
type lostAnswer struct{ *dynamo.Store }

func (l lostAnswer) CreateScheduled(ctx context.Context, c capacity.ScheduleCommit) error {
	if err := l.Store.CreateScheduled(ctx, c); err != nil {
		return err
	}
	return capacity.ErrAmbiguous
}

func TestScheduleReclaimFaults(t *testing.T) {
	t.Run("scheduler throttled: nothing written", func(t *testing.T) {
		env, svc, _, clock := schedWorld(t)
		svc.Scheduler = &failingScheduler{}
		_, err := svc.ScheduleReclaim(context.Background(), owner, reclaim("u1"), clock.Add(time.Hour), capacity.RequestMeta{})
		if capacity.ErrorCode(err) != capacity.CodeThrottled {
			t.Fatalf("err = %v", err)
		}
		for _, it := range env.Items(t, env.Store.Table) {
			if sk, ok := it["sk"].(*types.AttributeValueMemberS); ok && sk.Value == "SCHED" {
				t.Errorf("scheduled reclaim written: %v", it)
			}
		}
	})
	t.Run("answer lost after the write: the write counts", func(t *testing.T) {
		env, svc, fs, clock := schedWorld(t)
		svc.Schedules = lostAnswer{env.Store}
		res, err := svc.ScheduleReclaim(context.Background(), owner, reclaim("u1"), clock.Add(time.Hour), capacity.RequestMeta{})
		if err != nil {
			t.Fatal(err)
		}
		if len(fs.deleted) != 0 || !slices.Equal(fs.Live(), []string{res.Scheduled.ID}) {
			t.Errorf("deleted %v, live %v", fs.deleted, fs.Live())
		}
	})
}

// scheduledAudits returns the outcomes of the audit records of a scheduled reclaim's firing
// (action reclaim, via schedule, naming the scheduled reclaim).
func scheduledAudits(t *testing.T, env *dynamotest.Env, id string) []string {
	t.Helper()
	var out []string
	for _, it := range env.Items(t, env.Store.AuditTable) {
		if attrString(it["Action"]) == capacity.ActionReclaim && attrString(it["via"]) == capacity.ViaSchedule && attrString(it["ReclaimID"]) == id {
			out = append(out, attrString(it["Outcome"]))
		}
	}
	return out
}

// TestFiringChecksTheCreatorKey: a scheduled reclaim runs as the key that scheduled it only
// while that key could still make the call: revoked, expired, gone, or without what the
// reclaim was created with, the firing is refused (creator_key_invalid) and audited, the
// scheduled reclaim ends refused with the reason, and nothing is reclaimed.
func TestFiringChecksTheCreatorKey(t *testing.T) {
	hour := t0.Add(time.Hour) // the clock when scheduling
	firing := hour.Add(time.Hour)
	for _, tc := range []struct {
		name    string
		creator capacity.Principal
		key     func(k *capacity.APIKey) // the key as stored at the firing; nil: gone
		want    string                   // in the refusal's detail; "" = fires
	}{
		{"key as it was", owner, func(*capacity.APIKey) {}, ""},
		{"operator key still operator", opCap, func(*capacity.APIKey) {}, ""},
		{"key expiring after the firing", owner, func(k *capacity.APIKey) { k.ExpiresAt = ptr(firing.Add(time.Second)) }, ""},
		{"revoked", owner, func(k *capacity.APIKey) { k.Revoked, k.RevokedAt = true, ptr(hour.Add(time.Minute)) }, "was revoked at"},
		{"expired", owner, func(k *capacity.APIKey) { k.ExpiresAt = ptr(firing.Add(-time.Second)) }, "expired at"},
		{"expired at the firing", owner, func(k *capacity.APIKey) { k.ExpiresAt = ptr(firing) }, "expired at"},
		{"gone", owner, nil, "no longer exists"},
		{"without reservation.capacity", owner, func(k *capacity.APIKey) { k.Permissions = []string{capacity.PermRead} }, "no longer holds reservation.capacity"},
		{"operator key no longer operator", opCap, func(k *capacity.APIKey) { k.Operator = false }, "no longer an operator key"},
		{"another org's key under the id", owner, func(k *capacity.APIKey) { k.OrgID = "aud" }, "belongs to another org"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, svc, _, clock := schedWorld(t)
			ctx := context.Background()
			res, err := svc.ScheduleReclaim(ctx, tc.creator, reclaim("u1"), firing, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			id := res.Scheduled.ID
			svc.CreatorKeys = keyReader(func(ctx context.Context, keyID string) (*capacity.APIKey, error) {
				if tc.key == nil {
					return env.Store.KeyByID(ctx, "k-nobody") // the store's answer for a key it does not hold
				}
				k := keyOf(tc.creator)
				tc.key(&k)
				return &k, nil
			})
			*clock = firing
			for range 2 { // a second delivery answers the same
				fired, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-1"})
				if tc.want == "" {
					if err != nil || len(fired.Terminated) != 1 {
						t.Fatalf("fire = %+v, %v", fired, err)
					}
					continue
				}
				if capacity.ErrorCode(err) != capacity.CodeCreatorKeyInvalid || !strings.Contains(capacity.ErrorMessage(err), tc.want) {
					t.Fatalf("fire: %v, want creator_key_invalid saying %q", err, tc.want)
				}
			}
			sr, _ := env.Store.GetScheduled(ctx, "n1", id)
			st, _ := env.Store.LoadNode(ctx, "n1", "")
			if tc.want == "" {
				if sr.State != capacity.ScheduledCompleted {
					t.Errorf("state = %s", sr.State)
				}
				return
			}
			if sr.State != capacity.ScheduledRefused || sr.Code != capacity.CodeCreatorKeyInvalid || !strings.Contains(sr.Detail, tc.want) || sr.FiredAt == nil {
				t.Errorf("after refusal: %+v", sr)
			}
			if r := st.Reservation("r1"); r.Version != 1 || !slices.Equal(r.ReleasedUnitIDs, []string{"u1", "u2"}) {
				t.Errorf("reservation changed: %+v", r)
			}
			if got := scheduledAudits(t, env, id); !slices.Equal(got, []string{string(capacity.CodeCreatorKeyInvalid)}) {
				t.Errorf("audit outcomes of the firing %v, want one creator_key_invalid", got)
			}
		})
	}
}

type keyReader func(ctx context.Context, keyID string) (*capacity.APIKey, error)

func (f keyReader) KeyByID(ctx context.Context, keyID string) (*capacity.APIKey, error) {
	return f(ctx, keyID)
}

// TestFiringReadsTheStoredKey: the check reads the key store itself (GetItem on the keys
// table), so a revoke through key management refuses the firing; a key store that cannot be
// read fails the firing as transient (retried) and leaves it scheduled.
func TestFiringReadsTheStoredKey(t *testing.T) {
	env, svc, id := scheduledDue(t)
	ctx := context.Background()
	svc.CreatorKeys = keyReader(func(context.Context, string) (*capacity.APIKey, error) { return nil, capacity.ErrThrottled })
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeThrottled {
		t.Fatalf("fire with the key unreadable: %v, want throttled", err)
	}
	if sr, _ := env.Store.GetScheduled(ctx, "n1", id); sr.State != capacity.ScheduledPending {
		t.Fatalf("state = %s after a transient failure", sr.State)
	}
	svc.CreatorKeys = env.Store
	svc.Keys = env.Store
	if _, err := svc.RevokeKey(ctx, op, capacity.KeyRevocation{KeyID: owner.KeyID}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeCreatorKeyInvalid {
		t.Fatalf("fire after the revoke: %v", err)
	}
}

// TestFiringBeforeItsTime: a firing more than FiringSkew before at did not come from the
// schedule: it is refused and audited, and the scheduled reclaim stays scheduled, so that the
// real firing still runs.
func TestFiringBeforeItsTime(t *testing.T) {
	for _, tc := range []struct {
		name  string
		early time.Duration // how long before at the firing comes
		want  capacity.Code
	}{
		{"a day early", 24 * time.Hour, capacity.CodeScheduledReclaimNotDue},
		{"just beyond the skew", capacity.FiringSkew + time.Second, capacity.CodeScheduledReclaimNotDue},
		{"at the skew", capacity.FiringSkew, ""},
		{"on time", 0, ""},
		{"late", -time.Hour, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, svc, _, clock := schedWorld(t)
			ctx := context.Background()
			at := clock.Add(25 * time.Hour)
			res, err := svc.ScheduleReclaim(ctx, owner, reclaim("u1"), at, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			id := res.Scheduled.ID
			*clock = at.Add(-tc.early)
			_, err = svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-early"})
			if capacity.ErrorCode(err) != tc.want && !(tc.want == "" && err == nil) {
				t.Fatalf("fire: %v, want %q", err, tc.want)
			}
			sr, _ := env.Store.GetScheduled(ctx, "n1", id)
			if tc.want == "" {
				if sr.State != capacity.ScheduledCompleted {
					t.Errorf("state = %s", sr.State)
				}
				return
			}
			if sr.State != capacity.ScheduledPending {
				t.Errorf("state = %s after an early firing, want still scheduled", sr.State)
			}
			if got := scheduledAudits(t, env, id); !slices.Equal(got, []string{string(tc.want)}) {
				t.Errorf("audit outcomes of the firing %v, want one %s", got, tc.want)
			}
			// The real firing, on time, runs.
			*clock = at
			if fired, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{}); err != nil || len(fired.Terminated) != 1 {
				t.Fatalf("firing on time = %+v, %v", fired, err)
			}
		})
	}
}

// TestListScheduledReclaims: a reservation's scheduled reclaims, in every state, in order of
// at, page by page (who may list them: TestScheduledReclaimVisibility); another reservation's
// are not listed and its cursor is refused.
func TestListScheduledReclaims(t *testing.T) {
	_, svc, _, clock := schedWorld(t)
	ctx := context.Background()
	schedule := func(req capacity.CapacityRequest, in time.Duration) string {
		t.Helper()
		res, err := svc.ScheduleReclaim(ctx, owner, req, clock.Add(in), capacity.RequestMeta{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Scheduled.ID
	}
	third := schedule(reclaim("u1"), 3*time.Hour)
	first := schedule(reclaim("u1"), time.Hour)
	second := schedule(reclaim("u1"), 2*time.Hour)
	other := schedule(capacity.CapacityRequest{NodeID: "n1", ReservationID: "r2", UnitIDs: []string{"u3"}}, time.Hour)
	if _, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", second, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}

	var ids []string
	var states []capacity.ScheduledState
	cursor, pages := "", 0
	for {
		page, err := svc.ListScheduledReclaims(ctx, owner, "n1", "r1", capacity.PageRequest{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, sr := range page.Scheduled {
			ids, states = append(ids, sr.ID), append(states, sr.State)
		}
		if cursor = page.NextCursor; cursor == "" || pages > 3 {
			break
		}
	}
	if !slices.Equal(ids, []string{first, second, third}) ||
		!slices.Equal(states, []capacity.ScheduledState{capacity.ScheduledPending, capacity.ScheduledCancelled, capacity.ScheduledPending}) {
		t.Errorf("listed %v %v, want %v in order of at", ids, states, []string{first, second, third})
	}
	if p, err := svc.ListScheduledReclaims(ctx, owner, "n1", "r2", capacity.PageRequest{}); err != nil || len(p.Scheduled) != 1 || p.Scheduled[0].ID != other {
		t.Errorf("r2's list = %+v, %v", p, err)
	}

	// A cursor of r2's list does not page r1's; garbage neither.
	r2page, err := svc.ListScheduledReclaims(ctx, owner, "n1", "r2", capacity.PageRequest{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{r2page.NextCursor, "garbage"} {
		if c == "" {
			continue // the emulator may end the page without a cursor
		}
		if _, err := svc.ListScheduledReclaims(ctx, owner, "n1", "r1", capacity.PageRequest{Cursor: c}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
			t.Errorf("cursor %q on r1: %v", c, err)
		}
	}

	if _, err := svc.ListScheduledReclaims(ctx, owner, "n1", "rx", capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("unknown reservation: %v", err)
	}
}

// scheduledItems counts the scheduled reclaims stored, by state.
func scheduledItems(t *testing.T, env *dynamotest.Env) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, it := range env.Items(t, env.Store.Table) {
		if sk, ok := it["sk"].(*types.AttributeValueMemberS); ok && sk.Value == "SCHED" {
			out[it["State"].(*types.AttributeValueMemberS).Value]++
		}
	}
	return out
}

func wantPending(t *testing.T, env *dynamotest.Env, org string, want int) {
	t.Helper()
	if n, err := env.Store.PendingScheduled(context.Background(), org); err != nil || n != want {
		t.Fatalf("pending scheduled reclaims of %s = %d, %v; want %d", org, n, err, want)
	}
}

// An org has at most MaxPendingScheduled pending scheduled reclaims: the next is refused with
// scheduled_reclaim_limit and writes nothing (its schedule is deleted); another org is not
// held back; and each way one ends (cancel, firing, refused firing) frees its slot.
func TestPendingScheduledReclaimsAreCappedPerOrg(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	svc.MaxPendingScheduled = 3
	ctx := context.Background()
	at := clock.Add(time.Hour)
	schedule := func(p capacity.Principal, at time.Time) string {
		t.Helper()
		res, err := svc.ScheduleReclaim(ctx, p, reclaim("u1"), at, capacity.RequestMeta{})
		if err != nil {
			t.Fatalf("schedule as %s: %v", p.KeyID, err)
		}
		return res.Scheduled.ID
	}
	refused := func(at time.Time) {
		t.Helper()
		before := scheduledItems(t, env)
		_, err := svc.ScheduleReclaim(ctx, owner, reclaim("u1"), at, capacity.RequestMeta{})
		if capacity.ErrorCode(err) != capacity.CodeScheduledReclaimLimit || !strings.Contains(err.Error(), "3 pending scheduled reclaims") {
			t.Fatalf("schedule beyond the cap: %v, want %s", err, capacity.CodeScheduledReclaimLimit)
		}
		if after := scheduledItems(t, env); !maps.Equal(before, after) {
			t.Errorf("scheduled reclaims %v after a refusal, were %v", after, before)
		}
		if last := fs.created[len(fs.created)-1]; !slices.Contains(fs.deleted, last) {
			t.Errorf("the refused one's schedule %s was not deleted", last)
		}
		wantPending(t, env, "owner", 3)
	}
	ids := []string{schedule(owner, at), schedule(owner, at), schedule(owner2, at)}
	wantPending(t, env, "owner", 3)
	refused(at)
	// The cap is per org: another org still schedules.
	schedule(opCap, at)
	wantPending(t, env, "platform", 1)

	// A cancel frees a slot, once (a second cancel answers the same and frees nothing more).
	for range 2 {
		if _, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", ids[0], capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
		wantPending(t, env, "owner", 2)
	}
	schedule(owner, at.Add(time.Minute))
	refused(at)

	// So does a firing, in the reclaim's own transaction (a repeated firing frees nothing).
	*clock = at
	for range 2 {
		if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", ids[1], capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
		wantPending(t, env, "owner", 2)
	}
	schedule(owner, at.Add(time.Hour))
	refused(at.Add(time.Hour))

	// And a refused firing: the key that scheduled ids[2] was revoked. (Pending now: two of
	// owner, one of platform.)
	svc.CreatorKeys = keyReader(func(ctx context.Context, keyID string) (*capacity.APIKey, error) {
		k := keyOf(owner2)
		k.Revoked = keyID == owner2.KeyID
		return &k, nil
	})
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", ids[2], capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeCreatorKeyInvalid {
		t.Fatalf("fire with a revoked creator key: %v", err)
	}
	wantPending(t, env, "owner", 2)
	if got := scheduledItems(t, env); got["scheduled"] != 3 || got["cancelled"] != 1 || got["completed"] != 1 || got["refused"] != 1 {
		t.Errorf("scheduled reclaims by state: %v", got)
	}
}

// The cap holds when an org's calls race: of 8 concurrent schedules under a cap of 3, exactly
// 3 land and the others are refused with scheduled_reclaim_limit.
func TestPendingScheduledCapHoldsUnderConcurrency(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	svc.MaxPendingScheduled, svc.Attempts = 3, 50
	ctx := context.Background()
	codes := make([]capacity.Code, 8)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() {
			_, err := svc.ScheduleReclaim(ctx, owner, reclaim("u1"), clock.Add(time.Duration(i+1)*time.Minute), capacity.RequestMeta{})
			codes[i] = "ok"
			if err != nil {
				codes[i] = capacity.ErrorCode(err)
			}
		})
	}
	wg.Wait()
	count := map[capacity.Code]int{}
	for _, c := range codes {
		count[c]++
	}
	if count["ok"] != 3 || count[capacity.CodeScheduledReclaimLimit] != 5 {
		t.Errorf("outcomes %v, want 3 ok and 5 %s", count, capacity.CodeScheduledReclaimLimit)
	}
	wantPending(t, env, "owner", 3)
	if got := scheduledItems(t, env); got["scheduled"] != 3 || len(got) != 1 {
		t.Errorf("scheduled reclaims by state: %v", got)
	}
	if live := fs.Live(); len(live) != 3 {
		t.Errorf("live schedules %v, want 3", live)
	}
}

// duplicateBetween runs once() just before the second read of a scheduled reclaim: a firing
// reads it first on arrival, then again inside its decision, after it has read the node.
type duplicateBetween struct {
	capacity.ScheduleStore
	reads atomic.Int32
	once  func()
}

func (d *duplicateBetween) GetScheduled(ctx context.Context, nodeID, id string) (*capacity.ScheduledReclaim, error) {
	if d.reads.Add(1) == 2 {
		d.once()
	}
	return d.ScheduleStore.GetScheduled(ctx, nodeID, id)
}

// TestDuplicateFiringRacingTheFirstAnswersIt: the schedule's event delivered twice at once (at
// least once delivery, an SQS redelivery), the second copy reading the node before the first
// commits: the second answers the first's reclaim, as a later repeat does, not a refusal
// that the scheduled reclaim "has fired" (which the event path publishes as Capacity Reclaim
// Refused for a scheduled reclaim that completed). Found by the chaos run.
func TestDuplicateFiringRacingTheFirstAnswersIt(t *testing.T) {
	env, svc, id := scheduledDue(t)
	ctx := context.Background()
	var err error
	var first *capacity.CapacityResult
	other := *svc // the first copy, on the store as it is
	svc.Schedules = &duplicateBetween{ScheduleStore: env.Store, once: func() {
		if first, err = other.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-1"}); err != nil {
			t.Errorf("first firing: %v", err)
		}
	}}
	second, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-2"})
	if err != nil || first == nil || second.ReclaimID != first.ReclaimID || !slices.Equal(second.Terminated, first.Terminated) {
		t.Fatalf("second firing = %+v, %v; the first answered %+v", second, err, first)
	}
	if sr, _ := env.Store.GetScheduled(ctx, "n1", id); sr.State != capacity.ScheduledCompleted || sr.ReclaimID != first.ReclaimID {
		t.Errorf("scheduled reclaim after both: %+v", sr)
	}
}

// scheduledDue schedules the owner's reclaim of u1 an hour ahead and moves the clock to it.
func scheduledDue(t *testing.T) (*dynamotest.Env, *capacity.Service, string) {
	t.Helper()
	env, svc, _, clock := schedWorld(t)
	res, err := svc.ScheduleReclaim(context.Background(), owner, reclaim("u1"), clock.Add(time.Hour), capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	*clock = clock.Add(time.Hour)
	return env, svc, res.Scheduled.ID
}

// TestThrottledFiringRunsAgain: a firing whose reclaim is throttled in every round answers
// throttled (the event path retries it) and leaves the scheduled reclaim scheduled, not
// refused: the next firing runs the reclaim.
func TestThrottledFiringRunsAgain(t *testing.T) {
	env, svc, id := scheduledDue(t)
	ctx := context.Background()
	w := scripting(env, svc)
	w.script["Commit"] = every(throttledWrite)
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-1"}); capacity.ErrorCode(err) != capacity.CodeThrottled {
		t.Fatalf("firing under throttling: %v, want throttled", err)
	}
	if sr, _ := env.Store.GetScheduled(ctx, "n1", id); sr.State != capacity.ScheduledPending {
		t.Fatalf("after a throttled firing the scheduled reclaim is %s (%s), want still scheduled", sr.State, sr.Code)
	}
	w.script["Commit"] = nil
	fired, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-1"})
	if err != nil || !slices.Equal(fired.Terminated, []string{"s1"}) {
		t.Fatalf("the firing again = %+v, %v; want the reclaim of u1 (s1 evicted)", fired, err)
	}
	if sr, _ := env.Store.GetScheduled(ctx, "n1", id); sr.State != capacity.ScheduledCompleted || sr.ReclaimID != fired.ReclaimID {
		t.Errorf("after the firing again: %+v", sr)
	}
}
