package capacity_test

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/capacity"
)

// The reconciler's bounds in the model: its documented defaults, but StartAfter (the
// stack's) and StuckAfter (only a log line), written out here again so that the model's
// predictions do not read them from the code.
const (
	mStartAfter   = 30 * time.Second
	mReportAfter  = 2 * time.Minute
	mAttemptBound = 10 * time.Minute
	mHeldAfter    = time.Hour
	mMaxRestarts  = 3
)

// mReconcile is what the model predicts a reconciler run does to one operation.
type mReconcile int

const (
	recNothing mReconcile = iota
	recStart              // its attempt started again (a lost start): nothing changes
	recRestart            // restarted as the next attempt
	recFail               // restarts spent: failed
	recReport             // its Report step was left out: reported and ended
	recHeld               // failed, still holding VMs past HeldAfter: reported
)

// pendingSince is when a pending-start operation's first step was due: the end of its
// grace or when it entered the state, whichever is later (docs/termination.md).
func pendingSince(o *capacity.Operation) time.Time {
	since := o.UpdatedAt
	if since.IsZero() {
		since = o.CreatedAt
	}
	if o.TerminateAfter.After(since) {
		since = o.TerminateAfter
	}
	return since
}

// predictReconcile is the reconciler's rule for one operation as stored, at now.
func predictReconcile(o *capacity.Operation, now time.Time) mReconcile {
	restartOrFail := func() mReconcile {
		if o.Restarts >= mMaxRestarts {
			return recFail
		}
		return recRestart
	}
	// The byState listing holds operations that entered their state strictly before its
	// bound: one that entered it exactly then is the next run's.
	entered := o.UpdatedAt
	if entered.IsZero() {
		entered = o.CreatedAt
	}
	listed := func(bound time.Duration) bool { return entered.Before(now.Add(-bound)) }
	switch o.State {
	case capacity.OpPendingStart:
		if !listed(mStartAfter) {
			return recNothing
		}
		switch overdue := now.Sub(pendingSince(o)); {
		case overdue < mStartAfter:
			return recNothing
		case overdue >= mStartAfter+mAttemptBound:
			return restartOrFail()
		}
		return recStart
	case capacity.OpTerminating:
		if !listed(mStartAfter) {
			return recNothing
		}
		idle := now.Sub(o.LastChange())
		if o.Ended() {
			if idle >= mReportAfter {
				return recReport
			}
			return recNothing
		}
		if idle >= mAttemptBound {
			return restartOrFail()
		}
	case capacity.OpFailed:
		if listed(mHeldAfter) && len(o.Held()) > 0 && now.Sub(o.UpdatedAt) >= mHeldAfter {
			return recHeld
		}
	}
	return recNothing
}

// stepReconcile lets some time pass and runs the reconciler: lost starts (operations no
// termination step has run yet) started again, runs cut off (a termination stopped before
// its last round, a Report step left out) restarted or reported, restarts bounded, failed
// operations that still hold VMs reported. Each operation's fate is predicted from its
// stored times by the rules written out again; the reconciler never moves a VM or a unit.
func (m *model) stepReconcile(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{0, 45 * time.Second, 3 * time.Minute, 11 * time.Minute, 61 * time.Minute}).Draw(t, "idle")
	m.step("reconcile")
	m.clock = m.clock.Add(d)
	for _, id := range mNodeIDs {
		m.touched[id] = true // the reconciler touches no node: every node must be as it was
	}
	want := map[mReconcile][]string{}
	stored := map[string]*capacity.Operation{}
	for _, id := range slices.Sorted(maps.Keys(m.ops)) {
		op := m.ops[id]
		got, err := m.store.GetOperation(m.ctx, op.node, id)
		if err != nil {
			t.Fatalf("get operation %s: %v", id, err)
		}
		stored[id] = got
		p := predictReconcile(got, m.clock)
		want[p] = append(want[p], id)
		m.dirty[id] = true
	}
	rec := &capacity.Reconciler{Store: m.store, Workflow: m.wf, StartAfter: mStartAfter, StuckAfter: 30 * time.Minute,
		Batch: 1000, Claims: m.store, Now: func() time.Time { return m.clock }, Logger: quiet}
	rep, err := rec.Run(m.ctx)
	what := fmt.Sprintf("reconcile at %v (+%v)", m.clock, d)
	m.expectOK(what, err)
	ids := func(ops []capacity.Operation) []string {
		out := []string{}
		for _, o := range ops {
			out = append(out, o.ID)
		}
		return out
	}
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"started", rep.Started, append(slices.Clone(want[recStart]), want[recRestart]...)},
		{"restarted", rep.Restarted, want[recRestart]},
		{"exhausted", ids(rep.Exhausted), want[recFail]},
		{"reported", rep.Reported, want[recReport]},
		{"ended", rep.Ended, want[recReport]},
		{"held", ids(rep.Held), want[recHeld]},
		{"start failed", rep.StartFailed, nil},
		{"publish failed", rep.PublishFailed, nil},
	} {
		if !same(c.got, c.want) {
			m.mismatch("%s: %s %v, model %v", what, c.name, c.got, c.want)
		}
	}
	for _, h := range rep.Held {
		// A held VM is one the operation still keeps terminating, its units with it.
		for _, vm := range h.VMIDs {
			if v := m.vms[h.NodeID+"/"+vm]; v == nil || v.state != capacity.VMTerminating || v.reclaim != h.ID {
				m.violation("%s: operation %s reported holding VM %s, which is not terminating for it (%+v)", what, h.ID, vm, v)
			}
		}
		if !same(h.VMIDs, stored[h.ID].Held()) {
			m.mismatch("%s: %s held %v, stored %v", what, h.ID, h.VMIDs, stored[h.ID].Held())
		}
	}
	for p, ids := range want {
		m.stats.outcome(fmt.Sprintf("reconcile -> %s", [...]string{"nothing", "started again", "restarted", "failed (restarts spent)",
			"reported and ended", "held reported"}[p]))
		for _, id := range ids {
			op := m.ops[id]
			switch p {
			case recRestart:
				op.attempt++
				op.state = capacity.OpPendingStart
				if name := fmt.Sprintf("%s-%d", id, op.attempt); !slices.Contains(m.wf.Started(), name) {
					m.mismatch("%s: restart of %s did not start %s", what, id, name)
				}
			case recFail:
				op.state = capacity.OpFailed
			case recReport:
				op.state = endState(op)
			}
		}
	}
}

