package e2e

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// BenchmarkNotice's sizes (shortBenchmarks shrinks them).
var noticeNodes, noticePerNode = 8, 8

// noticeGrace is long enough that no notice is cut off by it: the figure is the delivery's.
const noticeGrace = 10

// BenchmarkNotice measures the time from the reclaim calls' answers to the last eviction notice
// delivered to the victims' agents, for 64 VMs over 8 nodes (one reclaim with a grace per
// node, sent at once): API, Step Functions, terminate-node's notice phase, the agents.
func BenchmarkNotice(b *testing.B) {
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		nodes := make([]string, noticeNodes)
		for i := range nodes {
			nodes[i] = newNode(b, spotNode(noticePerNode))
		}
		b.StartTimer()
		lastAnswer := reclaimWithGrace(b, nodes, noticePerNode, noticeGrace)
		victims := victimsOf(nodes, noticePerNode)
		total += awaitNoticed(b, victims, lastAnswer, 30*time.Second).Sub(lastAnswer)
		b.StopTimer()
		// The terminations follow the grace; wait for them so that they do not load the next round.
		awaitTerminated(b, victims, time.Now(), 2*time.Minute)
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-last-notice")
	b.ReportMetric(0, "ns/op") // includes seeding and the grace; the metric above is the figure
}

// reclaimWithGrace reclaims every unit of each node at once with the grace, and returns when
// the last answer came.
func reclaimWithGrace(b *testing.B, nodes []string, perNode, grace int) time.Time {
	units := unitIDs(perNode)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last time.Time
	for _, node := range nodes {
		wg.Go(func() {
			r := call(b, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": units, "graceSeconds": grace})
			if r.Status != http.StatusOK {
				b.Errorf("reclaim %s: %d %s", node, r.Status, r.Body)
			}
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if now.After(last) {
				last = now
			}
		})
	}
	wg.Wait()
	return last
}

// awaitNoticed polls the agents until every victim has its notice, and returns when the last
// one arrived (as the agent recorded it).
func awaitNoticed(b *testing.B, victims []victim, from time.Time, within time.Duration) time.Time {
	deadline := from.Add(within)
	for {
		var last time.Time
		all := true
		for _, v := range victims {
			n := agents.Notices(v.node, v.vm)
			if len(n) == 0 {
				all = false
				break
			}
			if n[0].ReceivedAt.After(last) {
				last = n[0].ReceivedAt
			}
		}
		if all {
			return last
		}
		if time.Now().After(deadline) {
			b.Fatalf("not every victim noticed within %s", within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
