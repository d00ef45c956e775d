package e2e

import (
	"net/http"
	"slices"
	"testing"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/quota"
)

// TestStartThrottledLeavesOperationPendingStartUnderQuotas: with Step Functions' StartExecution
// quota modelled at a scale where its bucket holds one start and refills one every 43 s
// (CAPACITY_QUOTA_SCALE=13000 CAPACITY_QUOTA_ONLY=sfn.standard.StartExecution), the second of
// two reclaims in a row meets ThrottlingException on its start, through the SDK's retries: the
// reclaim still answers with what it evicted, and its operation waits in pending-start for the
// reconciler, as on AWS past 1,300 starts in a burst.
func TestStartThrottledLeavesOperationPendingStartUnderQuotas(t *testing.T) {
	if stackQuotas == nil || !slices.Equal(stackQuotas.Only, []quota.ID{quota.SFNStandardStart}) || stackQuotas.Scale < 13000 {
		t.Skip("needs CAPACITY_QUOTA_SCALE=13000 CAPACITY_QUOTA_ONLY=sfn.standard.StartExecution")
	}
	body := map[string]any{"unitIds": []string{"gpu-2", "gpu-3"}, "reason": "burst"}
	var states []any
	for range 2 {
		node := newNode(t, nil)
		r := call(t, http.MethodPost, reclaimPath(node), keyManager, body)
		if r.Status != http.StatusOK {
			t.Fatalf("reclaim: %d %s", r.Status, r.Body)
		}
		id, _ := r.json(t)["reclaimId"].(string)
		op := call(t, http.MethodGet, "/v1/nodes/"+node+"/reservations/"+demo.ReservationID+"/reclaims/"+id, keyManager, nil)
		if op.Status != http.StatusOK {
			t.Fatalf("GET operation: %d %s", op.Status, op.Body)
		}
		states = append(states, op.json(t)["state"])
	}
	if states[0] == "pending-start" || states[1] != "pending-start" {
		t.Fatalf("operation states %v: want the first started and the second pending-start", states)
	}
	if n := localStack.Quotas().Stats()[quota.SFNStandardStart].Throttled; n < 1 {
		t.Fatalf("the model throttled %d StartExecution calls", n)
	}
}
