package e2e

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/openrelay/capacity/localstack/demo"
)

// TestReclaimPlanThroughTheAPI: on the demo node (gpu-0 under a reserved VM, gpu-1 exclusive
// idle, gpu-4 and gpu-5 released idle, gpu-2 under vm-spot-1, gpu-3 under vm-spot-2 which also
// spans gpu-6), a plan of 6 units is refused with the 5 available, a plan of 4 takes the idle
// units and evicts only vm-spot-1, neither changes the node, and the reclaim of exactly that
// plan with its ETag in If-Match evicts what the plan said.
func TestReclaimPlanThroughTheAPI(t *testing.T) {
	node := newNode(t, nil)
	path := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaim-plan"
	before := partition(t, node)

	short := call(t, http.MethodPost, path, keyOwner, map[string]any{"count": 6})
	if m := short.json(t); short.Status != http.StatusUnprocessableEntity || m["code"] != "insufficient_units" || m["available"] != float64(5) {
		t.Fatalf("plan of 6: %d %s, want 422 insufficient_units with available 5", short.Status, short.Body)
	}
	plan := call(t, http.MethodPost, path, keyOwner, map[string]any{"count": 4, "reason": "need four", "graceSeconds": 1})
	m := plan.json(t)
	etag := plan.Header.Get("ETag")
	if plan.Status != http.StatusOK || etag == "" || m["planEtag"] != etag {
		t.Fatalf("plan of 4: %d ETag %q %s", plan.Status, etag, plan.Body)
	}
	if got := fmt.Sprint(m["unitIds"], m["wouldTerminate"], m["wouldSkip"]); got != "[gpu-1 gpu-4 gpu-5 gpu-2] [vm-spot-1] []" {
		t.Errorf("plan of 4: units, wouldTerminate, wouldSkip = %s", got)
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
