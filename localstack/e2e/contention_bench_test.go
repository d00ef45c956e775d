package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// Sizes of BenchmarkContention (shortBenchmarks shrinks them).
const (
	contentionClients = 8  // clients of the own-unit figure, one unit each
	contentionNoise   = 16 // clients beside the writer
)

var (
	contentionCalls   = 2000 // calls of the own-unit figure, at least
	contentionCommits = 200  // the writer's commits, alone and beside the noise
)

// BenchmarkContention measures what clients of one node see of each other, through the
// gateway on the local stack, as counts and ratios (it judges none of them):
//
//   - own-units: 8 clients, each on its own unit of one node, each cycling release, spot
//     placement and reclaim of its unit (the next cycle once the reclaim's operation has
//     completed), for at least 2,000 calls: the 409s and 5xx they were answered (no client
//     touches another's unit, so a 409 would be a call that lost to the node's other commits
//     past its retry budget), the commit rounds per answered call and the most one call
//     used, and the node's invariants at the end (capacity.Violations);
//   - writer: one writer alternating release and reclaim of one unit, alone on a fresh node,
//     then on another beside 16 clients sending dry-run reclaims and refused releases at that
//     node (each appends an audit record to the node): the writer's rounds per commit and its
//     409s in both.
//   - flood: key B's steady stream of GETs at a node, alone and while key A floods it far above
//     A's own rate limit (flood_bench_test.go): B's 429s (none expected) and p50 flooded/alone,
//     A's calls and 429s.
//
// Rounds come from the handler's Server-Timing, which reports them to operators on answered
// calls: every call here is the operator's. A 409 concurrent_modification spent the call's
// retry budget (docs/architecture.md). A call answered 409 or 5xx is sent again with its
// Idempotency-Key (safe), so each client's cycle goes on.
func BenchmarkContention(b *testing.B) {
	b.Run(fmt.Sprintf("own-units/clients=%d", contentionClients), func(b *testing.B) {
		for b.Loop() {
			benchOwnUnits(b)
		}
		b.ReportMetric(0, "ns/op") // the figures are the counts and ratios
	})
	b.Run(fmt.Sprintf("writer/noise=%d", contentionNoise), func(b *testing.B) {
		for b.Loop() {
			alone := writerRun(b, 0)
			beside := writerRun(b, contentionNoise)
			b.ReportMetric(alone.roundsPerCommit(), "alone-rounds/commit")
			b.ReportMetric(beside.roundsPerCommit(), "beside-rounds/commit")
			b.ReportMetric(beside.roundsPerCommit()/alone.roundsPerCommit(), "beside/alone-rounds")
			b.ReportMetric(float64(alone.conflicts), "alone-409")
			b.ReportMetric(float64(beside.conflicts), "beside-409")
			b.ReportMetric(float64(alone.serverErrors+beside.serverErrors), "writer-5xx")
			b.ReportMetric(ms(percentile(alone.took, 50)), "alone-commit-p50-ms")
			b.ReportMetric(ms(percentile(beside.took, 50)), "beside-commit-p50-ms")
			b.ReportMetric(float64(beside.noiseCalls), "noise-calls")
			b.ReportMetric(float64(beside.noiseServerErrors), "noise-5xx")
		}
		b.ReportMetric(0, "ns/op")
	})
	b.Run(fmt.Sprintf("flood/clients=%d", floodClients), func(b *testing.B) {
		for b.Loop() {
			reportFlood(b, floodRun(b))
		}
		b.ReportMetric(0, "ns/op")
	})
}

// tally counts what one or more clients' calls were answered.
type tally struct {
	calls, ok, conflicts, serverErrors, rounds, maxRounds atomic.Int64
}

// send makes one logical call until it is answered want, sending it again after a 409 or a
// 5xx (with the same Idempotency-Key, so a retry is safe), and returns the answer. Any other
// answer fails b: the benchmark's calls are all valid.
func (t *tally) send(b *testing.B, path string, body any, want int) response {
	key := "bench-" + capacity.NewID()
	for {
		r := call(b, http.MethodPost, path, keyOperator, body, "Idempotency-Key", key)
		t.calls.Add(1)
		switch {
		case r.Status == want:
			t.ok.Add(1)
			n := int64(serverTiming(r.Header)["rounds"])
			t.rounds.Add(n)
			for m := t.maxRounds.Load(); n > m; m = t.maxRounds.Load() {
				if t.maxRounds.CompareAndSwap(m, n) {
					break
				}
			}
			return r
		case r.Status == http.StatusConflict:
			t.conflicts.Add(1)
		case r.Status >= 500:
			t.serverErrors.Add(1)
		default:
			b.Fatalf("POST %s: %d %s", path, r.Status, r.Body)
		}
	}
}

