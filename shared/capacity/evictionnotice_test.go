package capacity_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// noticeAgent answers notices as told, per VM, and records what it was sent.
type noticeAgent struct {
	mu     sync.Mutex
	answer func(ctx context.Context, vmID string) error
	got    []capacity.EvictionNotice
}

func (a *noticeAgent) Notice(ctx context.Context, _ capacity.Node, n capacity.EvictionNotice) error {
	a.mu.Lock()
	a.got = append(a.got, n)
	a.mu.Unlock()
	if a.answer == nil {
		return nil
	}
	return a.answer(ctx, n.VMID)
}

// blockUntilDone is an agent that never answers: only the caller's deadline ends the call.
func blockUntilDone(ctx context.Context, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestEvictionNotifier(t *testing.T) {
	now := t0.Add(time.Hour) // the service's clock in world
	tests := []struct {
		name    string
		grace   int
		attempt int
		at      time.Time // the notifier's clock
		answer  func(ctx context.Context, vmID string) error
		want    map[string]capacity.NoticeState // nil: no notice sent, none recorded
	}{
		{name: "delivered", grace: 30, at: now,
			want: map[string]capacity.NoticeState{"s1": capacity.NoticeDelivered, "s2": capacity.NoticeDelivered}},
		{name: "agent without notices", grace: 30, at: now,
			answer: func(context.Context, string) error { return capacity.ErrNoticeUnsupported },
			want:   map[string]capacity.NoticeState{"s1": capacity.NoticeUnsupported, "s2": capacity.NoticeUnsupported}},
		{name: "one VM unknown to its node", grace: 30, at: now,
			answer: func(_ context.Context, vm string) error {
				if vm == "s2" {
					return capacity.ErrNoticeUnknownVM
				}
				return nil
			},
			want: map[string]capacity.NoticeState{"s1": capacity.NoticeDelivered, "s2": capacity.NoticeUnknownVM}},
		{name: "agent down", grace: 30, at: now,
			answer: func(context.Context, string) error { return errors.New("connection refused") },
			want:   map[string]capacity.NoticeState{"s1": capacity.NoticeFailed, "s2": capacity.NoticeFailed}},
		{name: "agent hangs: cut off when the grace ends", grace: 1, at: now, answer: blockUntilDone,
			want: map[string]capacity.NoticeState{"s1": capacity.NoticeFailed, "s2": capacity.NoticeFailed}},
		{name: "no grace: no notice", grace: 0, at: now},
		{name: "grace already over (a restart): no notice", grace: 30, at: now.Add(31 * time.Second)},
		{name: "a task of an older attempt", grace: 30, at: now, attempt: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			if _, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
			req := reclaim("u1", "u2")
			req.GraceSeconds = tc.grace
			res, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			agent := &noticeAgent{answer: tc.answer}
			n := &capacity.EvictionNotifier{Store: env.Store, Agent: agent, Now: func() time.Time { return tc.at }, Logger: quiet}
			start := time.Now()
			got, err := n.Run(ctx, capacity.NoticeTask{ReclaimID: res.ReclaimID, NodeID: "n1", Attempt: tc.attempt})
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > time.Duration(tc.grace)*time.Second+time.Second {
				t.Errorf("Run took %s, longer than the grace of %ds", took, tc.grace)
			}
			op, err := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if len(agent.got) != 0 || len(got) != 0 || len(op.Notices) != 0 {
					t.Fatalf("sent %v, answered %v, recorded %v; want nothing", agent.got, got, op.Notices)
				}
				return
			}
			for _, sent := range agent.got {
				if sent.ReclaimID != res.ReclaimID || !sent.TerminateAfter.Equal(op.TerminateAfter) || sent.Reason != capacity.NoticeReasonReclaim {
					t.Errorf("sent %+v, want reclaim %s, terminateAfter %s", sent, res.ReclaimID, op.TerminateAfter)
				}
			}
			for vm, want := range tc.want {
				rec := op.Notices[vm]
				if got[vm].State != want || rec.State != want || !rec.TerminateAfter.Equal(op.TerminateAfter) {
					t.Errorf("%s: answered %+v, recorded %+v; want %s", vm, got[vm], rec, want)
				}
				if (want == capacity.NoticeFailed) != (rec.Error != "") && want != capacity.NoticeUnsupported {
					t.Errorf("%s: recorded error %q for %s", vm, rec.Error, want)
				}
			}
			if len(op.Notices) != len(tc.want) {
				t.Errorf("recorded %v, want %v", op.Notices, tc.want)
			}
		})
	}
}

// TestDeliveredNoticeIsKept: a later run that cannot deliver (the agent went down) does not
// hide that the VM was told.
func TestDeliveredNoticeIsKept(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	req := reclaim("u1")
	req.GraceSeconds = 30
	res, err := svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return t0.Add(time.Hour) }
	task := capacity.NoticeTask{ReclaimID: res.ReclaimID, NodeID: "n1"}
	agent := &noticeAgent{}
	n := &capacity.EvictionNotifier{Store: env.Store, Agent: agent, Now: now, Logger: quiet}
	for _, answer := range []func(context.Context, string) error{nil, func(context.Context, string) error { return errors.New("down") }} {
		agent.answer = answer
		if _, err := n.Run(ctx, task); err != nil {
			t.Fatal(err)
		}
	}
	op, err := env.Store.GetOperation(ctx, "n1", res.ReclaimID)
	if err != nil {
		t.Fatal(err)
	}
	if op.Notices["s1"].State != capacity.NoticeDelivered || len(agent.got) != 2 {
		t.Fatalf("notice %+v after %d calls, want delivered kept", op.Notices["s1"], len(agent.got))
	}
}
