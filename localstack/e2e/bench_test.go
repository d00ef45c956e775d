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
// Gateway on the local stack, against its floor: the floor function behind the same gateway
// making the same three SDK calls (the same partition Query, the same TransactWriteItems
// items, StartExecution) from inputs precomputed by the product's own store and plan, with
// no product logic (localstack/floor). Reclaim and floor alternate in one run, each on a fresh
// node (seeding is not timed), taking turns to go first. It also reports a bare
// TransactWriteItems of the same items from the benchmark itself, and the medians of the
// handler's own phases from its Server-Timing header.
func BenchmarkReclaim(b *testing.B) {
	ctx := context.Background()
	body := map[string]any{"unitIds": []string{"gpu-2", "gpu-3"}, "reason": "bench"}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	var reclaim, floorTimes, bare []time.Duration
	phases := map[string][]float64{} // Server-Timing durations of the reclaims, ms
	runReclaim := func() {
		node := newNode(b, nil)
		start := time.Now()
		r := call(b, http.MethodPost, reclaimPath(node), keyOwner, body)
		reclaim = append(reclaim, time.Since(start))
		if r.Status != http.StatusOK {
			b.Fatalf("reclaim: %d %s", r.Status, r.Body)
		}
		for name, d := range serverTimingDurations(r.Header.Get("Server-Timing")) {
			phases[name] = append(phases[name], d)
		}
	}
	runFloor := func() {
		node := newNode(b, nil)
		req := floorRequest(b, node)
		start := time.Now()
		r := call(b, http.MethodPost, floorPath(node), "", req)
		floorTimes = append(floorTimes, time.Since(start))
		if r.Status != http.StatusOK {
			b.Fatalf("floor: %d %s", r.Status, r.Body)
		}
	}
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			runReclaim()
			runFloor()
		} else {
			runFloor()
			runReclaim()
		}

		// The same decision's items, written directly.
		node := newNode(b, nil)
		st, err := store.LoadNode(ctx, node, "")
		if err != nil {
			b.Fatal(err)
		}
		req := capacity.CapacityRequest{NodeID: node, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2", "gpu-3"}, Reason: "bench"}
		plan, err := capacity.DecideReclaim(owner, st, req, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		// The audit record's call facts, as the service fills them.
		audit := capacity.AuditRecord{
			ID: capacity.NewID(), Time: now, ActorKeyID: "bench", CallerOrgID: owner.OrgID, ActingFor: st.Node.OwnerOrgID,
			Action: capacity.ActionReclaim, NodeID: node, ReservationID: req.ReservationID, UnitIDs: req.UnitIDs,
			Reason: "bench", TopologyGen: st.Node.TopologyGen,
		}
		c, _, _ := plan.Commit("rcl_"+capacity.NewID(), audit, now)
		start := time.Now()
		if err := store.Commit(ctx, *c); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(start))
	}
	p50, p99 := percentile(reclaim, 50), percentile(reclaim, 99)
	f50, f99 := percentile(floorTimes, 50), percentile(floorTimes, 99)
	bp50 := percentile(bare, 50)
	b.ReportMetric(ms(p50), "reclaim-p50-ms")
	b.ReportMetric(ms(p99), "reclaim-p99-ms")
	b.ReportMetric(ms(f50), "floor-p50-ms")
	b.ReportMetric(ms(f99), "floor-p99-ms")
	b.ReportMetric(float64(p50)/float64(f50), "reclaim/floor-p50")
	b.ReportMetric(float64(p99)/float64(f99), "reclaim/floor-p99")
	b.ReportMetric(ms(bp50), "bare-tx-p50-ms")
	b.ReportMetric(float64(p50)/float64(bp50), "reclaim/bare-p50")
	// The handler's own breakdown (medians of each phase, and of its total).
	for _, ph := range []string{capacity.PhaseAuth, capacity.PhaseLimit, capacity.PhaseRead, capacity.PhaseDecide, capacity.PhaseCommit, capacity.PhaseStart, "total"} {
		b.ReportMetric(medianMs(phases[ph]), ph+"-p50-ms")
	}
	b.ReportMetric(0, "ns/op") // per-op time mixes seeding with the calls; the metrics above are the figures
}

// shortBenchmarks makes every benchmark's sizes small: the short form (-short -benchtime 1x),
// which make test runs so that a benchmark that no longer runs fails it. Its figures are not
// judged; `make bench` runs the full sizes.
func shortBenchmarks() {
	scaleReclaims, contendRepeats, fanoutNodes, fanoutVictims, txCeilingTxs = 16, 1, 4, 16, 50
	historyCycles, historySamples = 16, 3
	terminationVictims = []int{1, 8}
	faultBenchNodes, faultBenchPerNode = 2, 2
	contentionCalls, contentionCommits = 48, 6
	floodCalls = 20
	noticeNodes, noticePerNode = 2, 2
	burstN, burstGrace = 20, 2*time.Second // the grace shape's 120 s scaled down to 2 s
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

// medianMs is the lower median of durations in ms.
func medianMs(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
