package e2e

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// TestRaceThroughAPIGateway sends reclaims, releases and spot placements for one node from 50
// goroutines through API Gateway for a few seconds. Every call must get 200/201 or a clear
// 409, and afterwards every invariant holds.
func TestRaceThroughAPIGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	const workers, duration = 50, 3 * time.Second
	node := newNode(t, nil)
	units := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}
	reserved := units[:6]

	type outcome struct {
		op     string
		status int
		code   string
	}
	var (
		mu      sync.Mutex
		tally   = map[outcome]int{}
		evicted = map[string]string{} // VM -> reclaim that reported it terminated
		dup     []string
	)
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			pick := func(from []string) []string {
				var out []string
				for _, i := range rng.Perm(len(from))[:1+rng.IntN(2)] {
					out = append(out, from[i])
				}
				return out
			}
			for n := 0; time.Now().Before(deadline); n++ {
				var op string
				var r response
				switch rng.IntN(3) {
				case 0:
					op = "reclaim"
					r = call(t, "POST", reclaimPath(node), keyOwner, map[string]any{"unitIds": pick(reserved)})
				case 1:
					op = "release"
					r = call(t, "POST", releasePath(node), keyManager, map[string]any{"unitIds": pick(reserved)})
				default:
					op = "place"
					r = call(t, "POST", "/v1/nodes/"+node+"/vms", keyOperator, map[string]any{
						"vmId": fmt.Sprintf("vm-r%d-%d", w, n), "orgId": "org-buyer", "tier": "spot", "unitIds": pick(units)})
				}
				o := outcome{op: op, status: r.Status}
				if r.Status >= 300 {
					o.code, _ = r.json(t)["code"].(string)
				}
				mu.Lock()
				tally[o]++
				if op == "reclaim" && r.Status == 200 {
					body := r.json(t)
					for _, vm := range strs(body["terminated"]) {
						if prev, ok := evicted[vm]; ok {
							dup = append(dup, fmt.Sprintf("%s by %s and %s", vm, prev, body["reclaimId"]))
						}
						evicted[vm] = body["reclaimId"].(string)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("outcomes: %v", tally)
	ok := 0
	for o, n := range tally {
		switch {
		case o.status == 200 || o.status == 201:
			ok += n
		case o.status == 409:
		default:
			t.Errorf("%d %s calls got %d %s: every call must succeed or get a clear 409", n, o.op, o.status, o.code)
		}
	}
	if ok == 0 {
		t.Fatal("no call succeeded")
	}
	for _, d := range dup {
		t.Errorf("VM terminated twice: %s", d)
	}
	st := loadNode(t, node)
	for _, v := range capacity.Violations(st, time.Now()) {
		t.Error(v)
	}
	for _, vm := range st.VMs {
		if vm.State == capacity.VMTerminating && evicted[vm.ID] != vm.ReclaimID {
			t.Errorf("VM %s is terminating for %s; callers were told %q", vm.ID, vm.ReclaimID, evicted[vm.ID])
		}
	}
	// Every VM a reclaim reported terminated ends terminated, by the operation that reported it.
	ops := map[string]bool{}
	for _, op := range evicted {
		ops[op] = true
	}
	for id := range ops {
		op := awaitOperation(t, node, id, 60*time.Second)
		if op["state"] != "completed" {
			t.Errorf("operation %s ended %s", id, op["state"])
		}
		for vm, outcome := range outcomes(op) {
			if evicted[vm] != id || (outcome != "terminated" && outcome != "already-gone") {
				t.Errorf("operation %s: VM %s ended %s (reported by %q)", id, vm, outcome, evicted[vm])
			}
		}
	}
	if st = loadNode(t, node); len(capacity.Violations(st, time.Now())) > 0 {
		t.Errorf("after the terminations: %v", capacity.Violations(st, time.Now()))
	}
	for _, vm := range st.VMs {
		if vm.State == capacity.VMTerminating {
			t.Errorf("VM %s still terminating after every operation ended", vm.ID)
		}
	}
}
