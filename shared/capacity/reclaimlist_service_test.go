package capacity_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// reclaimListWorld is world() with a clock that moves a second a call, and two reclaims of r1
// committed one after the other: of u1 (evicting s1), then of u2 (evicting s2, placed for it).
// The first has since completed. It returns the two operation ids, oldest first.
func reclaimListWorld(t *testing.T) (*capacity.Service, [2]string) {
	t.Helper()
	env := dynamotest.New(t)
	ctx := context.Background()
	if err := env.Store.Put(ctx, worldSeed()); err != nil {
		t.Fatal(err)
	}
	clock := t0.Add(time.Hour)
	svc := &capacity.Service{Store: env.Store, Logger: quiet, Now: func() time.Time { clock = clock.Add(time.Second); return clock }}
	var ids [2]string
	res, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{RequestID: "q1"})
	if err != nil {
		t.Fatal(err)
	}
	ids[0] = res.ReclaimID
	op, err := env.Store.GetOperation(ctx, "n1", ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Store.BeginTermination(ctx, *op, "arn:test", clock); err != nil {
		t.Fatal(err)
	}
	if op, err = env.Store.GetOperation(ctx, "n1", ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.EndOperation(ctx, *op, capacity.OpCompleted, clock); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}},
		capacity.RequestMeta{RequestID: "q2"}); err != nil {
		t.Fatal(err)
	}
	if res, err = svc.Reclaim(ctx, owner, reclaim("u2"), capacity.RequestMeta{RequestID: "q3"}); err != nil {
		t.Fatal(err)
	}
	ids[1] = res.ReclaimID
	return svc, ids
}

func TestListReclaimOperations(t *testing.T) {
	svc, ids := reclaimListWorld(t)
	ctx := context.Background()
	newest, oldest := ids[1], ids[0]
	tests := []struct {
		name, state string
		p           capacity.Principal
		want        []string
	}{
		{"all, newest first", "", owner, []string{newest, oldest}},
		{"in flight", "in-flight", owner, []string{newest}},
		{"completed", "completed", owner, []string{oldest}},
		{"failed", "failed", owner, []string{}},
		{"the audience", "", audi, []string{newest, oldest}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			page := capacity.PageRequest{Limit: 1}
			for range 5 {
				res, err := svc.ListReclaimOperations(ctx, tt.p, "n1", "r1", tt.state, page)
				if err != nil {
					t.Fatal(err)
				}
				for _, op := range res.Reclaims {
					got = append(got, op.ID)
					// The audience's view is redacted, as GET of one operation is.
					if redacted := tt.p.OrgID == "aud"; op.Redacted != redacted || redacted && op.VMIDs != nil || !redacted && len(op.VMIDs) != 1 {
						t.Errorf("%s: redacted %v, VMs %v", op.ID, op.Redacted, op.VMIDs)
					}
				}
				if page.Cursor = res.NextCursor; page.Cursor == "" {
					break
				}
			}
			if got == nil {
				got = []string{}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("listed %v, want %v", got, tt.want)
			}
		})
	}
}

func TestListReclaimOperationsRefusals(t *testing.T) {
	svc, _ := reclaimListWorld(t)
	ctx := context.Background()
	first, err := svc.ListReclaimOperations(ctx, owner, "n1", "r1", "", capacity.PageRequest{Limit: 1})
	if err != nil || first.NextCursor == "" {
		t.Fatalf("first page: %v %+v", err, first)
	}
	stranger := capacity.Principal{KeyID: "k-x", OrgID: "stranger", Permissions: []string{capacity.PermRead, capacity.PermCapacity}}
	tests := []struct {
		name, node, res, state string
		p                      capacity.Principal
		page                   capacity.PageRequest
		code                   capacity.Code
	}{
		{"unknown state", "n1", "r1", "done", owner, capacity.PageRequest{}, capacity.CodeInvalidRequest},
		{"limit", "n1", "r1", "", owner, capacity.PageRequest{Limit: 101}, capacity.CodeInvalidRequest},
		{"no such reservation", "n1", "r2", "", owner, capacity.PageRequest{Cursor: first.NextCursor}, capacity.CodeNotFound},
		{"garbage cursor", "n1", "r1", "", owner, capacity.PageRequest{Cursor: first.NextCursor + "x"}, capacity.CodeInvalidRequest},
		{"stranger", "n1", "r1", "", stranger, capacity.PageRequest{}, capacity.CodeNotFound},
		// A stranger learns nothing from a bad query: the reservation's 404 comes first.
		{"stranger with a bad state", "n1", "r1", "done", stranger, capacity.PageRequest{}, capacity.CodeNotFound},
		{"no such node", "n9", "r1", "", owner, capacity.PageRequest{}, capacity.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := svc.ListReclaimOperations(ctx, tt.p, tt.node, tt.res, tt.state, tt.page)
			if e := (*capacity.Error)(nil); !errors.As(err, &e) || e.Code != tt.code {
				t.Errorf("err = %v, want %s", err, tt.code)
			}
		})
	}
}
