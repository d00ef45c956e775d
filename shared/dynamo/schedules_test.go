package dynamo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

func scheduledAt(id string) capacity.ScheduledReclaim {
	return capacity.ScheduledReclaim{
		ID: id, NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}, Reason: "why", GraceSeconds: 30,
		At: t0.Add(48 * time.Hour), State: capacity.ScheduledPending, CreatorKeyID: "k", CreatorOrgID: "owner",
		CreatedAt: t0, UpdatedAt: t0,
	}
}

// A scheduled reclaim lives in a partition of its own: the node's decision read never sees it,
// and it is written only if the reservation is still at the version read.
func TestScheduledReclaimItem(t *testing.T) {
	env := newEnv(t, seed(2, 1))
	ctx := context.Background()
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	r := *st.Reservation("r1")
	sr := scheduledAt("srcl_1")
	c := capacity.ScheduleCommit{Scheduled: sr, Reservation: r,
		Audit: capacity.AuditRecord{ID: "a1", Time: t0, NodeID: "n1", Action: capacity.ActionScheduleReclaim, Outcome: "ok"}}
	if err := env.Store.CreateScheduled(ctx, c); err != nil {
		t.Fatal(err)
	}
	items := env.Items(t, env.Store.Table)
	found := false
	for _, it := range items {
		if str(it["sk"]) == "SCHED" {
			found = true
			if pk := str(it["pk"]); pk != "NODE#n1#SCHED#srcl_1" {
				t.Errorf("pk = %s", pk)
			}
			if _, ok := it["expiresAt"]; ok {
				t.Error("a pending scheduled reclaim expires")
			}
		}
	}
	if !found {
		t.Fatal("no scheduled reclaim item")
	}
	again, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil || len(again.Reservations) != 1 || len(again.VMs) != 1 {
		t.Fatalf("LoadNode = %+v, %v", again, err)
	}
	got, err := env.Store.GetScheduled(ctx, "n1", "srcl_1")
	if err != nil || got.GraceSeconds != 30 || got.Reason != "why" || !got.At.Equal(sr.At) || got.State != capacity.ScheduledPending {
		t.Fatalf("get = %+v, %v", got, err)
	}
	// The same id again, or the reservation at another version: a conflict, nothing written.
	c.Audit.ID = "a2"
	if err := env.Store.CreateScheduled(ctx, c); !errors.Is(err, capacity.ErrConflict) {
		t.Errorf("same id: %v", err)
	}
	c.Scheduled.ID, c.Audit.ID, c.Reservation.Version = "srcl_2", "a3", r.Version+1
	if err := env.Store.CreateScheduled(ctx, c); !errors.Is(err, capacity.ErrConflict) {
		t.Errorf("reservation version moved: %v", err)
	}
	if _, err := env.Store.GetScheduled(ctx, "n1", "srcl_2"); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("srcl_2: %v", err)
	}
	if n := len(env.Items(t, env.Store.AuditTable)); n != 1 {
		t.Errorf("audit records = %d, want 1", n)
	}
}

// A firing moves the scheduled reclaim to completed in the reclaim's own transaction, only
// from scheduled at the version read: after a cancel the whole reclaim fails.
func TestFireCommitConditionsOnTheScheduledState(t *testing.T) {
	env := newEnv(t, seed(2, 1))
	ctx := context.Background()
	st, _ := env.Store.LoadNode(ctx, "n1", "")
	sr := scheduledAt("srcl_1")
	if err := env.Store.CreateScheduled(ctx, capacity.ScheduleCommit{Scheduled: sr, Reservation: *st.Reservation("r1"),
		Audit: capacity.AuditRecord{ID: "a0", Time: t0, NodeID: "n1", Action: capacity.ActionScheduleReclaim}}); err != nil {
		t.Fatal(err)
	}
	cancelled := sr
	cancelled.State, cancelled.CancelledAt, cancelled.UpdatedAt = capacity.ScheduledCancelled, &t0, t0
	fired := sr
	fired.State, fired.ReclaimID, fired.FiredAt = capacity.ScheduledCompleted, "rcl_1", &t0
	commit := func(auditID string) error {
		after := *st.Reservation("r1")
		after.ReleasedUnitIDs = []string{}
		return env.Store.Commit(ctx, capacity.Commit{Node: st.Node, BumpNode: true, Reservation: &after, Scheduled: &fired,
			Audit: capacity.AuditRecord{ID: auditID, Time: t0, NodeID: "n1", Action: capacity.ActionReclaim}})
	}
	// Cancel first (conditional on scheduled at version 0): the firing's commit then fails whole.
	if err := env.Store.UpdateScheduled(ctx, sr, cancelled, &capacity.AuditRecord{ID: "a1", Time: t0, NodeID: "n1", Action: capacity.ActionCancelScheduledReclaim}); err != nil {
		t.Fatal(err)
	}
	if err := commit("a2"); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("fire after cancel: %v", err)
	}
	if again, _ := env.Store.LoadNode(ctx, "n1", ""); again.Reservation("r1").Version != st.Reservation("r1").Version {
		t.Error("the reclaim landed without its scheduled reclaim")
	}
	got, _ := env.Store.GetScheduled(ctx, "n1", "srcl_1")
	if got.State != capacity.ScheduledCancelled || got.Version != 1 {
		t.Errorf("after cancel: %+v", got)
	}
	// A second cancel conditioned on the old read conflicts too.
	if err := env.Store.UpdateScheduled(ctx, sr, cancelled, nil); !errors.Is(err, capacity.ErrConflict) {
		t.Errorf("stale cancel: %v", err)
	}

	// On a fresh one, the firing lands with the reclaim and a cancel from the old read fails.
	sr2 := scheduledAt("srcl_2")
	if err := env.Store.CreateScheduled(ctx, capacity.ScheduleCommit{Scheduled: sr2, Reservation: *st.Reservation("r1"),
		Audit: capacity.AuditRecord{ID: "a3", Time: t0, NodeID: "n1", Action: capacity.ActionScheduleReclaim}}); err != nil {
		t.Fatal(err)
	}
	fired = sr2
	fired.State, fired.ReclaimID, fired.FiredAt = capacity.ScheduledCompleted, "rcl_1", &t0
	if err := commit("a4"); err != nil {
		t.Fatal(err)
	}
	got, _ = env.Store.GetScheduled(ctx, "n1", "srcl_2")
	if got.State != capacity.ScheduledCompleted || got.ReclaimID != "rcl_1" || got.Version != 1 {
		t.Errorf("after fire: %+v", got)
	}
	c2 := sr2
	c2.State = capacity.ScheduledCancelled
	if err := env.Store.UpdateScheduled(ctx, sr2, c2, nil); !errors.Is(err, capacity.ErrConflict) {
		t.Errorf("cancel after fire: %v", err)
	}
}
