package e2e

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
)

// Sizes of BenchmarkContention's flood figure (shortBenchmarks shrinks floodCalls).
var (
	floodCalls = 300 // key B's calls in each of its two runs
)

const (
	floodPace    = 20 * time.Millisecond // key B: a call every 20 ms (50 a second)
	floodClients = 4                     // key A's goroutines
	floodEach    = 40 * time.Millisecond // each sends a call every 40 ms: 100 a second in all
	floodRate    = 5                     // key A's own limit: 5 calls a second,
	floodBurst   = 5                     // burst 5
)

// floodFigures is what the flood figure measured.
type floodFigures struct {
	unloaded, loaded        []time.Duration // key B's calls, alone and beside A
	control                 []time.Duration // key B's calls beside the same stream of junk bearers
	b429, b5xx              int64
	aCalls, a429, aOK, a5xx int64
}

// floodRun measures key B, a fresh key with the environment's limit sending a steady stream
// of GETs of a reservation, first alone, then while key A, a fresh key with its own limit of
// 5 calls a second, floods the same reservation from several goroutines at 20 times its limit
// (A's calls past its limit are answered 429 before any node read), and last beside the same
// stream of calls with a junk bearer (401 before any read or write: what the local gateway
// and function cost for a call that does nothing, the floor of what any flood costs here).
func floodRun(b *testing.B) floodFigures {
	node := newNode(b, nil)
	path := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID
	keyA := newRateKey(b, map[string]any{"perSecond": float64(floodRate), "burst": float64(floodBurst)}, "bench: flood")
	keyB := newRateKey(b, nil, "bench: steady")
	var f floodFigures
	steady := func() []time.Duration {
		took := make([]time.Duration, 0, floodCalls)
		next := time.Now()
		for range floodCalls {
			time.Sleep(time.Until(next))
			next = next.Add(floodPace)
			start := time.Now()
			r := call(b, http.MethodGet, path, keyB, nil)
			took = append(took, time.Since(start))
			switch {
			case r.Status == http.StatusTooManyRequests:
				f.b429++
			case r.Status >= 500:
				f.b5xx++
			case r.Status != http.StatusOK:
				b.Fatalf("key B: %d %s", r.Status, r.Body)
			}
		}
		return took
	}
	// beside runs B's stream while floodClients goroutines send GETs with key, each
	// answered want (or 429, or 5xx), counted in calls, limited, ok and failed.
	var aCalls, a429, aOK, a5xx atomic.Int64
	beside := func(key string, want int, calls, limited, ok, failed *atomic.Int64) []time.Duration {
		done := make(chan struct{})
		var wg sync.WaitGroup
		for range floodClients {
			wg.Go(func() {
				tick := time.NewTicker(floodEach)
				defer tick.Stop()
				for {
					select {
					case <-done:
						return
					case <-tick.C:
					}
					r := call(b, http.MethodGet, path, key, nil)
					calls.Add(1)
					switch {
					case r.Status == http.StatusTooManyRequests:
						limited.Add(1)
					case r.Status == want:
						ok.Add(1)
					case r.Status >= 500:
						failed.Add(1)
					default:
						b.Errorf("flood: %d %s, want %d", r.Status, r.Body, want)
						return
					}
				}
			})
		}
		time.Sleep(time.Second) // the flood under way (A's burst spent)
		took := steady()
		close(done)
		wg.Wait()
		return took
	}
	f.unloaded = steady()
	f.loaded = beside(keyA, http.StatusOK, &aCalls, &a429, &aOK, &a5xx)
	var junkCalls, junk429, junk401, junk5xx atomic.Int64
	f.control = beside("ocap_junk", http.StatusUnauthorized, &junkCalls, &junk429, &junk401, &junk5xx)
	if junk429.Load() != 0 || junk5xx.Load() != 0 {
		b.Errorf("junk bearers: %d answered 429, %d 5xx; want 401 each", junk429.Load(), junk5xx.Load())
	}
	f.aCalls, f.a429, f.aOK, f.a5xx = aCalls.Load(), a429.Load(), aOK.Load(), a5xx.Load()
	return f
}

func reportFlood(b *testing.B, f floodFigures) {
	alone, beside := percentile(f.unloaded, 50), percentile(f.loaded, 50)
	b.ReportMetric(ms(alone), "B-alone-p50-ms")
	b.ReportMetric(ms(beside), "B-flooded-p50-ms")
	b.ReportMetric(float64(beside)/float64(alone), "B-flooded/alone-p50")
	control := percentile(f.control, 50)
	b.ReportMetric(ms(control), "B-junk-p50-ms")
	b.ReportMetric(float64(control)/float64(alone), "B-junk/alone-p50")
	b.ReportMetric(float64(beside)/float64(control), "B-flooded/junk-p50")
	b.ReportMetric(ms(percentile(f.unloaded, 99)), "B-alone-p99-ms")
	b.ReportMetric(ms(percentile(f.loaded, 99)), "B-flooded-p99-ms")
	b.ReportMetric(float64(len(f.unloaded)+len(f.loaded)+len(f.control)), "B-calls")
	b.ReportMetric(float64(f.b429), "B-429")
	b.ReportMetric(float64(f.aCalls), "A-calls")
	b.ReportMetric(float64(f.a429), "A-429")
	b.ReportMetric(float64(f.aOK), "A-200")
	b.ReportMetric(float64(f.b5xx+f.a5xx), "5xx")
}
