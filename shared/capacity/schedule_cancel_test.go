package capacity_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// cancelRecords counts the records on n1's changes chain that cancel the scheduled reclaim
// id, and checks that the chain verifies.
func cancelRecords(t *testing.T, svc *capacity.Service, id string) int {
	t.Helper()
	recs, rep := chainOf(t, svc, capacity.ChainChanges)
	if !rep.OK {
		t.Fatalf("changes chain: %+v", rep)
	}
	n := 0
	for _, r := range recs {
		if r.Action == capacity.ActionCancelScheduledReclaim && r.ReclaimID == id && r.Outcome == "ok" {
			n++
		}
	}
	return n
}

// scheduleOn schedules reclaims of unit on reservation r as p, an hour apart from at.
func scheduleOn(t *testing.T, svc *capacity.Service, p capacity.Principal, r, unit string, at time.Time, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		res, err := svc.ScheduleReclaim(context.Background(), p, capacity.CapacityRequest{NodeID: "n1", ReservationID: r, UnitIDs: []string{unit}},
			at.Add(time.Duration(i)*time.Hour), capacity.RequestMeta{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Scheduled.ID)
	}
	return ids
}

// Cancelling a reservation ends its pending scheduled reclaims: each is cancelled, with the
// reservation's cancel as its reason, leaves its org's pending count (exactly: one cancelled
// before stays counted once), has its schedule deleted and its cancel audited once on the
// node's changes chain. Those of another reservation stay. A repeat of the cancel changes
// nothing more, and a schedule that fires anyway is refused as cancelled.
func TestCancellingAReservationCancelsItsScheduledReclaims(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	ctx := context.Background()
	at := clock.Add(time.Hour)
	ours := scheduleOn(t, svc, owner, "r1", "u1", at, 2)
	ours = append(ours, scheduleOn(t, svc, opCap, "r1", "u2", at, 1)...)
	other := scheduleOn(t, svc, owner, "r2", "u3", at, 1)
	if _, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", ours[0], capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	wantPending(t, env, "owner", 2)
	wantPending(t, env, "platform", 1)

	for range 2 { // the cancel, then its repeat
		if _, err := svc.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1", Reason: "contract ended"}, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
		wantPending(t, env, "owner", 1) // r2's
		wantPending(t, env, "platform", 0)
		for i, id := range ours {
			sr, err := env.Store.GetScheduled(ctx, "n1", id)
			if err != nil {
				t.Fatal(err)
			}
			if sr.State != capacity.ScheduledCancelled || sr.CancelledAt == nil {
				t.Errorf("%s: %+v, want cancelled", id, sr)
			}
			if i > 0 && (sr.Code != capacity.CodeReservationNotActive || !strings.Contains(sr.Detail, "reservation r1 was cancelled: contract ended")) {
				t.Errorf("%s: code %q, detail %q; want why it was cancelled", id, sr.Code, sr.Detail)
			}
			if n := cancelRecords(t, svc, id); n != 1 {
				t.Errorf("%s: %d cancel records, want 1", id, n)
			}
		}
	}
	if sr, err := env.Store.GetScheduled(ctx, "n1", other[0]); err != nil || sr.State != capacity.ScheduledPending {
		t.Errorf("r2's scheduled reclaim: %+v, %v; want it pending", sr, err)
	}
	if live := fs.Live(); !slices.Equal(live, other) {
		t.Errorf("live schedules %v, want only r2's %v", live, other)
	}
	page, err := svc.ListScheduledReclaims(ctx, owner, "n1", "r1", capacity.PageRequest{})
	if err != nil || len(page.Scheduled) != 3 {
		t.Fatalf("list: %+v, %v", page, err)
	}
	for _, sr := range page.Scheduled {
		if sr.State != capacity.ScheduledCancelled {
			t.Errorf("listed %s as %s, want cancelled", sr.ID, sr.State)
		}
	}
	*clock = clock.Add(2 * time.Hour)
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", ours[1], capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeScheduledReclaimCancelled {
		t.Errorf("a firing after the cancel: %v, want scheduled_reclaim_cancelled", err)
	}
	wantPending(t, env, "owner", 1)
}

