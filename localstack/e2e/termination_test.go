package e2e

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/stepfn"
)

func sfnClient(opts ...func(*sfn.Options)) *sfn.Client {
	return sfn.NewFromConfig(stack.AWSConfig(endpoint), opts...)
}

// reclaimOp reclaims gpu-2 and gpu-3 of the node (evicting vm-spot-1 and vm-spot-2) and
// returns the reclaim id.
func reclaimOp(t testing.TB, node string) string {
	t.Helper()
	r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2", "gpu-3", "gpu-0"}})
	if r.Status != http.StatusOK {
		t.Fatalf("reclaim: %d %s", r.Status, r.Body)
	}
	body := r.json(t)
	if !slices.Equal(strs(body["terminated"]), []string{"vm-spot-1", "vm-spot-2"}) {
		t.Fatalf("reclaim answer: %s", r.Body)
	}
	return body["reclaimId"].(string)
}

// awaitOperation polls GET .../reclaims/{id} until the operation ends, and returns it.
func awaitOperation(t testing.TB, node, reclaimID string, within time.Duration) map[string]any {
	t.Helper()
	path := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaims/" + reclaimID
	deadline := time.Now().Add(within)
	for {
		r := call(t, http.MethodGet, path, keyManager, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET operation: %d %s", r.Status, r.Body)
		}
		op := r.json(t)
		if op["state"] == "completed" || op["state"] == "failed" {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation still %s after %s: %s", op["state"], within, r.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// awaitNoRunningExecution polls until no execution of the termination state machine for
// the reclaim is running.
func awaitNoRunningExecution(t testing.TB, reclaimID string, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		running := 0
		p := sfn.NewListExecutionsPaginator(sfnClient(), &sfn.ListExecutionsInput{
			StateMachineArn: aws.String(outputs["StateMachineArn"]), StatusFilter: sfntypes.ExecutionStatusRunning,
		})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Fatalf("list executions: %v", err)
			}
			for _, e := range page.Executions {
				if strings.Contains(aws.ToString(e.Name), reclaimID) {
					running++
				}
			}
		}
		if running == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d executions for %s still running after %s", running, reclaimID, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func outcomes(op map[string]any) map[string]string {
	out := map[string]string{}
	for _, v := range op["vms"].([]any) {
		vm := v.(map[string]any)
		out[vm["vmId"].(string)] = vm["outcome"].(string)
	}
	return out
}

// assertTerminatedOnce checks the agent terminated each victim exactly once and was never
// asked about the VMs the reclaim skipped, and that the table agrees.
func assertTerminatedOnce(t testing.TB, node string, victims ...string) {
	t.Helper()
	for _, vm := range victims {
		if n := agents.Terminations(node, vm); n != 1 {
			t.Errorf("%s terminated %d times by the agent, want 1", vm, n)
		}
		if s := agents.State(node, vm); s != "terminated" {
			t.Errorf("agent says %s is %s", vm, s)
		}
	}
	for _, vm := range []string{"vm-res-1", "vm-od-1"} {
		if n := agents.TerminateCalls(node, vm); n != 0 {
			t.Errorf("skipped VM %s got %d terminate calls", vm, n)
		}
	}
	st, err := store.LoadNode(context.Background(), node, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range st.VMs { // terminated VMs are no longer loaded: only the survivors remain
		if slices.Contains(victims, vm.ID) {
			t.Errorf("%s is still %s in the table", vm.ID, vm.State)
		}
	}
}

func TestReclaimTerminatesTheVictims(t *testing.T) {
	node := newNode(t, nil)
	id := reclaimOp(t, node)
	op := awaitOperation(t, node, id, 30*time.Second)
	if op["state"] != "completed" || !maps.Equal(outcomes(op), map[string]string{"vm-spot-1": "terminated", "vm-spot-2": "terminated"}) {
		t.Fatalf("operation: %v", op)
	}
	assertTerminatedOnce(t, node, "vm-spot-1", "vm-spot-2")
	// Its runs are over (Express runs cannot be described on AWS: the operation is the record).
	awaitNoRunningExecution(t, id, 30*time.Second)
	// The freed units can be sold again: release gpu-2 and place a spot VM on it.
	if r := call(t, "POST", releasePath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2"}}); r.Status != 200 {
		t.Fatalf("release of a freed unit: %d %s", r.Status, r.Body)
	}
}

func TestAgentFailuresAreRetried(t *testing.T) {
	node := newNode(t, nil)
	agents.FailNext(node, "vm-spot-1", 2)
	id := reclaimOp(t, node)
	op := awaitOperation(t, node, id, 60*time.Second)
	if op["state"] != "completed" {
		t.Fatalf("operation: %v", op)
	}
	if n := agents.TerminateCalls(node, "vm-spot-1"); n != 3 {
		t.Errorf("vm-spot-1 got %d terminate calls, want 3 (two failures, one success)", n)
	}
	assertTerminatedOnce(t, node, "vm-spot-1", "vm-spot-2")
}

// reclaimWithDeadAgent reclaims on a fresh node whose agent fails every terminate of deadVM
// ("": of any VM) for good, and returns the node, the reclaim's id and its operation once it
// ended.
func reclaimWithDeadAgent(t *testing.T, deadVM string) (node, id string, op map[string]any) {
	t.Helper()
	node = newNode(t, nil)
	agents.FailAlways(node, deadVM, true)
	id = reclaimOp(t, node)
	return node, id, awaitOperation(t, node, id, 90*time.Second)
}

func TestPermanentAgentFailureFailsTheOperation(t *testing.T) {
	node, _, op := reclaimWithDeadAgent(t, "vm-spot-2")
	got := outcomes(op)
	if op["state"] != "failed" || got["vm-spot-1"] != "terminated" || got["vm-spot-2"] != "failed" {
		t.Fatalf("operation: %v", op)
	}
	for _, v := range op["vms"].([]any) {
		if vm := v.(map[string]any); vm["vmId"] == "vm-spot-2" && vm["error"] == "" {
			t.Error("the failed VM's outcome names no error")
		}
	}
	assertTerminatedOnce(t, node, "vm-spot-1")
	// The VM that may still run keeps its units: placement there is refused.
	r := call(t, "POST", "/v1/nodes/"+node+"/vms", keyOperator, map[string]any{"vmId": "vm-x", "orgId": "org-buyer", "tier": "spot", "unitIds": []string{"gpu-6"}})
	if r.Status != 409 {
		t.Errorf("placement on a unit of the unterminated VM: %d %s", r.Status, r.Body)
	}
}

// TestReconcilerStartsWhatTheAPICouldNot commits a reclaim whose StartExecution fails (a
// fault injected at the SDK client), then runs the reconciler function as its schedule would.
func TestReconcilerStartsWhatTheAPICouldNot(t *testing.T) {
	ctx := context.Background()
	node := newNode(t, nil)
	failing := sfnClient(func(o *sfn.Options) {
		o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
			return s.Initialize.Add(middleware.InitializeMiddlewareFunc("FailStart",
				func(context.Context, middleware.InitializeInput, middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					return middleware.InitializeOutput{}, middleware.Metadata{}, errors.New("injected: StartExecution throttled")
				}), middleware.Before)
		})
	})
	svc := &capacity.Service{Store: store, Workflow: &stepfn.Starter{Client: failing, StateMachineARN: outputs["StateMachineArn"]}}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	res, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: node, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2", "gpu-3"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("a failed start must not fail the committed reclaim: %v", err)
	}
	op, err := store.GetOperation(ctx, node, res.ReclaimID)
	if err != nil || op.State != capacity.OpPendingStart {
		t.Fatalf("operation = %+v, %v; want pending-start", op, err)
	}
	// The reconciler starts operations older than its START_AFTER; run it until it has.
	lc := lambda.NewFromConfig(stack.AWSConfig(endpoint))
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(outputs["ReconcilerFunctionName"]), Payload: []byte(`{}`)})
		if err != nil || out.FunctionError != nil {
			t.Fatalf("invoke reconciler: %v %s", err, out.Payload)
		}
		if op, _ = store.GetOperation(ctx, node, res.ReclaimID); op.State != capacity.OpPendingStart {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reconciler did not start %s: %s", res.ReclaimID, out.Payload)
		}
		time.Sleep(500 * time.Millisecond)
	}
	final := awaitOperation(t, node, res.ReclaimID, 30*time.Second)
	if final["state"] != "completed" {
		t.Fatalf("operation: %v", final)
	}
	// Starting it again (a second reconciler run, a retried start) runs nothing twice.
	if err := (&stepfn.Starter{Client: sfnClient(), StateMachineARN: outputs["StateMachineArn"]}).Start(ctx, *op); err != nil {
		t.Fatalf("second start: %v", err)
	}
	// Whatever the second start ran must have finished before "exactly once" means anything.
	awaitNoRunningExecution(t, res.ReclaimID, 30*time.Second)
	assertTerminatedOnce(t, node, "vm-spot-1", "vm-spot-2")
}

