package capacity_test

import (
	"context"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo"
)

// afterTheAgent sends the writes that follow the agent's answer (marking the VM, its outcome,
// the claim's release and its mark) through the store under faults, and everything else
// through a clean one: the faults meet a VM its agent has already terminated.
type afterTheAgent struct {
	capacity.TerminationStore // clean
	faulty                    *dynamo.Store
}

func (s afterTheAgent) MarkTerminated(ctx context.Context, op capacity.Operation, vmID string, now time.Time) error {
	return s.faulty.MarkTerminated(ctx, op, vmID, now)
}

func (s afterTheAgent) RecordOutcome(ctx context.Context, op capacity.Operation, vmID string, out capacity.VMOutcome) error {
	return s.faulty.RecordOutcome(ctx, op, vmID, out)
}

func (s afterTheAgent) ReleaseTermination(ctx context.Context, op capacity.Operation, vmID, holder string) error {
	return s.faulty.ReleaseTermination(ctx, op, vmID, holder)
}

func (s afterTheAgent) MarkClaimAnswered(ctx context.Context, op capacity.Operation, vmID, holder string, answer capacity.Outcome) error {
	return s.faulty.MarkClaimAnswered(ctx, op, vmID, holder, answer)
}

// DynamoDB throttles the operation's partition (or loses the answer of a write that landed)
// just after the agents answered: each VM's agent is still asked once, its outcome is
// recorded in the end, and the operation ends once. (Before: the round released the claims of
// the VMs it could not record, and the task's retry asked their agents again.)
func TestThrottledRecordsAfterTheAgentTerminateEachVMOnce(t *testing.T) {
	const vms = 8
	throttle := func(op string, n int) awsfault.Rule {
		return awsfault.Rule{Operation: op, Fault: awsfault.Throttling, Rate: 1, Max: n}
	}
	tests := []struct {
		name  string
		rules []awsfault.Rule
		// tries bounds the first invocation's tries to record (0: the default); a run after
		// its claims lapsed finishes what it left.
		tries int
	}{
		// A write of the outcome gets 5 attempts from the SDK: 40 throttles fail each VM's first.
		{"the outcome write throttled, then recovering", []awsfault.Rule{throttle("PutItem", 5*vms)}, 0},
		{"the VM's mark (the live item's delete) throttled, then recovering", []awsfault.Rule{throttle("DeleteItem", 3*vms)}, 0},
		{"the outcome write landing with its answer lost, and throttled", []awsfault.Rule{
			{Operation: "PutItem", Fault: awsfault.AmbiguousTimeout, Rate: 1, Max: vms}, throttle("PutItem", 5*vms)}, 0},
		{"the outcome write and the claim's release throttled", []awsfault.Rule{throttle("PutItem", 5*vms),
			throttle("DeleteItem", 5*vms)}, 0},
		{"throttled past the invocation, the claim's mark too: finished after the lease", []awsfault.Rule{throttle("PutItem", 2*5*vms),
			throttle("UpdateItem", 2*vms)}, 2},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inj := awsfault.New(int64(200+i), tt.rules...)
			env, op := eightVictims(t, inj)
			store := afterTheAgent{TerminationStore: env.Clean(), faulty: env.Store}
			agent := &capacitytest.Agent{}
			fast := capacity.RetryPolicy{Base: time.Millisecond, Cap: 5 * time.Millisecond}
			term := &capacity.Terminator{Store: store, Agent: agent, Concurrency: vms, Logger: quiet,
				Record: fast, RecordTries: tt.tries}
			task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:exec:1", MaxRounds: 5}
			if tt.tries == 0 {
				runRetrying(t, term, task, 3)
			} else {
				if _, err := term.Run(context.Background(), task); err == nil {
					t.Fatal("the first run recorded every VM: the throttling did not outlast it, the test proves nothing")
				}
				// The next attempt (the reconciler's restart), once the first run's claims lapsed.
				later := *term
				later.Now = func() time.Time { return time.Now().Add(10 * time.Minute) }
				runRetrying(t, &later, task, 3)
			}

			for _, vm := range op.VMIDs {
				if n := agent.Calls(vm); n != 1 {
					t.Errorf("agent asked to terminate %s %d times, want once", vm, n)
				}
			}
			got, err := env.Clean().GetOperation(context.Background(), "n1", op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != capacity.OpTerminating || !got.Ended() {
				t.Errorf("operation %s, every VM final %v; want every VM final, its end left to the Report step", got.State, got.Ended())
			}
			for _, vm := range op.VMIDs {
				if o := got.Outcomes[vm].Outcome; o != capacity.OutcomeTerminated {
					t.Errorf("%s ended %q, want terminated", vm, o)
				}
			}
			if inj.Count(awsfault.Throttling) == 0 {
				t.Errorf("faults injected %v: nothing throttled, the test proves nothing", inj.Counts())
			}
			t.Logf("faults injected: %v", inj.Counts())
		})
	}
}
