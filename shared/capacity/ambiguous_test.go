package capacity_test

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
)

// A commit whose answer was lost, and whose check is then throttled past the SDK's retries,
// still answers with what it did: the check is a read, and the service outlasts the burst
// rather than answering 500 (after which a retry without a key would answer terminated: []).
func TestAmbiguousCommitOutlastsAThrottledCheck(t *testing.T) {
	env, svc, inj := faultyWorld(t, 7, ambiguous,
		awsfault.Rule{Operation: "GetItem", Fault: awsfault.Throttling, Rate: 0.8})
	res, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("reclaim: %v (faults %v)", err, inj.Counts())
	}
	if inj.Count(awsfault.Throttling) < 3 {
		t.Fatalf("%d throttles injected: the check was never throttled past the SDK's retries", inj.Count(awsfault.Throttling))
	}
	if len(res.Terminated) != 1 || res.Terminated[0] != "s1" {
		t.Errorf("answer terminated %v, want [s1]", res.Terminated)
	}
	if n := auditsOf(t, env, capacity.ActionReclaim); n != 1 {
		t.Errorf("%d successful reclaim audit records, want 1", n)
	}
}

// A placement whose first commit landed late answers 201 with its VM, not vm_exists about
// itself from the round that decided again.
func TestPlacementThatLandedLateIsNotRefusedAsExisting(t *testing.T) {
	env, svc := world(t)
	svc.Store = &lateRounds{Store: env.Store}
	res, err := svc.Place(context.Background(), sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s9", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("placement: %v", err)
	}
	if res.VM.ID != "s9" {
		t.Errorf("answer %+v, want s9", res.VM)
	}
}
