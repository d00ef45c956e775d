package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// terminationVictims are BenchmarkTermination's sizes (shortBenchmarks shrinks them).
var terminationVictims = []int{1, 8, 64}

// BenchmarkTermination measures the time from the reclaim calls returning to the last
// victim terminated on its node's agent, through the whole local stack (API Gateway, API
// function, DynamoDB, Step Functions, terminate-node, agent), for 1, 8 and 64 victims spread
// over 1 and 8 nodes (one reclaim per node, sent at once).
func BenchmarkTermination(b *testing.B) {
	for _, nodes := range []int{1, 8} {
		for _, victims := range terminationVictims {
			if victims < nodes {
				continue
			}
			b.Run(fmt.Sprintf("victims=%d/nodes=%d", victims, nodes), func(b *testing.B) {
				var total time.Duration
				for b.Loop() {
					b.StopTimer()
					ids := make([]string, nodes)
					for i := range ids {
						ids[i] = newNode(b, spotNode(victims/nodes))
					}
					b.StartTimer()
					total += reclaimAndAwait(b, ids, victims/nodes)
				}
				b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-last-terminated")
				b.ReportMetric(0, "ns/op") // includes seeding; the metric above is the figure
			})
		}
	}
}

// spotNode makes a node of n units, all reserved and released, each under its own spot VM.
func spotNode(n int) func(*dynamo.Seed) {
	return func(s *dynamo.Seed) {
		node := s.Nodes[0].ID
		units := unitIDs(n)
		s.VMs = s.VMs[:0]
		for i := range units {
			s.VMs = append(s.VMs, capacity.VM{ID: fmt.Sprintf("vm-%d", i), NodeID: node, OrgID: demo.OrgBuyer,
				Tier: capacity.TierSpot, UnitIDs: []string{units[i]}, State: capacity.VMRunning, Version: 1})
		}
		s.Nodes[0].UnitIDs = units
		s.Reservations[0].ReservedUnitIDs = units
		s.Reservations[0].ReleasedUnitIDs = units
	}
}

// reclaimAndAwait reclaims every unit of each node at once and returns the time from the
// last reclaim answer to the last VM terminated on the agents.
func reclaimAndAwait(b *testing.B, nodes []string, perNode int) time.Duration {
	_, lastAnswer := reclaimAll(b, nodes, perNode, keyOwner)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		done := true
		for _, node := range nodes {
			for i := range perNode {
				if agents.State(node, fmt.Sprintf("vm-%d", i)) != "terminated" {
					done = false
				}
			}
		}
		if done {
			return time.Since(lastAnswer)
		}
		if time.Now().After(deadline) {
			b.Fatal("victims not terminated within 2 minutes")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
