package capacity_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// Termination rounds and the end of an operation under everything AWS does that the emulator
// does not, at once: transaction conflicts and throttling on every store call, writes applied
// but answered with a timeout, an agent that fails the first call for half the VMs, and the
// same round run twice at once (Step Functions re-running a task whose answer was lost). Every
// VM ends with exactly one outcome, terminated, and the operation ends completed.
func TestTerminationUnderFaults(t *testing.T) {
	for seed := range int64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			inj := awsfault.New(100+seed,
				awsfault.Rule{Fault: awsfault.TransactionConflict, Rate: 0.15},
				awsfault.Rule{Fault: awsfault.Throttling, Rate: 0.15},
				awsfault.Rule{Operation: "UpdateItem", Fault: awsfault.AmbiguousTimeout, Rate: 0.05},
				awsfault.Rule{Operation: "PutItem", Fault: awsfault.AmbiguousTimeout, Rate: 0.05},
				awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 0.05})
			env, op := eightVictims(t, inj)
			agent := &capacitytest.Agent{FailFirst: map[string]int{"s0": 1, "s2": 1, "s4": 1, "s6": 1}}
			term := &capacity.Terminator{Store: env.Store, Agent: agent, Concurrency: 8, Logger: quiet}
			task := capacity.TerminationTask{ReclaimID: op.ID, NodeID: "n1", VMIDs: op.VMIDs, ExecutionARN: "arn:x", MaxRounds: 5}
			var wg sync.WaitGroup
			for range 2 {
				wg.Go(func() { runRetrying(t, term, task, 3) })
			}
			wg.Wait()
			// The Report step, retried like the state machine's task, ends it.
			report := &capacity.Announcer{Store: env.Store, Logger: quiet}
			var err error
			for range 4 {
				if _, err = report.Report(context.Background(), "n1", op.ID, 1); err == nil {
					break
				}
			}
			if err != nil {
				t.Fatalf("report failed 4 times: %v", err)
			}

			clean := env.Clean()
			ctx := context.Background()
			got, err := clean.GetOperation(ctx, "n1", op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != capacity.OpCompleted || len(got.Outcomes) != len(op.VMIDs) {
				t.Fatalf("operation %s with %d outcomes, want completed with %d: %+v", got.State, len(got.Outcomes), len(op.VMIDs), got.Outcomes)
			}
			for _, vm := range op.VMIDs {
				if o := got.Outcomes[vm].Outcome; o != capacity.OutcomeTerminated && o != capacity.OutcomeAlreadyGone {
					t.Errorf("%s ended %q", vm, o)
				}
			}
			items := 0 // one outcome item per VM, never two
			for _, it := range env.Items(t, env.Store.Table) {
				if attrString(it["type"]) == "outcome" && attrString(it["ReclaimID"]) == op.ID {
					items++
				}
			}
			if items != len(op.VMIDs) {
				t.Errorf("%d outcome items, want %d", items, len(op.VMIDs))
			}
			if st, _ := clean.LoadNode(ctx, "n1", ""); len(st.VMs) != 0 {
				t.Errorf("VMs still live: %+v", st.VMs)
			}
			counts := inj.Counts()
			if counts[awsfault.TransactionConflict] == 0 || counts[awsfault.Throttling] == 0 {
				t.Errorf("faults injected %v: want conflicts and throttling, or the test proves nothing", counts)
			}
			t.Logf("faults injected: %v", counts)
		})
	}
}
