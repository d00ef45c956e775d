package capacity_test

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// A change that takes a reservation's units out of its audience's hands (a cancel; a
// topology change that leaves it needs-review) moves what placements are conditioned on: a
// reserved placement decided before it, on the reservation's exclusive units, loses its
// commit, decides again on the changed reservation and is refused. Nothing lands on the units.
func TestPlacementDecidedBeforeACancelDoesNotLand(t *testing.T) {
	tests := []struct {
		name string
		race func(ctx context.Context, o *capacity.Service) error
	}{
		{"cancel", func(ctx context.Context, o *capacity.Service) error {
			_, err := o.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
			return err
		}},
		{"topology change: r1 needs review", func(ctx context.Context, o *capacity.Service) error {
			_, err := o.SetTopology(ctx, op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u1", "u2"}}, capacity.RequestMeta{})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			// u2 (released, idle) back to r1's exclusive use: its audience may place on it.
			if _, err := svc.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
			other := &capacity.Service{Store: env.Store, Now: svc.Now, Logger: quiet}
			svc.Store = &racingStore{Store: env.Store, before: func() {
				if err := tt.race(ctx, other); err != nil {
					t.Errorf("racing change: %v", err)
				}
			}}
			_, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "rv1", OrgID: "aud", Tier: capacity.TierReserved,
				UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
			if code(err) != capacity.CodeUnitsUnavailable {
				t.Fatalf("placement decided before the change: %v, want units_unavailable", err)
			}
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			for _, vm := range st.VMs {
				if vm.ID == "rv1" {
					t.Errorf("the placement landed: %+v", vm)
				}
			}
		})
	}
}
