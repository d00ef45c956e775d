package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/capacity"
)

// agentFaultRate is the share of terminate calls the simulated agents fail (half 500, half a
// connection dropped mid-answer) in the runs under faults.
const agentFaultRate = 0.3

// requireFaults skips a test meant for a stack whose functions run under E2E_FAULTS.
func requireFaults(t testing.TB) {
	t.Helper()
	if faultSpec == "" {
		t.Skip("needs E2E_FAULTS (make test and make bench set it for their runs under faults)")
	}
}

// faultClient tallies the answers a client had to retry under faults.
type faultClient struct {
	retries sync.Map // "<status> <code>" -> *atomic.Int64
	calls   atomic.Int64
	// retryReadErrors also retries a GET answered 500 (the benchmark, which measures time:
	// the test fails on them instead).
	retryReadErrors bool
}

// call sends a request, with Idempotency-Key idem unless it is "", and sends it again while
// the answer says that retrying is safe (503 throttled, 409 concurrent_modification), as a
// client should. It returns the final answer.
func (c *faultClient) call(t testing.TB, method, path, key string, body any, idem string) response {
	t.Helper()
	var header []string
	if idem != "" {
		header = []string{"Idempotency-Key", idem}
	}
	deadline := time.Now().Add(time.Minute)
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		c.calls.Add(1)
		r := call(t, method, path, key, body, header...)
		code := ""
		if r.Status >= 400 {
			code, _ = r.json(t)["code"].(string)
		}
		if !(r.Status == http.StatusServiceUnavailable && code == "throttled" ||
			r.Status == http.StatusConflict && code == "concurrent_modification" ||
			c.retryReadErrors && method == http.MethodGet && r.Status == http.StatusInternalServerError) {
			return r
		}
		n, _ := c.retries.LoadOrStore(fmt.Sprint(r.Status, " ", code), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if time.Now().After(deadline) {
			t.Fatalf("%s %s still %d %s after a minute of retries", method, path, r.Status, code)
		}
		time.Sleep(wait)
	}
}

func (c *faultClient) String() string {
	s := fmt.Sprintf("%d calls", c.calls.Load())
	c.retries.Range(func(k, v any) bool {
		s += fmt.Sprintf(", %d retried after %s", v.(*atomic.Int64).Load(), k)
		return true
	})
	return s
}

// runReconciler invokes the reconciler function every second, as its schedule does on AWS
// (schedules never fire on the emulator), until the returned stop is called. It starts the
// workflows of operations whose StartExecution failed under the faults.
func runReconciler(t testing.TB) (stop func() (runs, failed int)) {
	t.Helper()
	lc := lambda.NewFromConfig(stack.AWSConfig(endpoint))
	ctx, cancel := context.WithCancel(context.Background())
	var runs, failed int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			out, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(outputs["ReconcilerFunctionName"]), Payload: []byte(`{}`)})
			runs++
			if err == nil && out.FunctionError != nil {
				// A run that failed under the faults: the next one takes over, as the
				// schedule's next run would.
				failed++
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return func() (int, int) {
		cancel()
		<-done
		return runs, failed
	}
}

