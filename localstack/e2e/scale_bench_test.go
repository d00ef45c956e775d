package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/table"
)

// Sizes of BenchmarkScale (shortBenchmarks shrinks them).
const scaleClients = 8 // concurrent clients of the throughput figures

var (
	scaleReclaims  = 128 // reclaims per throughput figure, each evicting one VM
	contendRepeats = 10  // bursts of scaleClients reclaims on one node
	fanoutNodes    = 100 // the fan-out figure: victims over nodes, one reclaim per node
	fanoutVictims  = 1000
	txCeilingTxs   = 1000 // transactions of the tx-ceiling figure
)

// BenchmarkScale measures, through the gateway on the local stack (the reclaims are the
// operator's, to whom the handler's Server-Timing reports rounds):
//   - 1,000 victims over 100 nodes: the time from the reclaims' answers to the last VM
//     terminated on its node's agent;
//   - reclaims per second with 1, 4 and 16 nodes and 8 concurrent clients, each reclaim
//     evicting one VM;
//   - contention: bursts of 8 simultaneous reclaims of different units of one node, with the
//     rounds they used and the 409 rate;
//   - the emulator's ceiling: bare TransactWriteItems of 6 new items from 8 clients (the
//     emulator runs transactions one at a time, under one lock).
//
// In that order, and in a stack of its own: the emulator's Query walks every item of the
// table, so what earlier figures wrote would slow the later ones (AWS seeks the partition).
func BenchmarkScale(b *testing.B) {
	b.Run(fmt.Sprintf("fanout/victims=%d/nodes=%d", fanoutVictims, fanoutNodes), func(b *testing.B) {
		per := fanoutVictims / fanoutNodes
		for b.Loop() {
			ids := make([]string, fanoutNodes)
			for i := range ids {
				ids[i] = newNode(b, spotNode(per))
			}
			first, last := reclaimAll(b, ids, per, keyOperator)
			end := awaitTerminated(b, victimsOf(ids, per), last, 3*time.Minute)
			b.ReportMetric(ms(end.Sub(last)), "ms-last-answer-to-last-terminated")
			b.ReportMetric(ms(end.Sub(first)), "ms-first-answer-to-last-terminated")
			b.ReportMetric(ms(last.Sub(first)), "ms-first-to-last-answer")
		}
		b.ReportMetric(0, "ns/op")
	})
	for _, nodes := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("throughput/nodes=%d", nodes), func(b *testing.B) {
			for b.Loop() {
				ids := make([]string, nodes)
				for i := range ids {
					ids[i] = newNode(b, spotNode(scaleReclaims/nodes))
				}
				r := reclaimLoad(b, ids, scaleReclaims/nodes)
				// Outside the figure: the next one starts with no termination running.
				awaitTerminated(b, victimsOf(ids, scaleReclaims/nodes), time.Now(), 3*time.Minute)
				b.ReportMetric(r.perSecond, "reclaims/s")
				b.ReportMetric(r.conflictRate, "409-rate")
				b.ReportMetric(r.rounds, "rounds/reclaim")
				b.ReportMetric(r.commitP50, "commit-p50-ms")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
	b.Run("contention/clients=8/nodes=1", func(b *testing.B) {
		for b.Loop() {
			var calls, conflicts, ok, rounds, maxRounds int
			for range contendRepeats {
				node := newNode(b, spotNode(scaleClients))
				answers := burst(b, node, scaleClients)
				var evicted []victim
				for i, a := range answers {
					calls++
					switch a.Status {
					case http.StatusOK:
						ok++
						evicted = append(evicted, victim{node, fmt.Sprintf("vm-%d", i)})
						n := int(serverTiming(a.Header)["rounds"])
						rounds += n
						maxRounds = max(maxRounds, n)
					case http.StatusConflict:
						conflicts++
					default:
						b.Fatalf("reclaim: %d %s", a.Status, a.Body)
					}
				}
				awaitTerminated(b, evicted, time.Now(), time.Minute)
			}
			b.ReportMetric(float64(conflicts)/float64(calls), "409-rate")
			if ok > 0 {
				b.ReportMetric(float64(rounds)/float64(ok), "rounds/ok-reclaim")
			}
			b.ReportMetric(float64(maxRounds), "max-rounds")
		}
		b.ReportMetric(0, "ns/op")
	})
	b.Run("tx-ceiling", func(b *testing.B) {
		bareTxRate(b, scaleClients, txCeilingTxs/10, 6) // warm-up
		for b.Loop() {
			b.ReportMetric(bareTxRate(b, scaleClients, txCeilingTxs, 6), "tx/s")
		}
		b.ReportMetric(0, "ns/op")
	})
}

type loadResult struct {
	perSecond, conflictRate, rounds, commitP50 float64
}

// reclaimLoad reclaims every unit of the nodes, one unit per call, from scaleClients clients
// taking the next (node, unit) in turn over the nodes. A 409 concurrent_modification is
// retried (it is safe) and counted.
func reclaimLoad(b *testing.B, nodes []string, perNode int) loadResult {
	type job struct{ node, unit string }
	jobs := make(chan job, len(nodes)*perNode)
	for u := range perNode {
		for _, n := range nodes {
			jobs <- job{n, fmt.Sprintf("gpu-%d", u)}
		}
	}
	close(jobs)
	var calls, conflicts, rounds atomic.Int64
	var mu sync.Mutex
	var commits []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for range scaleClients {
		wg.Go(func() {
			for j := range jobs {
				for {
					r := call(b, http.MethodPost, reclaimPath(j.node), keyOperator, map[string]any{"unitIds": []string{j.unit}})
					calls.Add(1)
					if r.Status == http.StatusConflict {
						conflicts.Add(1)
						continue
					}
					if r.Status != http.StatusOK {
						b.Errorf("reclaim %s %s: %d %s", j.node, j.unit, r.Status, r.Body)
						return
					}
					st := serverTiming(r.Header)
					rounds.Add(int64(st["rounds"]))
					mu.Lock()
					commits = append(commits, time.Duration(st["commit"]*float64(time.Millisecond)))
					mu.Unlock()
					break
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	n := float64(len(nodes) * perNode)
	return loadResult{
		perSecond:    n / took.Seconds(),
		conflictRate: float64(conflicts.Load()) / float64(calls.Load()),
		rounds:       float64(rounds.Load()) / n,
		commitP50:    ms(percentile(commits, 50)),
	}
}

// burst sends n reclaims of units gpu-0..gpu-<n-1> of one node at the same instant.
func burst(b *testing.B, node string, n int) []response {
	out := make([]response, n)
	var ready, wg sync.WaitGroup
	ready.Add(1)
	for i := range n {
		wg.Go(func() {
			ready.Wait()
			out[i] = call(b, http.MethodPost, reclaimPath(node), keyOperator, map[string]any{"unitIds": []string{fmt.Sprintf("gpu-%d", i)}})
		})
	}
	ready.Done()
	wg.Wait()
	return out
}

// reclaimAll reclaims every unit of each node with key, one call per node, all at once, and
// returns when the first and the last answer came.
func reclaimAll(b *testing.B, nodes []string, perNode int, key string) (first, last time.Time) {
	units := unitIDs(perNode)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, node := range nodes {
		wg.Go(func() {
			r := call(b, http.MethodPost, reclaimPath(node), key, map[string]any{"unitIds": units})
			if r.Status != http.StatusOK {
				b.Errorf("reclaim %s: %d %s", node, r.Status, r.Body)
			}
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if first.IsZero() || now.Before(first) {
				first = now
			}
			if now.After(last) {
				last = now
			}
		})
	}
	wg.Wait()
	return first, last
}

type victim struct{ node, vm string }

// victimsOf is vm-0..vm-<perNode-1> of every node: the VMs spotNode seeds.
func victimsOf(nodes []string, perNode int) []victim {
	var out []victim
	for _, n := range nodes {
		for i := range perNode {
			out = append(out, victim{n, fmt.Sprintf("vm-%d", i)})
		}
	}
	return out
}

// awaitTerminated polls the agents until every victim is terminated, and returns when they
// were seen so.
func awaitTerminated(b *testing.B, victims []victim, from time.Time, within time.Duration) time.Time {
	deadline := from.Add(within)
	for {
		done := true
		for _, v := range victims {
			if agents.State(v.node, v.vm) != "terminated" {
				done = false
				break
			}
		}
		if done {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("victims not terminated within %s", within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// bareTxRate is the emulator's ceiling: n TransactWriteItems of items new items each, from
// clients concurrent clients, straight to the state table, per second.
func bareTxRate(b *testing.B, clients, n, items int) float64 {
	ctx := context.Background()
	run := fmt.Sprintf("BENCHTX#%d", time.Now().UnixNano())
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				tx := make([]types.TransactWriteItem, items)
				for k := range tx {
					tx[k] = types.TransactWriteItem{Put: &types.Put{
						TableName: aws.String(store.Table),
						Item: map[string]types.AttributeValue{
							table.PartitionKey: &types.AttributeValueMemberS{Value: fmt.Sprintf("%s-%d", run, i)},
							table.SortKey:      &types.AttributeValueMemberS{Value: fmt.Sprintf("ITEM#%d", k)},
						},
						ConditionExpression: aws.String("attribute_not_exists(" + table.PartitionKey + ")"),
					}}
				}
				_, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: tx})
				if err != nil {
					b.Errorf("bare transaction: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}
