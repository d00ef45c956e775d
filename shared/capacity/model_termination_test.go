package capacity_test

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// fates of a VM under termination, as its agent answers.
const (
	fateTerminated = "terminated"
	fateGone       = "gone"
	fateTransient  = "transient" // fails, retryably, every round of this run
	fatePermanent  = "permanent" // fails, not retryably
)

// agentOf is the nodes' agents answering as the fates say (by VM).
func agentOf(fates map[string]string) *capacitytest.Agent {
	a := &capacitytest.Agent{FailFirst: map[string]int{}, Permanent: map[string]bool{}, Gone: map[string]bool{}}
	for vm, f := range fates {
		switch f {
		case fateGone:
			a.Gone[vm] = true
		case fateTransient:
			a.FailFirst[vm] = math.MaxInt
		case fatePermanent:
			a.Permanent[vm] = true
		}
	}
	return a
}

// drawOp draws one of the operations, or nil when there is none.
func (m *model) drawOp(t *rapid.T) *mOp {
	ids := slices.Sorted(maps.Keys(m.ops))
	if len(ids) == 0 {
		return nil
	}
	return m.ops[rapid.SampledFrom(ids).Draw(t, "op")]
}

// stepTerminate runs rounds of an operation's termination workflow, each VM's agent
// answering as drawn; it may stop before the workflow is done (the next run goes on).
func (m *model) stepTerminate(t *rapid.T) {
	op := m.drawOp(t)
	if op == nil {
		return
	}
	m.touched[op.node] = true
	fates := map[string]string{}
	for _, vm := range op.vms {
		fates[vm] = rapid.SampledFrom([]string{fateTerminated, fateTerminated, fateGone, fateTransient, fatePermanent}).Draw(t, "fate")
	}
	agent := agentOf(fates)
	term := &capacity.Terminator{Store: m.store, Agent: agent, Now: func() time.Time { return m.clock }, Logger: quiet}
	maxRounds := rapid.IntRange(1, 3).Draw(t, "maxRounds")
	rounds := rapid.IntRange(1, maxRounds).Draw(t, "rounds")
	attempt := op.attempt
	stale := attempt > 1 && chance(t, 20, "stale")
	if stale {
		attempt-- // a late branch of the execution a re-drive replaced
	}
	task := capacity.TerminationTask{ReclaimID: op.id, NodeID: op.node, VMIDs: op.unfinished(), ExecutionARN: "arn:exec:" + op.id,
		Attempt: attempt, MaxRounds: maxRounds}
	m.step(fmt.Sprintf("terminate (%s)", op.state))
	m.dirty[op.id] = true
	for round := range rounds {
		what := fmt.Sprintf("termination of %s round %d (fates %v, attempt %d of %d)", op.id, round, fates, attempt, op.attempt)
		before := agent.AllCalls()
		rep, err := term.Run(m.ctx, task)
		m.expectOK(what, err)
		for vm, n := range agent.AllCalls() {
			if n > before[vm] && m.killed[op.node+"/"+vm] {
				m.violation("%s: VM %s asked to terminate again after it was terminated or force-ended", what, vm)
			}
		}
		if stale || op.state == capacity.OpCompleted || op.state == capacity.OpFailed {
			if !rep.Done || len(rep.Terminated)+len(rep.AlreadyGone)+len(rep.Failed) > 0 || agent.Total() > 0 {
				m.mismatch("%s: a finished operation or a stale attempt acted: %+v, agent calls %d", what, rep, agent.Total())
			}
			return
		}
		op.state = capacity.OpTerminating
		last := round+1 >= maxRounds
		var next []string
		for _, vm := range task.VMIDs {
			if _, ok := op.final(vm); ok {
				continue
			}
			switch f := fates[vm]; {
			case f == fateTerminated || f == fateGone:
				out := capacity.OutcomeTerminated
				if f == fateGone {
					out = capacity.OutcomeAlreadyGone
				}
				op.outcomes[vm] = mOutcome{outcome: out, attempt: op.attempt}
				m.killed[op.node+"/"+vm] = true
				m.vms[op.node+"/"+vm].state = capacity.VMTerminated
				delete(m.vms, op.node+"/"+vm)
			case f == fateTransient && !last:
				next = append(next, vm)
			default:
				op.outcomes[vm] = mOutcome{outcome: capacity.OutcomeFailed, attempt: op.attempt}
			}
		}
		if !same(rep.Next.VMIDs, next) || rep.Done != (len(next) == 0) {
			m.mismatch("%s: next %v done %v, model next %v", what, rep.Next.VMIDs, rep.Done, next)
		}
		if rep.Done {
			m.reportStep(t, op)
			return
		}
		task = rep.Next
	}
}

// reportStep runs the workflow's Report step after the last round, unless the run was cut off
// before it (the operation then stays terminating, every VM final, until a later run's Report
// or the reconciler): the step, not the rounds, ends an operation whose VMs are all final.
func (m *model) reportStep(t *rapid.T, op *mOp) {
	if chance(t, 25, "report cut off") {
		return
	}
	a := &capacity.Announcer{Store: m.store, Claims: m.store, Now: func() time.Time { return m.clock }, Logger: quiet}
	_, err := a.Report(m.ctx, op.node, op.id, op.attempt)
	m.expectOK(fmt.Sprintf("report of %s (attempt %d)", op.id, op.attempt), err)
	if len(op.unfinished()) == 0 {
		op.state = capacity.OpCompleted
		for _, out := range op.outcomes {
			if out.outcome == capacity.OutcomeFailed {
				op.state = capacity.OpFailed
			}
		}
	}
}

// stepRedrive re-drives an operation (a new attempt for the VMs that failed).
func (m *model) stepRedrive(t *rapid.T) {
	op := m.drawOp(t)
	if op == nil {
		return
	}
	p, what := m.drawCaller(t, op.node, fmt.Sprintf("redrive (%s)", op.state), fmt.Sprintf("redrive %s (%s)", op.id, op.state))
	res, err := m.svc.Redrive(m.ctx, p, op.node, op.res, op.id, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.lostOrRefused(what, err, p, op.node, op.res) {
		return
	}
	if op.state == capacity.OpPendingStart || op.state == capacity.OpTerminating {
		m.expectErr(what, err, capacity.CodeOperationRunning, nil)
		return
	}
	m.expectOK(what, err)
	// At the next attempt a failure is no longer final: every VM without a success is
	// retried (one the reconciler's exhausted restarts left without an outcome too).
	var retry []string
	for _, vm := range op.vms {
		if out, ok := op.outcomes[vm]; !ok || out.outcome == capacity.OutcomeFailed {
			retry = append(retry, vm)
		}
	}
	if !same(res.Retried, retry) {
		m.mismatch("%s: retried %v, model %v", what, res.Retried, retry)
	}
	if len(retry) == 0 {
		return
	}
	m.dirty[op.id] = true
	op.attempt++
	op.state = capacity.OpPendingStart
	if last, want := m.wf.Last(), fmt.Sprintf("%s-%d", op.id, op.attempt); last != want {
		m.mismatch("%s: workflow started %q, want %q", what, last, want)
	}
}