// One the sweep missed (here: a deployment without scheduled reclaims cancelled the
// reservation) ends when it fires: refused, reservation_not_active, off its org's count.
func TestFiringForACancelledReservationEndsRefused(t *testing.T) {
	env, svc, _, clock := schedWorld(t)
	ctx := context.Background()
	ids := scheduleOn(t, svc, owner, "r1", "u1", clock.Add(time.Hour), 1)
	blind := *svc
	blind.Schedules, blind.Scheduler = nil, nil
	if _, err := blind.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	wantPending(t, env, "owner", 1)
	*clock = clock.Add(time.Hour)
	if _, err := svc.FireScheduledReclaim(ctx, "n1", "r1", ids[0], capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeReservationNotActive {
		t.Fatalf("fire: %v, want reservation_not_active", err)
	}
	if sr, _ := env.Store.GetScheduled(ctx, "n1", ids[0]); sr.State != capacity.ScheduledRefused || sr.Code != capacity.CodeReservationNotActive {
		t.Errorf("after the firing: %+v, want refused", sr)
	}
	wantPending(t, env, "owner", 0)
}

// The sweep's writes meet transaction conflicts and answers lost after they landed (as on
// AWS): each scheduled reclaim is still cancelled exactly once (one record, its org's count
// down by one), within the cancel and at most one repeat of it.
func TestCancelSweepUnderFaults(t *testing.T) {
	inj := awsfault.New(7,
		awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.3},
		awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 0.3})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	plain := env.Clean()
	ctx := context.Background()
	if err := plain.Put(ctx, worldSeed()); err != nil {
		t.Fatal(err)
	}
	fs := &fakeScheduler{live: map[string]capacity.ScheduledReclaim{}}
	svc := &capacity.Service{Store: plain, Schedules: plain, Scheduler: fs, Now: func() time.Time { return t0.Add(time.Hour) }, Logger: quiet}
	ids := scheduleOn(t, svc, owner, "r1", "u1", t0.Add(2*time.Hour), 6)
	svc.Schedules = env.Store // only the sweep's reads and writes meet the faults
	cancel := capacity.ReservationChange{NodeID: "n1", ReservationID: "r1", Reason: "contract ended"}
	for try := 0; ; try++ {
		if _, err := svc.CancelReservation(ctx, op, cancel, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
		n, err := plain.PendingScheduled(ctx, "owner")
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if try == 1 {
			t.Fatalf("%d still pending after the cancel and a repeat", n)
		}
	}
	for _, f := range []awsfault.Fault{awsfault.TransactionConflict, awsfault.AmbiguousTimeout} {
		if inj.Count(f) == 0 {
			t.Errorf("no %s injected", f)
		}
	}
	for _, id := range ids {
		sr, err := plain.GetScheduled(ctx, "n1", id)
		if err != nil || sr.State != capacity.ScheduledCancelled {
			t.Errorf("%s: %+v, %v; want cancelled", id, sr, err)
		}
		if n := cancelRecords(t, svc, id); n != 1 {
			t.Errorf("%s: %d cancel records, want 1", id, n)
		}
	}
	if live := fs.Live(); len(live) != 0 {
		t.Errorf("schedules left %v", live)
	}
}

// lostUpdate writes a scheduled reclaim's transition, then reports the outcome unknown (a
// timeout after the write landed).
type lostUpdate struct{ *dynamo.Store }

func (l lostUpdate) UpdateScheduled(ctx context.Context, from, to capacity.ScheduledReclaim, audit *capacity.AuditRecord) error {
	if err := l.Store.UpdateScheduled(ctx, from, to, audit); err != nil {
		return err
	}
	return capacity.ErrAmbiguous
}

// A cancel whose write landed but whose answer was lost, found cancelled by its next read,
// still deletes the schedule (and the sweep's likewise), and each is cancelled once.
func TestCancelWithALostAnswerDeletesTheSchedule(t *testing.T) {
	env, svc, fs, clock := schedWorld(t)
	ctx := context.Background()
	ids := scheduleOn(t, svc, owner, "r1", "u1", clock.Add(time.Hour), 2)
	svc.Schedules = lostUpdate{env.Store}
	c, err := svc.CancelScheduledReclaim(ctx, owner, "n1", "r1", ids[0], capacity.RequestMeta{})
	if err != nil || c.State != capacity.ScheduledCancelled {
		t.Fatalf("cancel: %+v, %v", c, err)
	}
	if _, err := svc.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	if live := fs.Live(); len(live) != 0 {
		t.Errorf("schedules left %v", live)
	}
	for _, id := range ids {
		if n := cancelRecords(t, svc, id); n != 1 {
			t.Errorf("%s: %d cancel records, want 1", id, n)
		}
	}
	wantPending(t, env, "owner", 0)
}
