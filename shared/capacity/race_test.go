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
	if err := env.Clean().Put(ctx, seed); err != nil {
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

	st, err := env.Clean().LoadNode(ctx, "n1", "")
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

// fastRetry keeps the waits between rounds short, so that many lost rounds take little time.
var fastRetry = capacity.RetryPolicy{Base: time.Millisecond, Cap: 4 * time.Millisecond}

// ownUnitsWorld: node n1 with units u0..u<n-1>, all reserved by r1, the released ones
// released, no VM (each client of a test takes a unit of its own).
func ownUnitsWorld(t *testing.T, n int, released []string, opts ...dynamotest.Option) (*dynamotest.Env, *capacity.Service) {
	t.Helper()
	env := dynamotest.New(t, opts...)
	units := make([]string, n)
	for i := range units {
		units[i] = fmt.Sprintf("u%d", i)
	}
	seed := dynamo.Seed{
		Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: units, Version: 1}},
		Reservations: []capacity.Reservation{{
			ID: "r1", NodeID: "n1", ReservedUnitIDs: units, ReleasedUnitIDs: released, StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, Version: 1,
		}},
	}
	if err := env.Clean().Put(context.Background(), seed); err != nil {
		t.Fatal(err)
	}
	return env, &capacity.Service{Store: env.Store, Logger: quiet}
}

// nodeAfter checks every invariant of n1 now and returns its state.
func nodeAfter(t *testing.T, env *dynamotest.Env) *capacity.NodeState {
	t.Helper()
	checkInvariants(t, env, "n1", time.Now())
	st, err := env.Store.LoadNode(context.Background(), "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestDisjointCommitsSucceedUnderTransactionConflicts: two calls on different units of one
// node, at once, while AWS cancels the first 10 transactions with TransactionConflict (more
// than both calls' budget of real races together): both land, since a loss that left the
// call's own units as read is retried beyond that budget.
func TestDisjointCommitsSucceedUnderTransactionConflicts(t *testing.T) {
	const conflicts = 10
	release := func(unit string) func(*capacity.Service) error {
		return func(svc *capacity.Service) error {
			_, err := svc.Release(context.Background(), owner, reclaim(unit), capacity.RequestMeta{})
			return err
		}
	}
	place := func(vm, unit string) func(*capacity.Service) error {
		return func(svc *capacity.Service) error {
			_, err := svc.Place(context.Background(), sched, capacity.PlacementRequest{NodeID: "n1", VMID: vm, OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{unit}}, capacity.RequestMeta{})
			return err
		}
	}
	tests := []struct {
		name     string
		released []string // before the calls
		a, b     func(*capacity.Service) error
		expect   func(t *testing.T, st *capacity.NodeState)
	}{
		{"two releases", nil, release("u0"), release("u1"), func(t *testing.T, st *capacity.NodeState) {
			if got := st.Reservation("r1").ReleasedUnitIDs; !slices.Equal(got, []string{"u0", "u1"}) {
				t.Errorf("released %v, want [u0 u1]", got)
			}
		}},
		{"a release and a placement", []string{"u2"}, release("u0"), place("vm-9", "u2"), func(t *testing.T, st *capacity.NodeState) {
			if got := st.Reservation("r1").ReleasedUnitIDs; !slices.Equal(got, []string{"u0", "u2"}) {
				t.Errorf("released %v, want [u0 u2]", got)
			}
			if len(st.VMs) != 1 || st.VMs[0].ID != "vm-9" {
				t.Errorf("VMs %v, want vm-9", st.VMs)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 1, Max: conflicts})
			env, svc := ownUnitsWorld(t, 4, tt.released, dynamotest.WithAPIOptions(inj.APIOption))
			svc.Retry = fastRetry
			var errA, errB error
			var wg sync.WaitGroup
			wg.Go(func() { errA = tt.a(svc) })
			wg.Go(func() { errB = tt.b(svc) })
			wg.Wait()
			if errA != nil || errB != nil {
				t.Fatalf("calls answered %v and %v, want both to land", errA, errB)
			}
			if n := inj.Count(awsfault.TransactionConflict); n != conflicts {
				t.Fatalf("%d conflicts injected, want %d", n, conflicts)
			}
			tt.expect(t, nodeAfter(t, env))
		})
	}
}

// interleaving lets another call commit between each of the first n reads of the service and
// its commit, as if it had won the race for the node; it counts the service's commits.
type interleaving struct {
	capacity.Store
	n       int
	other   func(i int) error
	commits int
}

func (s *interleaving) Commit(ctx context.Context, c capacity.Commit) error {
	s.commits++
	if s.commits <= s.n {
		if err := s.other(s.commits); err != nil {
			return fmt.Errorf("the other call %d: %w", s.commits, err)
		}
	}
	return s.Store.Commit(ctx, c)
}

// TestOnlyRealRacesSpendTheBudget: a release of u0 and u1 would lose its commit 6 times, each
// time to a release or reclaim that landed first on the node. When those are of another
// unit, the release lands on its 7th round; when they flip u0 (so that every round has u1, at
// least, to release), it answers concurrent_modification after its 3 rounds, having released
// nothing.
func TestOnlyRealRacesSpendTheBudget(t *testing.T) {
	const losses = 6
	tests := []struct {
		name        string
		otherUnit   string
		wantCode    capacity.Code // "" for success
		wantCommits int
		// releases that landed: the other call's (at its odd flips) and the release's own
		wantReleases int
	}{
		{"others win on another unit", "u5", "", losses + 1, losses/2 + 1},
		{"others win on the same unit", "u0", capacity.CodeConcurrentModification, capacity.DefaultAttempts, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := ownUnitsWorld(t, 8, nil)
			other := &capacity.Service{Store: env.Store, Logger: quiet}
			ctx := context.Background()
			// The other call flips its unit: released, reclaimed, released, ...
			flip := func(i int) error {
				var err error
				if i%2 == 1 {
					_, err = other.Release(ctx, owner, reclaim(tt.otherUnit), capacity.RequestMeta{})
				} else {
					_, err = other.Reclaim(ctx, owner, reclaim(tt.otherUnit), capacity.RequestMeta{})
				}
				return err
			}
			store := &interleaving{Store: env.Store, n: losses, other: flip}
			svc.Store, svc.Retry = store, fastRetry
			_, err := svc.Release(ctx, owner, reclaim("u0", "u1"), capacity.RequestMeta{})
			switch {
			case tt.wantCode == "" && err != nil:
				t.Fatalf("release answered %v, want success", err)
			case tt.wantCode != "" && capacity.ErrorCode(err) != tt.wantCode:
				t.Fatalf("release answered %v, want %s", err, tt.wantCode)
			}
			if store.commits != tt.wantCommits {
				t.Errorf("%d commits, want %d", store.commits, tt.wantCommits)
			}
			if n := auditsOf(t, env, capacity.ActionRelease); n != tt.wantReleases {
				t.Errorf("%d releases landed, want %d", n, tt.wantReleases)
			}
			checkInvariants(t, env, "n1", time.Now())
		})
	}
}

