package main

import (
	"context"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/agentsim"
	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/stepfn"
)

// graceReclaim places spot VM vm-spot-9 on gpu-4 and reclaims gpu-4 with the grace; it returns
// the notice phase's task, as the workflow's NotifyAgents state sends it.
func (f *fixture) graceReclaim(t *testing.T, grace int) stepfn.Task {
	t.Helper()
	ctx := context.Background()
	svc := &capacity.Service{Store: f.env.Store, Logger: quiet}
	placer := capacity.Principal{OrgID: "platform", Operator: true, Permissions: []string{capacity.PermPlace}}
	if _, err := svc.Place(ctx, placer, capacity.PlacementRequest{NodeID: demo.NodeID, VMID: "vm-spot-9", OrgID: demo.OrgBuyer,
		Tier: capacity.TierSpot, UnitIDs: []string{"gpu-4"}}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	if err := f.sim.AddVM(demo.NodeID, "vm-spot-9", agent.StateRunning); err != nil {
		t.Fatal(err)
	}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	res, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: demo.NodeID, ReservationID: demo.ReservationID,
		UnitIDs: []string{"gpu-4"}, GraceSeconds: grace}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	return stepfn.Task{AgentNotices: true, ReclaimID: res.ReclaimID, NodeID: demo.NodeID, Attempt: 1, ExecutionARN: "arn:exec"}
}

// TestNoticePhase runs the notice phase through the wired handler against the agent
// simulator: a notice reaches the VM's agent signed with the node's key; an agent without
// notices, one that is down and one too slow for the grace are each recorded, within the
// grace, and the round that follows terminates the VM all the same.
func TestNoticePhase(t *testing.T) {
	tests := []struct {
		name     string
		endpoint func(sim *agentsim.Sim) string
		agent    func(sim *agentsim.Sim)
		want     capacity.NoticeState
	}{
		{name: "delivered", want: capacity.NoticeDelivered},
		{name: "agent without notices", agent: func(sim *agentsim.Sim) { sim.SetNoticesUnsupported(demo.NodeID, "", true) }, want: capacity.NoticeUnsupported},
		{name: "agent slower than the grace", agent: func(sim *agentsim.Sim) { sim.SetNoticeLatency(demo.NodeID, "", 10*time.Second) }, want: capacity.NoticeFailed},
		{name: "agent down", endpoint: func(*agentsim.Sim) string { return "http://127.0.0.1:1/" + demo.NodeID }, want: capacity.NoticeFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, tc.endpoint)
			task := f.graceReclaim(t, 2)
			if tc.agent != nil {
				tc.agent(f.sim)
			}
			term := &capacity.Terminator{Store: f.store, Agent: f.agent, Logger: quiet}
			notifier := &capacity.EvictionNotifier{Store: f.store, Agent: f.agent, Logger: quiet, Budget: noticeBudget}
			run := dispatch(term, notifier, quiet)
			start := time.Now()
			out, err := run(ctx, task)
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("notice phase took %s, beyond the 2 s grace", took)
			}
			if out.Notices["vm-spot-9"] != string(tc.want) || out.ReclaimID != task.ReclaimID {
				t.Fatalf("output %+v, want vm-spot-9 %s", out, tc.want)
			}
			op, err := f.env.Store.GetOperation(ctx, demo.NodeID, task.ReclaimID)
			if err != nil {
				t.Fatal(err)
			}
			if op.Notices["vm-spot-9"].State != tc.want {
				t.Errorf("recorded %+v, want %s", op.Notices, tc.want)
			}
			got := f.sim.Notices(demo.NodeID, "vm-spot-9")
			if delivered := tc.want == capacity.NoticeDelivered; delivered != (len(got) == 1) ||
				delivered && (!got[0].Time.Equal(op.TerminateAfter.Truncate(time.Second)) || got[0].ReclaimID != task.ReclaimID || got[0].Action != "terminate") {
				t.Errorf("guest sees %+v, want delivered %v for terminateAfter %s", got, delivered, op.TerminateAfter)
			}
			if tc.endpoint != nil {
				return // the round cannot reach that agent either
			}
			round := task
			round.AgentNotices, round.VMIDs, round.MaxRounds = false, []string{"vm-spot-9"}, 5
			if out, err := run(ctx, round); err != nil || len(out.Terminated) != 1 {
				t.Fatalf("round after the notices: %+v, %v; want vm-spot-9 terminated", out, err)
			}
		})
	}
}