func TestConcurrentReclaimsOnTwoNodes(t *testing.T) {
	nodes := []string{newNode(t, nil), newNode(t, nil)}
	ids := make([]string, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() { ids[i] = reclaimOp(t, node) })
	}
	wg.Wait()
	for i, node := range nodes {
		if op := awaitOperation(t, node, ids[i], 30*time.Second); op["state"] != "completed" {
			t.Fatalf("node %s: %v", node, op)
		}
		assertTerminatedOnce(t, node, "vm-spot-1", "vm-spot-2")
	}
}

// TestForceEndFreesTheUnitsOfADeadAgent: a node whose agent never answers fails its
// reclaim's operation, and the evicted VMs keep their units (no placement there). Once an
// operator confirms them gone, force-ending each VM (audited, replayable under its
// Idempotency-Key, refused to anyone else) frees its units; the last one completes the
// operation, and a placement on the freed units succeeds.
func TestForceEndFreesTheUnitsOfADeadAgent(t *testing.T) {
	node, id, op := reclaimWithDeadAgent(t, "")
	if got := outcomes(op); op["state"] != "failed" || got["vm-spot-1"] != "failed" || got["vm-spot-2"] != "failed" {
		t.Fatalf("operation: %v", op)
	}
	place := func(vmID string) response {
		return call(t, http.MethodPost, "/v1/nodes/"+node+"/vms", keyOperator,
			map[string]any{"vmId": vmID, "orgId": "org-buyer", "tier": "spot", "unitIds": []string{"gpu-6"}})
	}
	if r := place("vm-new-1"); r.Status != http.StatusConflict {
		t.Fatalf("placement on a unit of the unterminated VM: %d %s", r.Status, r.Body)
	}
	forceEnd := func(vmID, key string, header ...string) response {
		return call(t, http.MethodPost, "/v1/nodes/"+node+"/reservations/"+demo.ReservationID+"/reclaims/"+id+"/vms/"+vmID+"/force-end",
			key, map[string]any{"reason": "node wiped and reimaged, ticket OPS-1234"}, header...)
	}
	if r := forceEnd("vm-spot-2", keyOwner); r.Status != http.StatusNotFound {
		t.Fatalf("force-end by the node owner: %d %s", r.Status, r.Body)
	}
	r := forceEnd("vm-spot-2", keyOperator, "Idempotency-Key", "fe-"+id)
	if r.Status != http.StatusOK {
		t.Fatalf("force-end: %d %s", r.Status, r.Body)
	}
	first := r.json(t)
	if got := outcomes(first); first["state"] != "failed" || got["vm-spot-2"] != "force-ended" || got["vm-spot-1"] != "failed" {
		t.Fatalf("after the first force-end: %s", r.Body)
	}
	if again := forceEnd("vm-spot-2", keyOperator, "Idempotency-Key", "fe-"+id); again.Status != http.StatusOK ||
		again.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.Body, r.Body) {
		t.Fatalf("replay: %d %v %s", again.Status, again.Header, again.Body)
	}
	if r := place("vm-new-2"); r.Status != http.StatusCreated {
		t.Fatalf("placement on gpu-6, freed by the force-end: %d %s", r.Status, r.Body)
	}
	r = forceEnd("vm-spot-1", keyOperator)
	if r.Status != http.StatusOK {
		t.Fatalf("second force-end: %d %s", r.Status, r.Body)
	}
	op = awaitOperation(t, node, id, time.Second)
	if got := outcomes(op); op["state"] != "completed" || got["vm-spot-1"] != "force-ended" || got["vm-spot-2"] != "force-ended" {
		t.Fatalf("operation after both force-ends: %v", op)
	}
	for _, v := range op["vms"].([]any) {
		if vm := v.(map[string]any); vm["reason"] != "node wiped and reimaged, ticket OPS-1234" {
			t.Errorf("%s carries reason %v", vm["vmId"], vm["reason"])
		}
	}
	st := loadNode(t, node)
	for _, vm := range st.VMs {
		if vm.ID == "vm-spot-1" || vm.ID == "vm-spot-2" {
			t.Errorf("%s still live: %s", vm.ID, vm.State)
		}
	}
	// The two force-ends and the replay; the owner's 404 is a route that does not exist for
	// it: no record.
	audits := map[string]int{}
	for _, rec := range auditOf(t, node) {
		if a, ok := rec["Action"].(*types.AttributeValueMemberS); ok && a.Value == capacity.ActionForceEnd {
			if o, ok := rec["Outcome"].(*types.AttributeValueMemberS); ok {
				audits[o.Value]++
			}
		}
	}
	if want := map[string]int{"ok": 2, capacity.OutcomeReplayed: 1}; !maps.Equal(audits, want) {
		t.Errorf("force-end audit records by outcome %v, want %v", audits, want)
	}
}
