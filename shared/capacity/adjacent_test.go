package capacity_test

import (
	"context"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// Terms are half-open, [startsAt, endsAt): a reservation that starts exactly when another on
// the same units ends does not overlap it, on either side, and at that instant the units are
// the later one's (its audience may place on them); a term that shares one second does.
func TestAdjacentTermsDoNotOverlap(t *testing.T) {
	at := func(h int) *time.Time { v := t0.Add(time.Duration(h) * time.Hour); return &v }
	// rA holds u3 over [t0+48h, t0+96h).
	tests := []struct {
		name         string
		starts, ends time.Time
		want         capacity.Code
		placeAt      *time.Time // if set, the later reservation's audience places a reserved VM on u3 then
	}{
		{name: "ends when rA starts", starts: t0, ends: *at(48)},
		{name: "starts when rA ends", starts: *at(96), ends: *at(120), placeAt: at(96)},
		{name: "ends a second after rA starts", starts: t0, ends: at(48).Add(time.Second), want: capacity.CodeReservationOverlap},
		{name: "starts a second before rA ends", starts: at(96).Add(-time.Second), ends: *at(120), want: capacity.CodeReservationOverlap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			if _, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "rA", StartsAt: *at(48), EndsAt: at(96),
				AllowedOrgIDs: []string{"early"}, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
			ends := tt.ends
			_, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "rB", StartsAt: tt.starts, EndsAt: &ends,
				AllowedOrgIDs: []string{"late"}, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{})
			if code(err) != tt.want {
				t.Fatalf("create rB over [%s, %s): %v, want %q", tt.starts, tt.ends, err, tt.want)
			}
			for _, h := range []int{1, 47, 48, 95, 96, 119} {
				checkInvariants(t, env, "n1", t0.Add(time.Duration(h)*time.Hour))
			}
			if tt.placeAt != nil {
				svc.Now = func() time.Time { return *tt.placeAt }
				_, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "late-vm", OrgID: "late", Tier: capacity.TierReserved,
					UnitIDs: []string{"u3"}}, capacity.RequestMeta{})
				if err != nil {
					t.Errorf("reserved placement for rB's audience at %s, when rA ends and rB starts: %v", tt.placeAt, err)
				}
			}
		})
	}
}