// TestEightClientsOnTheirOwnUnits: 8 goroutines on one node of the in-process emulator, each
// cycling a release, a spot placement and a reclaim of its own unit (and the evicted VM's
// termination): no call answers concurrent_modification, every call lands, and every
// invariant holds.
func TestEightClientsOnTheirOwnUnits(t *testing.T) {
	const clients, cycles = 8, 15
	env, svc := ownUnitsWorld(t, clients, nil)
	ctx := context.Background()
	var rounds atomic.Int64
	outcomes := sync.Map{} // code -> *atomic.Int64
	// count tallies a call's answer and reports whether it landed (a client stops at the
	// first call that did not: its next one would be refused).
	count := func(err error) bool {
		code := capacity.Code("ok")
		if err != nil {
			code = capacity.ErrorCode(err)
			t.Logf("%v", err)
		}
		n, _ := outcomes.LoadOrStore(code, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return err == nil
	}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			unit := fmt.Sprintf("u%d", c)
			for n := range cycles {
				cctx, stats := capacity.WithCallStats(ctx)
				_, err := svc.Release(cctx, owner, reclaim(unit), capacity.RequestMeta{})
				if !count(err) {
					return
				}
				vm := fmt.Sprintf("vm-%d-%d", c, n)
				_, err = svc.Place(cctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: vm, OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{unit}}, capacity.RequestMeta{})
				if !count(err) {
					return
				}
				res, err := svc.Reclaim(cctx, owner, reclaim(unit), capacity.RequestMeta{})
				rounds.Add(int64(stats.Snapshot().Rounds))
				if !count(err) {
					return
				}
				if res.ReclaimID == "" {
					t.Errorf("reclaim of %s evicted nothing, want %s evicted", unit, vm)
					return
				}
				op := capacity.Operation{ID: res.ReclaimID, NodeID: "n1"}
				if err := env.Store.MarkTerminated(ctx, op, vm, time.Now()); err != nil {
					t.Errorf("terminate %s: %v", vm, err)
					return
				}
			}
		})
	}
	wg.Wait()
	summary := map[capacity.Code]int64{}
	outcomes.Range(func(k, v any) bool {
		summary[k.(capacity.Code)] = v.(*atomic.Int64).Load()
		return true
	})
	t.Logf("outcomes %v, %.2f rounds per call", summary, float64(rounds.Load())/float64(summary["ok"]))
	if len(summary) != 1 || summary["ok"] != clients*cycles*3 {
		t.Errorf("outcomes %v, want all %d calls ok", summary, clients*cycles*3)
	}
	st := nodeAfter(t, env)
	if len(st.VMs) != 0 || len(st.Reservation("r1").ReleasedUnitIDs) != 0 {
		t.Errorf("after every cycle: VMs %v, released %v; want none", st.VMs, st.Reservation("r1").ReleasedUnitIDs)
	}
}
