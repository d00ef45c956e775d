package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// Sizes of BenchmarkHistory: the node's age in cycles, and the reclaims measured at each age
// (shortBenchmarks shrinks them).
const historyUnits = 8

var (
	historyCycles  = 1000
	historySamples = 30
)

// BenchmarkHistory compares, in one run, reclaims on a fresh node with reclaims on the same
// node after historyCycles cycles of place, reclaim, terminate and release through the
// gateway: reclaim p50, and items and bytes read per reclaim (from the handler's
// Server-Timing, which reports reads to operators: the reclaims are the operator's). Every
// measured reclaim has the same shape: all units released, one spot VM on gpu-0, reclaim
// gpu-0 (timed), then its operation ends and gpu-0 is released (untimed), so the ages differ
// only by the node's history.
//
// The emulator's Query walks every item of the table, not only the partition (AWS seeks the
// partition), so its read time grows with everything the run has written. The "twin" figures
// therefore also compare the aged node with a fresh node measured at the same moment
// (samples alternating), on a table of the same size: that ratio is the layout's alone.
func BenchmarkHistory(b *testing.B) {
	for b.Loop() {
		aged := &historyRun{b: b, node: newNode(b, releasedNode(historyUnits))}
		fresh := measure(aged)[0]
		start := time.Now()
		aged.age(historyCycles)
		b.Logf("aged node %s by %d cycles in %s", aged.node, historyCycles, time.Since(start).Round(time.Second))
		twin := &historyRun{b: b, node: newNode(b, releasedNode(historyUnits))}
		figs := measure(aged, twin)
		report(b, "fresh", fresh, figs[0])
		report(b, "twin", figs[1], figs[0])
	}
	b.ReportMetric(0, "ns/op") // per-op time is the aging; the metrics above are the figures
}

// report reports the aged node's figures against a fresh node's, named by what the fresh
// node is ("fresh": the same node before aging; "twin": a new node measured alongside).
func report(b *testing.B, name string, fresh, aged historyFigures) {
	b.ReportMetric(ms(fresh.p50), name+"-p50-ms")
	b.ReportMetric(ms(aged.p50), "aged-p50-ms")
	b.ReportMetric(float64(aged.p50)/float64(fresh.p50), "aged/"+name+"-p50")
	b.ReportMetric(fresh.items, name+"-items/reclaim")
	b.ReportMetric(aged.items, "aged-items/reclaim")
	b.ReportMetric(aged.items/fresh.items, "aged/"+name+"-items")
	b.ReportMetric(fresh.bytes, name+"-bytes/reclaim")
	b.ReportMetric(aged.bytes, "aged-bytes/reclaim")
	b.ReportMetric(aged.bytes/fresh.bytes, "aged/"+name+"-bytes")
	// Where the time goes, from the handler's Server-Timing (p50 of each phase).
	for _, ph := range []string{capacity.PhaseRead, capacity.PhaseCommit} {
		b.ReportMetric(fresh.phases[ph], name+"-"+ph+"-p50-ms")
		b.ReportMetric(aged.phases[ph], "aged-"+ph+"-p50-ms")
	}
}

// releasedNode makes a node of n units, all reserved by the demo reservation and released to
// spot, with no VM.
func releasedNode(n int) func(*dynamo.Seed) {
	return func(s *dynamo.Seed) {
		units := unitIDs(n)
		s.VMs = nil
		s.Nodes[0].UnitIDs = units
		s.Reservations[0].ReservedUnitIDs = units
		s.Reservations[0].ReleasedUnitIDs = units
	}
}

type historyRun struct {
	b      *testing.B
	node   string
	vms    int  // VMs placed so far: each gets a new id
	logged bool // logOnce has logged
}

func (h *historyRun) logOnce(msg string) {
	if !h.logged {
		h.b.Logf("node %s: %s", h.node, msg)
		h.logged = true
	}
}

type historyFigures struct {
	p50          time.Duration
	items, bytes float64            // medians per reclaim
	phases       map[string]float64 // handler phase -> p50 ms (Server-Timing)
}

// measure runs historySamples reclaims of the same shape on each node, the nodes' samples
// alternating, and returns each node's figures.
func measure(runs ...*historyRun) []historyFigures {
	took := make([][]time.Duration, len(runs))
	items, bytes := make([][]float64, len(runs)), make([][]float64, len(runs))
	phases := make([]map[string][]float64, len(runs))
	for i := range phases {
		phases[i] = map[string][]float64{}
	}
	for range historySamples {
		for i, h := range runs {
			vm := h.place("gpu-0")
			start := time.Now()
			r := call(h.b, http.MethodPost, reclaimPath(h.node), keyOperator, map[string]any{"unitIds": []string{"gpu-0"}})
			took[i] = append(took[i], time.Since(start))
			for ph, v := range serverTiming(r.Header) {
				phases[i][ph] = append(phases[i][ph], v)
			}
			id := h.reclaimed(r, vm)
			it, by := h.readCost(r)
			items[i], bytes[i] = append(items[i], it), append(bytes[i], by)
			awaitCompleted(h.b, h.node, id)
			h.release("gpu-0")
		}
	}
	out := make([]historyFigures, len(runs))
	for i := range runs {
		out[i] = historyFigures{p50: percentile(took[i], 50), items: median(items[i]), bytes: median(bytes[i]), phases: map[string]float64{}}
		for ph, v := range phases[i] {
			out[i].phases[ph] = median(v)
		}
	}
	return out
}