// endState is the state an operation whose VMs are all final ends in.
func endState(op *mOp) capacity.OperationState {
	for _, out := range op.outcomes {
		if out.outcome == capacity.OutcomeFailed {
			return capacity.OpFailed
		}
	}
	return capacity.OpCompleted
}

// stepForceEnd has an operator (mostly) end a VM's termination that its agent cannot
// confirm: only on a failed operation, only a VM terminating for it; a VM with a success
// recorded is left as it is (it is never ended twice); the last one completes the operation.
func (m *model) stepForceEnd(t *rapid.T) {
	op := m.drawOp(t)
	if op == nil {
		return
	}
	m.touched[op.node] = true
	m.dirty[op.id] = true
	vm := rapid.SampledFrom(op.vms).Draw(t, "vm")
	p := mOperator
	if chance(t, 15, "notOperator") {
		p = rapid.SampledFrom([]capacity.Principal{mManager, mOwnerA, mPlacer}).Draw(t, "caller")
	}
	reason := "node reimaged; VM confirmed gone"
	if chance(t, 10, "noReason") {
		reason = " "
	}
	m.step(fmt.Sprintf("force-end (%s)", op.state))
	what := fmt.Sprintf("force-end %s VM %s by %s (%s, outcomes %v)", op.id, vm, p.KeyID, op.state, op.outcomes)
	res, err := m.svc.ForceEnd(m.ctx, p, capacity.ForceEndRequest{NodeID: op.node, ReservationID: op.res, ReclaimID: op.id, VMID: vm,
		Reason: reason}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if !p.CanOperate(capacity.PermNodeManage) {
		m.expectErr(what, err, capacity.CodeNotFound, nil)
		return
	}
	if reason == " " {
		m.expectErr(what, err, capacity.CodeInvalidRequest, nil)
		return
	}
	if out, ok := op.outcomes[vm]; ok && out.outcome != capacity.OutcomeFailed {
		m.expectOK(what, err)
		if res.Outcome != out.outcome || res.Ended {
			m.mismatch("%s: answered %s (ended %v) for a VM whose outcome was %s", what, res.Outcome, res.Ended, out.outcome)
		}
		return
	}
	if op.state != capacity.OpFailed {
		m.expectErr(what, err, capacity.CodeOperationRunning, nil)
		return
	}
	key := op.node + "/" + vm
	outcome := capacity.OutcomeAlreadyGone
	if v := m.vms[key]; v != nil {
		if v.state != capacity.VMTerminating || v.reclaim != op.id {
			m.expectErr(what, err, capacity.CodeInvalidTransition, nil)
			return
		}
		outcome = capacity.OutcomeForceEnded
	}
	m.expectOK(what, err)
	if outcome == capacity.OutcomeForceEnded {
		if m.killed[key] {
			m.violation("%s: VM %s force-ended after it was terminated", what, vm)
		}
		m.killed[key] = true
		delete(m.vms, key)
		m.nodes[op.node].version++ // its units are free: decisions that read them go again
	}
	op.outcomes[vm] = mOutcome{outcome: outcome, attempt: op.attempt}
	ended := len(op.unfinished()) == 0 && endState(op) == capacity.OpCompleted
	if ended {
		op.state = capacity.OpCompleted
	}
	if res.Outcome != outcome || res.Ended != ended {
		m.mismatch("%s: answered %s (ended %v), model %s (ended %v)", what, res.Outcome, res.Ended, outcome, ended)
	}
}