// awaitEnded polls the operation (retrying throttled reads) until it has ended.
func awaitEnded(t testing.TB, c *faultClient, node, reclaimID string, within time.Duration) map[string]any {
	t.Helper()
	path := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaims/" + reclaimID
	deadline := time.Now().Add(within)
	for {
		r := c.call(t, http.MethodGet, path, keyManager, nil, "")
		if r.Status != http.StatusOK {
			t.Fatalf("GET operation %s: %d %s", reclaimID, r.Status, r.Body)
		}
		op := r.json(t)
		if op["state"] == "completed" || op["state"] == "failed" {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s still %s after %s: %s", reclaimID, op["state"], within, r.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestMainFlowsUnderFaults runs the main flows through API Gateway while the stack's
// functions get AWS's faults (E2E_FAULTS: transaction conflicts, throttling, ...) and the
// node agents fail 30% of terminate calls: on three nodes at once, three times over, release
// units, place spot VMs on them, dry-run and reclaim them, and follow the termination to its
// end, with the reconciler running as its schedule would. A client retries what the API says
// is safe to retry (with its Idempotency-Key); every other answer must be the one it would
// be without faults. Afterwards no outcome is lost, no VM was evicted or terminated twice,
// each call was applied once, and every invariant holds.
func TestMainFlowsUnderFaults(t *testing.T) {
	requireFaults(t)
	const nodes, cycles = 3, 3
	c := &faultClient{}
	stopReconciler := runReconciler(t)
	ids := make([]string, nodes)
	for i := range ids {
		ids[i] = newNode(t, nil)
		agents.SetFaultRate(ids[i], "", agentFaultRate)
	}
	faultsBefore := agents.RandomFaults()
	t.Run("nodes", func(t *testing.T) {
		for _, node := range ids {
			t.Run(node, func(t *testing.T) {
				t.Parallel()
				flowsUnderFaults(t, c, node, cycles)
			})
		}
	})
	runs, failed := stopReconciler()
	t.Logf("client: %s; agents failed %d terminate calls; reconciler: %d runs, %d failed", c, agents.RandomFaults()-faultsBefore, runs, failed)
	if agents.RandomFaults() == faultsBefore {
		t.Error("the agents failed no call: the agent faults were not exercised")
	}
	for _, node := range ids {
		st := loadNode(t, node)
		for _, v := range capacity.Violations(st, time.Now()) {
			t.Errorf("node %s: %s", node, v)
		}
		for _, vm := range st.VMs {
			if vm.State == capacity.VMTerminating {
				t.Errorf("node %s: VM %s still terminating after every operation ended", node, vm.ID)
			}
		}
		for _, vm := range []string{"vm-res-1", "vm-od-1"} {
			if n := agents.TerminateCalls(node, vm); n != 0 {
				t.Errorf("node %s: skipped VM %s got %d terminate calls", node, vm, n)
			}
		}
		// Each call that succeeded was applied once: one successful audit record each, however
		// many times the client or the SDK sent it.
		want := map[string]int{capacity.ActionReclaim: cycles, capacity.ActionRelease: cycles - 1, capacity.ActionPlace: 2 * cycles}
		if got := auditOK(t, node); !maps.Equal(got, want) {
			t.Errorf("node %s: successful audit records %v, want %v", node, got, want)
		}
	}
}

// flowsUnderFaults runs the cycles on one node. The demo node has gpu-2..gpu-5 released, with
// vm-spot-1 on gpu-2 and vm-spot-2 on gpu-3 (and gpu-6).
func flowsUnderFaults(t *testing.T, c *faultClient, node string, cycles int) {
	units := []string{"gpu-2", "gpu-3", "gpu-4", "gpu-5"}
	victims := []string{"vm-spot-1", "vm-spot-2"}
	for k := range cycles {
		if k > 0 {
			r := c.call(t, http.MethodPost, releasePath(node), keyOwner, map[string]any{"unitIds": units}, fmt.Sprintf("rel-%d", k))
			if r.Status != http.StatusOK || !slices.Equal(sorted(strs(r.json(t)["releasedUnitIds"])), units) {
				t.Fatalf("node %s cycle %d: release: %d %s", node, k, r.Status, r.Body)
			}
		}
		for i, unit := range []string{"gpu-4", "gpu-5"} {
			vm := fmt.Sprintf("vm-f%d-%d", k, i)
			r := c.call(t, http.MethodPost, "/v1/nodes/"+node+"/vms", keyOperator,
				map[string]any{"vmId": vm, "orgId": demo.OrgBuyer, "tier": "spot", "unitIds": []string{unit}}, "place-"+vm)
			if r.Status != http.StatusCreated {
				t.Fatalf("node %s cycle %d: place %s: %d %s", node, k, vm, r.Status, r.Body)
			}
			if err := agents.AddVM(node, vm, "running"); err != nil {
				t.Fatal(err)
			}
			victims = append(victims, vm)
		}
		slices.Sort(victims)

		dry := c.call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": units, "dryRun": true}, "")
		if dry.Status != http.StatusOK || !slices.Equal(sorted(strs(dry.json(t)["wouldTerminate"])), victims) {
			t.Fatalf("node %s cycle %d: dry run: %d %s, want wouldTerminate %v", node, k, dry.Status, dry.Body, victims)
		}
		r := c.call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": units, "reason": "faults"}, fmt.Sprintf("rcl-%d", k))
		if r.Status != http.StatusOK {
			t.Fatalf("node %s cycle %d: reclaim: %d %s", node, k, r.Status, r.Body)
		}
		body := r.json(t)
		// An answer lost after its commit and retried still names the VMs that call evicted.
		if got := sorted(strs(body["terminated"])); !slices.Equal(got, victims) {
			t.Fatalf("node %s cycle %d: reclaim answered terminated %v, want %v", node, k, got, victims)
		}
		id, _ := body["reclaimId"].(string)
		op := awaitEnded(t, c, node, id, 90*time.Second)
		got := outcomes(op)
		if op["state"] != "completed" || !slices.Equal(slices.Sorted(maps.Keys(got)), victims) {
			t.Fatalf("node %s cycle %d: operation %s ended %s with outcomes %v, want completed with one per %v", node, k, id, op["state"], got, victims)
		}
		for _, vm := range victims {
			if o := got[vm]; o != "terminated" && o != "already-gone" {
				t.Errorf("node %s: %s ended %s", node, vm, o)
			}
			if n := agents.Terminations(node, vm); n != 1 || agents.State(node, vm) != "terminated" {
				t.Errorf("node %s: %s terminated %d times, agent state %s; want once", node, vm, n, agents.State(node, vm))
			}
		}
		victims = victims[:0]
	}
}

// auditOK counts a node's audit records of successful calls, by action.
func auditOK(t testing.TB, node string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, it := range auditOf(t, node) {
		action, _ := it["Action"].(*types.AttributeValueMemberS)
		outcome, _ := it["Outcome"].(*types.AttributeValueMemberS)
		dry, _ := it["DryRun"].(*types.AttributeValueMemberBOOL)
		if action != nil && outcome != nil && outcome.Value == "ok" && (dry == nil || !dry.Value) {
			out[action.Value]++
		}
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// BenchmarkTerminationUnderFaults's sizes (shortBenchmarks shrinks them).
var faultBenchNodes, faultBenchPerNode = 8, 8

// BenchmarkTerminationUnderFaults measures a 64-VM reclaim over 8 nodes (one reclaim per
// node, sent at once) while the stack's functions get E2E_FAULTS and the agents fail 30% of
// terminate calls: the time from the first reclaim sent to the last of the 8 operations
// completed, with all 64 outcomes recorded. Reclaims answered "retry" are retried with their
// Idempotency-Key, as a client should.
func BenchmarkTerminationUnderFaults(b *testing.B) {
	requireFaults(b)
	nodes, perNode := faultBenchNodes, faultBenchPerNode
	c := &faultClient{retryReadErrors: true}
	stopReconciler := runReconciler(b)
	faultsBefore := agents.RandomFaults()
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		ids := make([]string, nodes)
		for i := range ids {
			ids[i] = newNode(b, spotNode(perNode))
			agents.SetFaultRate(ids[i], "", agentFaultRate)
		}
		units := unitIDs(perNode)
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		var outcomesSeen atomic.Int64
		for _, node := range ids {
			wg.Go(func() {
				r := c.call(b, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": units}, "bench-"+node)
				if r.Status != http.StatusOK || len(strs(r.json(b)["terminated"])) != perNode {
					b.Errorf("reclaim on %s: %d %s", node, r.Status, r.Body)
					return
				}
				op := awaitEnded(b, c, node, r.json(b)["reclaimId"].(string), 4*time.Minute)
				got := outcomes(op)
				if op["state"] != "completed" || len(got) != perNode {
					b.Errorf("operation on %s ended %s with %d outcomes, want completed with %d: %v", node, op["state"], len(got), perNode, got)
				}
				outcomesSeen.Add(int64(len(got)))
			})
		}
		wg.Wait()
		total += time.Since(start)
		if n := outcomesSeen.Load(); n != int64(nodes*perNode) {
			b.Fatalf("%d outcomes, want %d", n, nodes*perNode)
		}
	}
	runs, failed := stopReconciler()
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-completed")
	b.ReportMetric(float64(agents.RandomFaults()-faultsBefore)/float64(b.N), "agent-faults/op")
	b.ReportMetric(0, "ns/op") // includes seeding; the metric above is the figure
	b.Logf("client: %s; reconciler: %d runs, %d failed", c, runs, failed)
}
