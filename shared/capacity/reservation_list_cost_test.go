package capacity_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
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
	// An audience org that sees 2 of the 90 pays for its membership entry, the node and those
	// 2, not for the partition; so does it after a reservation created through the service
	// names it too (the entry's list kept by the creation's own transaction).
	_, aud, err := list(read("aud"), "busy")
	if err != nil || aud.items > 5 {
		t.Errorf("audience org seeing 2 of 90 reads %d items (%v, %v), want at most 5", aud.items, aud.calls, err)
	}
	op := capacity.Principal{KeyID: "k-op", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermReservationManage}}
	if _, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "busy", ID: "r99", StartsAt: t0, ManagingOrgIDs: []string{"aud"},
		ReservedUnitIDs: []string{"u0"}, Reason: "test"}, capacity.RequestMeta{RequestID: "r-r99"}); err != nil {
		t.Fatal(err)
	}
	page, aud, err := list(read("aud"), "busy")
	if err != nil || len(page.Reservations) != 3 || aud.items > 6 {
		t.Errorf("audience org seeing 3 of 91: %v, %d items (%v); want 3 reservations for at most 6", err, aud.items, aud.calls)
	}
}

// Every org's list of a node answers as the node's reservations say, page by page, whether it
// reads its membership entry's ids or the partition (the owner): the reservations that name
// it, in id order, each page's cursor leading to the next; the 404 of a missing node to an org
// named nowhere; and a reservation created through the service joins its orgs' lists.
func TestReservationListPagesWhatEachOrgIsShown(t *testing.T) {
	env := dynamotest.New(t)
	ctx := context.Background()
	seed := dynamo.Seed{Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: []string{"u0"}, Version: 1}}}
	var all []string
	for i := range 12 {
		r := capacity.Reservation{
			ID: fmt.Sprintf("r%02d", i), NodeID: "n1", AllowedOrgIDs: []string{"other"}, ManagingOrgIDs: []string{}, ReservedUnitIDs: []string{},
			ReleasedUnitIDs: []string{}, StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, CreatedAt: t0, UpdatedAt: t0, Version: 1,
		}
		switch i {
		case 0, 5, 11:
			r.AllowedOrgIDs = []string{"aud", "other"}
		case 3:
			r.ManagingOrgIDs = []string{"mgr"}
		}
		all = append(all, r.ID)
		seed.Reservations = append(seed.Reservations, r)
	}
	if err := env.Store.Put(ctx, seed); err != nil {
		t.Fatal(err)
	}
	svc := &capacity.Service{Store: env.Store, Logger: quiet, Now: func() time.Time { return t0.Add(time.Hour) }}
	pages := func(org string, limit int) ([][]string, error) {
		var out [][]string
		cursor := ""
		for {
			page, err := svc.ListReservations(ctx, read(org), "n1", capacity.PageRequest{Limit: limit, Cursor: cursor})
			if err != nil {
				return out, err
			}
			var ids []string
			for _, r := range page.Reservations {
				ids = append(ids, r.ID)
			}
			out = append(out, ids)
			if cursor = page.NextCursor; cursor == "" {
				return out, nil
			}
		}
	}
	check := func(t *testing.T, org string, limit int, want [][]string) {
		t.Helper()
		got, err := pages(org, limit)
		if err != nil || !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%s by %d: %v, %v; want %v", org, limit, got, err, want)
		}
	}
	check(t, "aud", 2, [][]string{{"r00", "r05"}, {"r11"}})
	check(t, "aud", 3, [][]string{{"r00", "r05", "r11"}})
	check(t, "mgr", 1, [][]string{{"r03"}})
	check(t, "other", 5, [][]string{all[:5], all[5:10], all[10:]})
	check(t, "owner", 12, [][]string{all})
	if _, err := pages("stranger", 5); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("stranger: %v, want not_found", err)
	}

	op := capacity.Principal{KeyID: "k-op", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermReservationManage}}
	if _, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "r04b", StartsAt: t0, AllowedOrgIDs: []string{"mgr"},
		ManagingOrgIDs: []string{"aud", "new"}, ReservedUnitIDs: []string{"u0"}, Reason: "test"}, capacity.RequestMeta{RequestID: "r-new"}); err != nil {
		t.Fatal(err)
	}
	check(t, "aud", 2, [][]string{{"r00", "r04b"}, {"r05", "r11"}})
	check(t, "mgr", 5, [][]string{{"r03", "r04b"}})
	check(t, "new", 5, [][]string{{"r04b"}})
	check(t, "other", 12, [][]string{all})
}