// benchOwnUnits runs the own-units figure on a fresh node and reports it.
func benchOwnUnits(b *testing.B) {
	node := newNode(b, reservedNode(contentionClients))
	var t tally
	var wg sync.WaitGroup
	for c := range contentionClients {
		wg.Go(func() {
			unit := fmt.Sprintf("gpu-%d", c)
			units := map[string]any{"unitIds": []string{unit}}
			for n := 0; t.calls.Load() < int64(contentionCalls); n++ {
				t.send(b, releasePath(node), units, http.StatusOK)
				vm := fmt.Sprintf("vm-c%d-%d", c, n)
				t.send(b, "/v1/nodes/"+node+"/vms", map[string]any{
					"vmId": vm, "orgId": demo.OrgBuyer, "tier": "spot", "unitIds": []string{unit}}, http.StatusCreated)
				if err := agents.AddVM(node, vm, "running"); err != nil {
					b.Error(err)
					return
				}
				r := t.send(b, reclaimPath(node), units, http.StatusOK)
				id, _ := r.json(b)["reclaimId"].(string)
				awaitCompleted(b, node, id)
			}
		})
	}
	wg.Wait()
	violations := capacity.Violations(loadNode(b, node), time.Now())
	for _, v := range violations {
		b.Errorf("node %s after the run: %s", node, v)
	}
	calls := float64(t.calls.Load())
	b.ReportMetric(calls, "calls")
	b.ReportMetric(float64(t.conflicts.Load()), "409")
	b.ReportMetric(float64(t.conflicts.Load())/calls, "409/call")
	b.ReportMetric(float64(t.serverErrors.Load()), "5xx")
	b.ReportMetric(float64(t.rounds.Load())/float64(t.ok.Load()), "rounds/answered-call")
	b.ReportMetric(float64(t.maxRounds.Load()), "max-rounds")
	b.ReportMetric(float64(len(violations)), "invariant-violations")
}

// reservedNode makes a node of n units, all reserved by the demo reservation and none
// released, with no VM.
func reservedNode(n int) func(*dynamo.Seed) {
	return func(s *dynamo.Seed) {
		releasedNode(n)(s)
		s.Reservations[0].ReleasedUnitIDs = nil
	}
}

type writerFigures struct {
	commits, rounds, conflicts, serverErrors int64
	took                                     []time.Duration // per commit, retries included
	noiseCalls, noiseServerErrors            int64
}

func (w writerFigures) roundsPerCommit() float64 { return float64(w.rounds) / float64(w.commits) }

// writerRun has one writer commit contentionCommits times on a fresh demo node, alternating a
// release and a reclaim of gpu-1 (reserved, idle), while noise clients send, until it is done,
// dry-run reclaims of gpu-2 and releases of gpu-0 (under a reserved VM: refused).
func writerRun(b *testing.B, noise int) writerFigures {
	node := newNode(b, nil)
	done := make(chan struct{})
	var noiseCalls, noiseServerErrors atomic.Int64
	var wg sync.WaitGroup
	for c := range noise {
		wg.Go(func() {
			path, key, body, want := reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2"}, "dryRun": true}, http.StatusOK
			if c%2 == 1 {
				path, body, want = releasePath(node), map[string]any{"unitIds": []string{"gpu-0"}}, http.StatusConflict
			}
			for {
				select {
				case <-done:
					return
				default:
				}
				r := call(b, http.MethodPost, path, key, body)
				noiseCalls.Add(1)
				switch {
				case r.Status >= 500:
					noiseServerErrors.Add(1)
				case r.Status != want:
					b.Errorf("noise POST %s: %d %s, want %d", path, r.Status, r.Body, want)
					return
				}
			}
		})
	}
	var t tally
	var took []time.Duration
	units := map[string]any{"unitIds": []string{"gpu-1"}}
	for i := range contentionCommits {
		path := releasePath(node)
		if i%2 == 1 {
			path = reclaimPath(node)
		}
		start := time.Now()
		t.send(b, path, units, http.StatusOK)
		took = append(took, time.Since(start))
	}
	close(done)
	wg.Wait()
	return writerFigures{
		commits: t.ok.Load(), rounds: t.rounds.Load(), conflicts: t.conflicts.Load(), serverErrors: t.serverErrors.Load(),
		took: took, noiseCalls: noiseCalls.Load(), noiseServerErrors: noiseServerErrors.Load(),
	}
}
