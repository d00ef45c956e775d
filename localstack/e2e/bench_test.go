package e2e

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
)

// BenchmarkReclaim measures a reclaim that evicts two spot VMs, end to end through API
// Gateway on the local stack, against a bare TransactWriteItems of the same items on the same
// emulator, alternating the two in one run. Each iteration gets a fresh node (not timed).
func BenchmarkReclaim(b *testing.B) {
	ctx := context.Background()
	body := map[string]any{"unitIds": []string{"gpu-2", "gpu-3"}, "reason": "bench"}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	var reclaim, bare []time.Duration
	for b.Loop() {
		node := newNode(b, nil)
		start := time.Now()
		r := call(b, http.MethodPost, reclaimPath(node), keyOwner, body)
		reclaim = append(reclaim, time.Since(start))
		if r.Status != http.StatusOK {
			b.Fatalf("reclaim: %d %s", r.Status, r.Body)
		}

		// The same decision's items, written directly.
		node = newNode(b, nil)
		st, err := store.LoadNode(ctx, node, "")
		if err != nil {
			b.Fatal(err)
		}
		req := capacity.CapacityRequest{NodeID: node, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2", "gpu-3"}}
		plan, err := capacity.DecideReclaim(owner, st, req, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		res := plan.Reservation
		res.ReleasedUnitIDs = plan.Released
		now := time.Now()
		c := capacity.Commit{
			Node: st.Node, BumpNode: true, Reservation: &res, Evict: plan.Victims,
			Operation: &capacity.Operation{ID: "rcl_" + capacity.NewID(), NodeID: node, ReservationID: res.ID, State: capacity.OpPendingStart, VMIDs: capacity.VMIDs(plan.Victims), CreatedAt: now},
			Audit:     capacity.AuditRecord{ID: capacity.NewID(), Time: now, NodeID: node, Action: capacity.ActionReclaim, Outcome: "ok"},
		}
		start = time.Now()
		if err := store.Commit(ctx, c); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(start))
	}
	p50, p99 := percentile(reclaim, 50), percentile(reclaim, 99)
	bp50 := percentile(bare, 50)
	b.ReportMetric(ms(p50), "reclaim-p50-ms")
	b.ReportMetric(ms(p99), "reclaim-p99-ms")
	b.ReportMetric(ms(bp50), "bare-tx-p50-ms")
	b.ReportMetric(float64(p50)/float64(bp50), "reclaim/bare-p50")
	b.ReportMetric(0, "ns/op") // per-op time mixes seeding with the calls; the metrics above are the figures
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
