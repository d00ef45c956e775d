package dynamo

import (
	"fmt"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// A membership entry lists its org's reservations only within bounds that keep the entry
// under an item's 400 KB and the commit under a transaction's 4 MB; an org past them gets an
// entry that lists none (its list reads the node's partition), never a partial list.
func TestMembershipListsStayWithinItemAndTransactionSizes(t *testing.T) {
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("r%05d", i)
		}
		return out
	}
	tests := []struct {
		name       string
		orgs       map[string]int
		wantListed map[string]int
	}{
		{"a few", map[string]int{"a": 3, "b": 1}, map[string]int{"a": 3, "b": 1}},
		{"one org past an entry's bound", map[string]int{"a": maxListedReservations + 1, "b": 2},
			map[string]int{"a": 0, "b": 2}},
		{"orgs past the commit's bound together", map[string]int{"a": maxListedReservations, "b": maxListedReservations,
			"c": maxListedReservations, "d": maxListedReservations, "e": maxListedReservations, "f": 1},
			map[string]int{"a": maxListedReservations, "b": maxListedReservations, "c": maxListedReservations,
				"d": maxListedReservations, "e": maxListedReservations, "f": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &capacity.Reservation{ID: "r00000"}
			c := capacity.OperatorCommit{Node: capacity.Node{ID: "n1"}, NewReservation: r, OrgReservations: map[string][]string{}}
			for org, n := range tt.orgs {
				r.AllowedOrgIDs = append(r.AllowedOrgIDs, org)
				c.OrgReservations[org] = ids(n)
			}
			_, members := listEntries(c)
			got := map[string]int{}
			for _, m := range members {
				got[m.(memberItem).OrgID] = len(m.(memberItem).ReservationIDs)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.wantListed) {
				t.Errorf("listed %v, want %v", got, tt.wantListed)
			}
		})
	}
}