// age runs n cycles of place, reclaim, terminate and release, over the node's units in turn
// so that the terminations of up to historyUnits reclaims overlap with the calls.
func (h *historyRun) age(n int) {
	pending := make([]string, historyUnits) // per unit: the reclaim whose operation has not ended
	for i := range n {
		u := i % historyUnits
		unit := fmt.Sprintf("gpu-%d", u)
		if pending[u] != "" {
			awaitCompleted(h.b, h.node, pending[u])
			h.release(unit)
		}
		vm := h.place(unit)
		r := call(h.b, http.MethodPost, reclaimPath(h.node), keyOperator, map[string]any{"unitIds": []string{unit}})
		pending[u] = h.reclaimed(r, vm)
	}
	for u, id := range pending {
		if id != "" {
			awaitCompleted(h.b, h.node, id)
			h.release(fmt.Sprintf("gpu-%d", u))
		}
	}
}

// place places a spot VM with a new id on unit, on the node and on its agent.
func (h *historyRun) place(unit string) string {
	h.vms++
	vm := fmt.Sprintf("vm-h-%d", h.vms)
	r := call(h.b, http.MethodPost, "/v1/nodes/"+h.node+"/vms", keyOperator,
		map[string]any{"vmId": vm, "orgId": demo.OrgBuyer, "tier": "spot", "unitIds": []string{unit}})
	if r.Status != http.StatusCreated {
		h.b.Fatalf("place %s on %s: %d %s", vm, unit, r.Status, r.Body)
	}
	if err := agents.AddVM(h.node, vm, "running"); err != nil {
		h.b.Fatal(err)
	}
	return vm
}

// reclaimed checks that a reclaim evicted exactly vm and returns its reclaim id.
func (h *historyRun) reclaimed(r response, vm string) string {
	if r.Status != http.StatusOK {
		h.b.Fatalf("reclaim: %d %s", r.Status, r.Body)
	}
	body := r.json(h.b)
	if got, _ := body["terminated"].([]any); len(got) != 1 || got[0] != vm {
		h.b.Fatalf("reclaim evicted %v, want [%s]: %s", body["terminated"], vm, r.Body)
	}
	return body["reclaimId"].(string)
}

func (h *historyRun) release(unit string) {
	r := call(h.b, http.MethodPost, releasePath(h.node), keyOwner, map[string]any{"unitIds": []string{unit}})
	if r.Status != http.StatusOK {
		h.b.Fatalf("release %s: %d %s", unit, r.Status, r.Body)
	}
}

// readCost returns the items and bytes a reclaim read: from the handler's Server-Timing; without it (a stack that does not report reads), what the node's
// decision read returns now, measured by the store (CallStats), or failing that by a Query of
// the node's whole partition, which is what a read keyed on the partition alone is charged.
func (h *historyRun) readCost(r response) (items, bytes float64) {
	st := serverTiming(r.Header)
	if it, ok := st["items"]; ok && it > 0 {
		return it, st["bytes"]
	}
	ctx, stats := capacity.WithCallStats(context.Background())
	if _, err := store.LoadNode(ctx, h.node, ""); err != nil {
		h.b.Fatal(err)
	}
	if s := stats.Snapshot(); s.ItemsRead > 0 {
		h.logOnce("items and bytes read from the store's LoadNode: the answer has no Server-Timing reads")
		return float64(s.ItemsRead), float64(s.BytesRead)
	}
	all := partition(h.b, h.node)
	n := 0
	for _, item := range all {
		n += dynamo.ItemSize(item)
	}
	h.logOnce("items and bytes read from a Query of the whole partition: no Server-Timing reads, store not counting")
	return float64(len(all)), float64(n)
}

// awaitCompleted polls the reclaim operation until it has completed; a failed one fails b.
func awaitCompleted(b testing.TB, node, reclaimID string) {
	b.Helper()
	path := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaims/" + reclaimID
	deadline := time.Now().Add(time.Minute)
	for {
		r := call(b, http.MethodGet, path, keyManager, nil)
		if r.Status != http.StatusOK {
			b.Fatalf("GET operation: %d %s", r.Status, r.Body)
		}
		switch state := r.json(b)["state"]; state {
		case "completed":
			return
		case "failed":
			b.Fatalf("operation %s failed: %s", reclaimID, r.Body)
		}
		if time.Now().After(deadline) {
			b.Fatalf("operation %s not ended within a minute: %s", reclaimID, r.Body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverTiming parses a Server-Timing header into metric -> value: the dur when there is
// one, else a numeric desc (the handler's items, bytes and rounds).
func serverTiming(h http.Header) map[string]float64 {
	out := map[string]float64{}
	for _, line := range h.Values("Server-Timing") {
		for metric := range strings.SplitSeq(line, ",") {
			fields := strings.Split(strings.TrimSpace(metric), ";")
			name := strings.TrimSpace(fields[0])
			var dur, desc string
			for _, p := range fields[1:] {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				switch strings.TrimSpace(k) {
				case "dur":
					dur = v
				case "desc":
					desc = strings.Trim(v, `"`)
				}
			}
			if v, err := strconv.ParseFloat(dur, 64); err == nil {
				out[name] = v
			} else if v, err := strconv.ParseFloat(desc, 64); err == nil {
				out[name] = v
			}
		}
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
