package capacity_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// A caller who sees nothing on a node pays, and learns, what it would for a node that does
// not exist: the same 404 after the same one small read, whatever the node holds (here 90
// reservations), so neither the answer nor its time tells whether the node exists or how busy
// it is. The owner still lists them all.
func TestReservationListCostsAnOutsiderWhatAMissingNodeCosts(t *testing.T) {
	env := dynamotest.New(t)
	ctx := context.Background()
	seed := dynamo.Seed{Nodes: []capacity.Node{{ID: "busy", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: []string{"u0"}, Version: 1}}}
	for i := range 90 {
		aud := []string{"other"}
		if i%45 == 0 {
			aud = []string{"aud"}
		}
		seed.Reservations = append(seed.Reservations, capacity.Reservation{
			ID: fmt.Sprintf("r%02d", i), NodeID: "busy", AllowedOrgIDs: aud, ManagingOrgIDs: []string{}, ReservedUnitIDs: []string{},
			ReleasedUnitIDs: []string{}, StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, CreatedAt: t0, UpdatedAt: t0, Version: 1,
		})
	}
	if err := env.Store.Put(ctx, seed); err != nil {
		t.Fatal(err)
	}
	svc := &capacity.Service{Store: env.Store, Logger: quiet, Now: func() time.Time { return t0.Add(time.Hour) }}

	type cost struct {
		calls       map[string]int64
		items, size int
	}
	list := func(p capacity.Principal, node string) (*capacity.ReservationPage, cost, error) {
		env.Calls.Reset()
		cctx, stats := capacity.WithCallStats(ctx)
		page, err := svc.ListReservations(cctx, p, node, capacity.PageRequest{})
		s := stats.Snapshot()
		return page, cost{env.Calls.Snapshot(), s.ItemsRead, s.BytesRead}, err
	}
	_, missing, missingErr := list(read("stranger"), "nowhere")
	if capacity.ErrorCode(missingErr) != capacity.CodeNotFound {
		t.Fatalf("missing node: %v, want not_found", missingErr)
	}
	if want := map[string]int64{"GetItem": 1}; !maps.Equal(missing.calls, want) {
		t.Errorf("a missing node costs %v, want %v", missing.calls, want)
	}
	_, busy, busyErr := list(read("stranger"), "busy")
	if busyErr == nil || busyErr.Error() != missingErr.Error() {
		t.Errorf("outsider on a busy node: %v, want %v as for a missing node", busyErr, missingErr)
	}
	if !maps.Equal(busy.calls, missing.calls) || busy.items != missing.items || busy.size != missing.size {
		t.Errorf("outsider on a node of 90 reservations costs %+v, a missing node %+v: want the same", busy, missing)
	}
	for _, tc := range []struct {
		p    capacity.Principal
		want int
	}{{read("aud"), 2}, {read("owner"), 50}} {
		page, c, err := list(tc.p, "busy")
		if err != nil || len(page.Reservations) != tc.want {
			t.Fatalf("%s: %v; want %d reservations", tc.p.OrgID, err, tc.want)
		}
		t.Logf("%s: %d reservations shown for %+v", tc.p.OrgID, tc.want, c)
	}
}
