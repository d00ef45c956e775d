package capacity_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// TestConcurrentReclaimReleasePlacement runs 50 goroutines mixing reclaims, releases, dry
// runs and spot placements on one node through the real store, then checks every invariant.
func TestConcurrentReclaimReleasePlacement(t *testing.T) {
	if testing.Short() {
		t.Skip("race test runs for seconds")
	}
	race(t, dynamotest.New(t), 3*time.Second, nil)
}

// TestConcurrentCallsUnderAWSFaults is the same race with AWS's faults that the emulator
// never gives: 10% of transactions cancelled by TransactionConflict, 10% of all calls
// throttled, 10% of transactions applied with their answer lost. Every call still ends in a
// success or a clear answer, every invariant holds, and every eviction is reported to
// exactly one caller.
func TestConcurrentCallsUnderAWSFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("race test runs for seconds")
	}
	seed := time.Now().UnixNano()
	t.Logf("fault seed %d", seed)
	inj := awsfault.New(seed,
		awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.1},
		awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 0.1},
		awsfault.Rule{Fault: awsfault.Throttling, Rate: 0.1},
	)
	// Under load most transactions can lose their race, and a lost answer counts only when the
	// write underneath was applied: the run goes on (up to three times as long) until each
	// fault has been injected, so the check below is about the code, not the machine.
	injectedAll := func() bool {
		for _, f := range []awsfault.Fault{awsfault.TransactionConflict, awsfault.AmbiguousTimeout, awsfault.Throttling} {
			if inj.Count(f) == 0 {
				return false
			}
		}
		return true
	}
	race(t, dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption)), 3*time.Second, injectedAll)
	t.Logf("injected: %v", inj.Counts())
	for _, f := range []awsfault.Fault{awsfault.TransactionConflict, awsfault.AmbiguousTimeout, awsfault.Throttling} {
		if inj.Count(f) == 0 {
			t.Errorf("no %s injected: the run proves nothing about it", f)
		}
	}
}

// race runs the mixed workload on env for duration, and then while done (if not nil) says
// not yet, up to three times duration; then it checks the outcome.
func race(t *testing.T, env *dynamotest.Env, duration time.Duration, done func() bool) {
	t.Helper()
	const (
		workers  = 50
		units    = 16
		reserved = 12
	)
	ids := make([]string, units)
	for i := range ids {
		ids[i] = fmt.Sprintf("u%02d", i)
	}
	now := time.Now().UTC()
	seed := dynamo.Seed{
		Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: ids, Version: 1}},
		Reservations: []capacity.Reservation{{
			ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: ids[:reserved],
			ReleasedUnitIDs: slices.Clone(ids[:reserved/2]), StartsAt: now.Add(-time.Hour), Status: capacity.StatusActive, TopologyGen: 1, Version: 1,
		}},
	}
	ctx := context.Background()
	if err := dynamo.New(env.Plain, env.Store.Table, env.Store.AuditTable).Put(ctx, seed); err != nil {
		t.Fatal(err)
	}
	svc := &capacity.Service{Store: env.Store, Logger: quiet}

	type reclaimed struct {
		id         string
		terminated []string
	}
	var (
		mu       sync.Mutex
		reclaims []reclaimed
		outcomes sync.Map // code -> *atomic.Int64
		sample   sync.Map // code -> the first error with it
		vmSeq    atomic.Int64
	)
	count := func(code capacity.Code) {
		n, _ := outcomes.LoadOrStore(code, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	deadline, last := time.Now().Add(duration), time.Now().Add(3*duration)
	goOn := func() bool {
		now := time.Now()
		return now.Before(deadline) || (done != nil && now.Before(last) && !done())
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			pick := func(from []string) []string {
				n := 1 + rng.IntN(3)
				out := []string{}
				for _, i := range rng.Perm(len(from))[:n] {
					out = append(out, from[i])
				}
				return out
			}
			for goOn() {
				var err error
				switch op := rng.IntN(10); {
				case op < 3:
					req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: pick(ids[:reserved]), DryRun: op == 0}
					var res *capacity.CapacityResult
					res, err = svc.Reclaim(ctx, owner, req, capacity.RequestMeta{})
					if err == nil && !req.DryRun && res.ReclaimID != "" {
						mu.Lock()
						reclaims = append(reclaims, reclaimed{res.ReclaimID, res.Terminated})
						mu.Unlock()
					}
				case op < 6:
					_, err = svc.Release(ctx, owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: pick(ids[:reserved])}, capacity.RequestMeta{})
				default:
					vm := fmt.Sprintf("vm-%d", vmSeq.Add(1))
					_, err = svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: vm, OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: pick(ids)}, capacity.RequestMeta{})
				}
				code := capacity.Code("ok")
				if err != nil {
					code = capacity.ErrorCode(err)
					sample.LoadOrStore(code, err)
				}
				count(code)
			}
		})
	}
	wg.Wait()

	summary := map[capacity.Code]int64{}
	outcomes.Range(func(k, v any) bool {
		summary[k.(capacity.Code)] = v.(*atomic.Int64).Load()
		return true
	})
	t.Logf("outcomes: %v, reclaims that evicted: %d", summary, len(reclaims))
	for code := range summary {
		switch code {
		case "ok", capacity.CodeUnitsInUse, capacity.CodeUnitsUnavailable, capacity.CodeConcurrentModification, capacity.CodeThrottled:
		default:
			e, _ := sample.Load(code)
			t.Errorf("unexpected outcome %s (%d calls, e.g. %v): every call must succeed or get a clear 409 or 503", code, summary[code], e)
		}
	}
	if summary["ok"] == 0 {
		t.Fatal("no call succeeded")
	}

	st, err := dynamo.New(env.Plain, env.Store.Table, env.Store.AuditTable).LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range capacity.Violations(st, time.Now()) {
		t.Error(v)
	}
	// Every VM a reclaim reported terminated is terminating for that reclaim, and no VM is
	// claimed by two reclaims.
	byID := map[string]capacity.VM{}
	for _, vm := range st.VMs {
		byID[vm.ID] = vm
	}
	claimed := map[string]string{}
	for _, r := range reclaims {
		for _, id := range r.terminated {
			if prev, ok := claimed[id]; ok {
				t.Errorf("VM %s terminated by both %s and %s", id, prev, r.id)
			}
			claimed[id] = r.id
			if vm := byID[id]; vm.State != capacity.VMTerminating || vm.ReclaimID != r.id {
				t.Errorf("VM %s reported terminated by %s is %s for %q", id, r.id, vm.State, vm.ReclaimID)
			}
		}
	}
	for _, vm := range st.VMs {
		if vm.State == capacity.VMTerminating && claimed[vm.ID] != vm.ReclaimID {
			t.Errorf("VM %s is terminating for %s, which no caller was told about", vm.ID, vm.ReclaimID)
		}
	}
}
