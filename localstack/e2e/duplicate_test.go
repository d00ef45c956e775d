package e2e

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/stepfn"
)

// Exactly-once termination under at-least-once delivery, on the local stack (see "Express
// redesign" in docs/termination.md): the workflow's step delivered twice at once, and a run
// cut off during its round, then delivered again.

// committedUnstarted commits a reclaim of gpu-2, gpu-3 and gpu-0 of the node (evicting
// vm-spot-1 and vm-spot-2) without starting its workflow, and returns the operation, for the
// test to deliver its first step as it likes.
func committedUnstarted(t *testing.T, node string) *capacity.Operation {
	t.Helper()
	ctx := context.Background()
	svc := &capacity.Service{Store: store, Workflow: &capacitytest.Workflow{}}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	res, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: node, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2", "gpu-3", "gpu-0"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := store.GetOperation(ctx, node, res.ReclaimID)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// deliver starts a run of the operation's first step under the execution name, as a delivery
// of that step does, and returns its ARN ("" and the test failed, if it could not). Safe in a
// goroutine of the test.
func deliver(t *testing.T, op *capacity.Operation, name string) string {
	t.Helper()
	input, err := json.Marshal(stepfn.InputOf(*op, time.Now()))
	if err != nil {
		t.Error(err)
		return ""
	}
	out, err := sfnClient().StartExecution(context.Background(), &sfn.StartExecutionInput{
		StateMachineArn: aws.String(outputs["StateMachineArn"]), Name: aws.String(name), Input: aws.String(string(input)),
	})
	if err != nil {
		t.Errorf("start %s: %v", name, err)
		return ""
	}
	return aws.ToString(out.ExecutionArn)
}

// reportWatch watches the operation's reported events: its VMs' outcomes and its end.
func reportWatch(t *testing.T) *busWatch {
	return watchBus(t, map[string]any{
		"source":      []string{capacity.SourceCapacity},
		"detail-type": []string{capacity.DetailVMTerminated, capacity.DetailOperationCompleted, capacity.DetailOperationFailed},
	})
}

// assertFinishedOnce waits for every run of the operation to end, then checks that it
// completed with an outcome per victim, that each victim had one terminate call at its agent,
// and that its report went out once.
func assertFinishedOnce(t *testing.T, w *busWatch, node, reclaimID string) {
	t.Helper()
	final := awaitOperation(t, node, reclaimID, 60*time.Second)
	awaitNoRunningExecution(t, reclaimID, 60*time.Second)
	if final["state"] != "completed" || len(outcomes(final)) != 2 {
		t.Fatalf("operation: %v", final)
	}
	for _, vm := range []string{"vm-spot-1", "vm-spot-2"} {
		if n := agents.TerminateCalls(node, vm); n != 1 {
			t.Errorf("%s got %d terminate calls, want 1", vm, n)
		}
	}
	assertTerminatedOnce(t, node, "vm-spot-1", "vm-spot-2")
	assertReportedOnce(t, w, reclaimID)
}

// assertReportedOnce checks that, with every run of the operation over, its VMs' outcomes and
// its end were each published once.
func assertReportedOnce(t *testing.T, w *busWatch, reclaimID string) {
	t.Helper()
	mine := func(ev busEvent) bool { return ev.detail["reclaimId"] == reclaimID }
	w.await("the operation's report", 3, 30*time.Second, mine)
	w.receive() // anything a second report would have added
	counts := map[string]int{}
	for _, ev := range w.seen {
		if mine(ev) {
			counts[ev.DetailType]++
		}
	}
	if counts[capacity.DetailVMTerminated] != 2 || counts[capacity.DetailOperationCompleted] != 1 || len(counts) != 2 {
		t.Errorf("published %v; want each VM's outcome once and the end once", counts)
	}
}

// The first step delivered twice at once (two runs of it, as SQS or an Express workflow may
// deliver): each VM is terminated by one call to its agent, the operation completes with one
// outcome per VM, and its report goes out once.
func TestDuplicateDeliveryTerminatesEachVMOnce(t *testing.T) {
	node := newNode(t, nil)
	// Both runs reach the agent before either has its answer.
	agents.SetLatency(node, "", 3*time.Second)
	w := reportWatch(t)
	op := committedUnstarted(t, node)

	var wg sync.WaitGroup
	for _, name := range []string{op.ID, op.ID + "-dup"} {
		wg.Go(func() { deliver(t, op, name) })
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	assertFinishedOnce(t, w, node, op.ID)
}

// A run stopped while its round waits on the agent (as Express stops a run at its time
// limit): the invocation it was in finishes its terminations and records them; the step
// delivered again finishes the operation and reports it, with no second terminate call.
func TestRunCutOffIsFinishedByTheNextDeliveryWithoutASecondTerminate(t *testing.T) {
	ctx := context.Background()
	node := newNode(t, nil)
	agents.SetLatency(node, "", 3*time.Second)
	w := reportWatch(t)
	op := committedUnstarted(t, node)

	arn := deliver(t, op, op.ID)
	if arn == "" {
		return
	}
	// Stop it once its round is at the agent: the operation is terminating from the round's start.
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := store.GetOperation(ctx, node, op.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == capacity.OpTerminating {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation still %s", got.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := sfnClient().StopExecution(ctx, &sfn.StopExecutionInput{ExecutionArn: aws.String(arn), Cause: aws.String("e2e: time limit")}); err != nil {
		t.Fatalf("stop %s: %v", arn, err)
	}
	// The cut-off run's invocation records what it terminated.
	deadline = time.Now().Add(30 * time.Second)
	for {
		got, err := store.GetOperation(ctx, node, op.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Outcomes) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("outcomes of the cut-off run: %+v", got.Outcomes)
		}
		time.Sleep(100 * time.Millisecond)
	}

	deliver(t, op, op.ID+"-again")
	assertFinishedOnce(t, w, node, op.ID)
}
