package e2e

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/openrelay/capacity/localstack/demo"
)

// TestReclaimPlanThroughTheAPI: on the demo node (gpu-0 exclusive under a reserved VM, gpu-1
// exclusive idle, gpu-4 and gpu-5 released idle, gpu-2 under vm-spot-1, gpu-3 under vm-spot-2
// which also spans gpu-6), a plan of 5 units is refused with the 4 released units available,
// a plan of 3 takes the released idle units and evicts only vm-spot-1 (gpu-0 and gpu-1 are
// already yours, not counted), neither changes the node, and the reclaim of exactly that plan
// with its ETag in If-Match evicts what the plan said.
func TestReclaimPlanThroughTheAPI(t *testing.T) {
	node := newNode(t, nil)
	path := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaim-plan"
	before := partition(t, node)

	short := call(t, http.MethodPost, path, keyOwner, map[string]any{"count": 5})
	if m := short.json(t); short.Status != http.StatusUnprocessableEntity || m["code"] != "insufficient_units" || m["available"] != float64(4) {
		t.Fatalf("plan of 5: %d %s, want 422 insufficient_units with available 4", short.Status, short.Body)
	}
	plan := call(t, http.MethodPost, path, keyOwner, map[string]any{"count": 3, "reason": "need four", "graceSeconds": 1})
	m := plan.json(t)
	etag := plan.Header.Get("ETag")
	if plan.Status != http.StatusOK || etag == "" || m["planEtag"] != etag {
		t.Fatalf("plan of 3: %d ETag %q %s", plan.Status, etag, plan.Body)
	}
	if got := fmt.Sprint(m["unitIds"], m["alreadyYours"], m["wouldTerminate"], m["wouldSkip"]); got != "[gpu-4 gpu-5 gpu-2] [gpu-0 gpu-1] [vm-spot-1] []" {
		t.Errorf("plan of 3: units, alreadyYours, wouldTerminate, wouldSkip = %s", got)
	}
	assertUnchanged(t, node, before)

	r := call(t, http.MethodPost, reclaimPath(node), keyOwner,
		map[string]any{"unitIds": m["unitIds"], "reason": "need four", "graceSeconds": 1}, "If-Match", etag)
	if r.Status != http.StatusOK || fmt.Sprint(r.json(t)["terminated"]) != "[vm-spot-1]" {
		t.Fatalf("reclaim of the plan with If-Match: %d %s", r.Status, r.Body)
	}
	// The plan is spent: the same tag no longer names what a reclaim would do.
	again := call(t, http.MethodPost, reclaimPath(node), keyOwner,
		map[string]any{"unitIds": m["unitIds"], "reason": "need four", "graceSeconds": 1}, "If-Match", etag)
	if again.Status != http.StatusPreconditionFailed {
		t.Errorf("the spent plan's tag again: %d %s, want 412", again.Status, again.Body)
	}
}

// TestReclaimByCountChangesSomething: on the demo, the plans of 1 and 2 units (what
// `capacityctl reclaim --count` sends) choose released units, never the exclusive gpu-0 and
// gpu-1, and the reclaim of the plan takes them off the spot market.
func TestReclaimByCountChangesSomething(t *testing.T) {
	tests := []struct {
		count    int
		units    string
		released string
	}{
		{1, "[gpu-4]", "[gpu-2 gpu-3 gpu-5]"},
		{2, "[gpu-4 gpu-5]", "[gpu-2 gpu-3]"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.count), func(t *testing.T) {
			node := newNode(t, nil)
			plan := call(t, http.MethodPost, "/v1/nodes/"+node+"/reservations/"+demo.ReservationID+"/reclaim-plan", keyOwner,
				map[string]any{"count": tt.count, "reason": "by count"})
			m := plan.json(t)
			if plan.Status != http.StatusOK || fmt.Sprint(m["unitIds"]) != tt.units {
				t.Fatalf("plan of %d: %d %s, want units %s", tt.count, plan.Status, plan.Body, tt.units)
			}
			r := call(t, http.MethodPost, reclaimPath(node), keyOwner,
				map[string]any{"unitIds": m["unitIds"], "reason": "by count"}, "If-Match", plan.Header.Get("ETag"))
			if r.Status != http.StatusOK || fmt.Sprint(r.json(t)["releasedUnitIds"]) != tt.released {
				t.Fatalf("reclaim of the plan: %d %s, want released %s", r.Status, r.Body, tt.released)
			}
		})
	}
}
