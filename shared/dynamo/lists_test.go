package dynamo_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// A reservation's membership entries go in its commit's transaction when they fit, and just
// before it when they do not (200 orgs and the commit's own items exceed a transaction's 100
// actions): either way every org then finds the node, and a transaction never exceeds the limit.
// An entry in the transaction lists the org's reservations (its list reads those alone); one
// written ahead lists none (a commit meanwhile could make its list partial), so its org's list
// reads the node's partition.
func TestReservationMembershipsFitOrGoAhead(t *testing.T) {
	orgs := func(from, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("org-%03d", from+i))
		}
		return out
	}
	tests := []struct {
		name              string
		allowed, managing []string
		wantOrgs          int
		wantListed        []string
	}{
		{"a few orgs, in the transaction", orgs(0, 2), orgs(2, 1), 3, []string{"r-many"}},
		{"an org in both lists, once", orgs(0, 1), orgs(0, 1), 1, []string{"r-many"}},
		{"the most a reservation names, ahead of it", orgs(0, capacity.MaxOrgIDs), orgs(capacity.MaxOrgIDs, capacity.MaxOrgIDs), 2 * capacity.MaxOrgIDs, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := opEnv(t, nil)
			ctx := context.Background()
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			c := newResCommit(st, "r-many")
			c.NewReservation.AllowedOrgIDs, c.NewReservation.ManagingOrgIDs = tt.allowed, tt.managing
			c.OrgReservations = map[string][]string{}
			for _, org := range append(slices.Clone(tt.allowed), tt.managing...) {
				c.OrgReservations[org] = []string{"r-many"}
			}
			// The store refuses a transaction of more than 100 actions itself.
			if _, err := env.Store.CommitOperator(ctx, c); err != nil {
				t.Fatalf("commit: %v", err)
			}
			named := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(tt.allowed), tt.managing...))))
			if len(named) != tt.wantOrgs {
				t.Fatalf("the test names %d orgs, want %d", len(named), tt.wantOrgs)
			}
			for _, org := range named {
				ids, _, err := env.Store.MemberNodeIDs(ctx, org, "", 10)
				if err != nil || !slices.Equal(ids, []string{"n1"}) {
					t.Fatalf("%s finds %v, %v", org, ids, err)
				}
				if named, listed, err := env.Store.NamedOn(ctx, "n1", org); err != nil || !named || !slices.Equal(listed, tt.wantListed) {
					t.Fatalf("%s's entry: named %v, lists %v, %v; want %v", org, named, listed, err, tt.wantListed)
				}
			}
			if ids, _, _ := env.Store.MemberNodeIDs(ctx, "org-none", "", 10); len(ids) != 0 {
				t.Errorf("an org never named finds %v", ids)
			}
		})
	}
}

// The largest operator transaction, a topology change moving capacity.MaxTopologyReviews
// reservations to needs-review with an Idempotency-Key, still fits with the node's directory
// and owner entries (the store refuses more than 100 actions itself), and the directory then
// shows the new units.
func TestLargestTopologyChangeFitsWithItsListEntries(t *testing.T) {
	ctx := context.Background()
	s := seed(2, 0)
	s.Reservations = nil
	for i := range capacity.MaxTopologyReviews {
		s.Reservations = append(s.Reservations, capacity.Reservation{ID: fmt.Sprintf("r%02d", i), NodeID: "n1", ReservedUnitIDs: []string{"u0"},
			StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, Version: 1, CreatedAt: t0, UpdatedAt: t0})
	}
	env := newEnv(t, s)
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	changed := st.Node
	changed.UnitIDs, changed.TopologyGen = []string{"u0", "u1", "u2"}, 2
	c := capacity.OperatorCommit{Node: st.Node, NewNode: &changed, Audit: opAudit("a-topo", "n1"),
		Idempotency: &capacity.IdempotencyRecord{Scope: "platform#k", NodeID: "n1", Fingerprint: "f", Result: []byte("{}"), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}}
	c.Audit.Action = capacity.ActionTopologySet
	for _, r := range st.Reservations {
		r.Status, r.TopologyGen = capacity.StatusNeedsReview, 1
		c.Reservations = append(c.Reservations, r)
	}
	if _, err := env.Store.CommitOperator(ctx, c); err != nil {
		t.Fatalf("topology change: %v", err)
	}
	nodes, _, err := env.Store.DirectoryNodes(ctx, "", 10)
	if err != nil || len(nodes) != 1 || !slices.Equal(nodes[0].UnitIDs, changed.UnitIDs) || nodes[0].TopologyGen != 2 {
		t.Errorf("directory %+v, %v", nodes, err)
	}
}
