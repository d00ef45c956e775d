package capacity_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// nodeListWorld registers nodes n1..n5 through the service (owners: n1, n2, n4 "acme"; n3, n5
// "other"), moves n2 to "other" (acme, its former owner, no longer sees it), and creates on n3
// a reservation whose audience is acme and whose managing org is "mgr". So acme sees n1, n3
// and n4; mgr sees n3; other sees n2, n3 and n5.
func nodeListWorld(t *testing.T) *capacity.Service {
	t.Helper()
	env := dynamotest.New(t)
	at := t0.Add(time.Hour)
	svc := &capacity.Service{Store: env.Store, Now: func() time.Time { return at }, Logger: quiet}
	ctx := context.Background()
	op := capacity.Principal{KeyID: "k-op", OrgID: "platform", Operator: true,
		Permissions: []string{capacity.PermNodeManage, capacity.PermReservationManage}}
	put := func(node, owner string) {
		t.Helper()
		_, err := svc.PutNode(ctx, op, capacity.NodeRequest{NodeID: node, OwnerOrgID: owner, AgentEndpoint: "https://" + node + ".example",
			UnitIDs: []string{"u0", "u1"}, Reason: "test"}, capacity.RequestMeta{RequestID: "r-" + node})
		if err != nil {
			t.Fatalf("put node %s: %v", node, err)
		}
	}
	for i, owner := range []string{"acme", "acme", "other", "acme", "other"} {
		put(fmt.Sprintf("n%d", i+1), owner)
	}
	put("n2", "other")
	end := at.Add(24 * time.Hour)
	_, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n3", ID: "r1", StartsAt: at, EndsAt: &end,
		AllowedOrgIDs: []string{"acme"}, ManagingOrgIDs: []string{"mgr"}, ReservedUnitIDs: []string{"u0"}, Reason: "test"},
		capacity.RequestMeta{RequestID: "r-res"})
	if err != nil {
		t.Fatalf("create reservation: %v", err)
	}
	return svc
}

// listAll pages through ListNodes limit nodes at a time and returns "<node>:<owner>" for each.
func listAll(t *testing.T, svc *capacity.Service, p capacity.Principal, limit int) []string {
	t.Helper()
	var out []string
	page := capacity.PageRequest{Limit: limit}
	for pages := 0; ; pages++ {
		res, err := svc.ListNodes(context.Background(), p, page)
		if err != nil {
			t.Fatalf("list nodes: %v", err)
		}
		if len(res.Nodes) > limit || pages > 10 {
			t.Fatalf("page of %d nodes (limit %d), page %d", len(res.Nodes), limit, pages)
		}
		for _, n := range res.Nodes {
			out = append(out, n.ID+":"+n.OwnerOrgID)
		}
		if res.NextCursor == "" {
			return out
		}
		page.Cursor = res.NextCursor
	}
}

func TestListNodes(t *testing.T) {
	svc := nodeListWorld(t)
	tenant := func(org string) capacity.Principal {
		return capacity.Principal{KeyID: "k-" + org, OrgID: org, Permissions: []string{capacity.PermRead}}
	}
	tests := []struct {
		name string
		p    capacity.Principal
		want []string
	}{
		{"operator", capacity.Principal{KeyID: "k-a", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermAuditRead}},
			[]string{"n1:acme", "n2:other", "n3:other", "n4:acme", "n5:other"}},
		// Its own nodes with their owner, n3 through the reservation without it; not n2, which
		// it owned before.
		{"acme", tenant("acme"), []string{"n1:acme", "n3:", "n4:acme"}},
		{"other", tenant("other"), []string{"n2:other", "n3:other", "n5:other"}},
		{"managing org", tenant("mgr"), []string{"n3:"}},
		{"stranger", tenant("stranger"), nil},
	}
	for _, tt := range tests {
		for _, limit := range []int{1, 2, 50} {
			t.Run(fmt.Sprintf("%s/limit %d", tt.name, limit), func(t *testing.T) {
				if got := listAll(t, svc, tt.p, limit); !slices.Equal(got, tt.want) {
					t.Errorf("listed %v, want %v", got, tt.want)
				}
			})
		}
	}
}

func TestListNodesRefusals(t *testing.T) {
	svc := nodeListWorld(t)
	ctx := context.Background()
	acme := capacity.Principal{KeyID: "k-acme", OrgID: "acme", Permissions: []string{capacity.PermRead}}
	tests := []struct {
		name string
		p    capacity.Principal
		page capacity.PageRequest
		code capacity.Code
	}{
		{"no read permission", capacity.Principal{KeyID: "k", OrgID: "acme", Permissions: []string{capacity.PermPlace}}, capacity.PageRequest{}, capacity.CodeNotFound},
		{"operator without a reading permission", capacity.Principal{KeyID: "k", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermKeyManage}}, capacity.PageRequest{}, capacity.CodeNotFound},
		{"limit too large", acme, capacity.PageRequest{Limit: 101}, capacity.CodeInvalidRequest},
		{"garbage cursor", acme, capacity.PageRequest{Cursor: "!!"}, capacity.CodeInvalidRequest},
		// The reservation list's cursor of n3's r1: a cursor of another list.
		{"another list's cursor", acme, capacity.PageRequest{Cursor: base64.RawURLEncoding.EncodeToString([]byte(`["v1","reservations","n3","r1"]`))}, capacity.CodeInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := svc.ListNodes(ctx, tt.p, tt.page)
			if e := (*capacity.Error)(nil); !errors.As(err, &e) || e.Code != tt.code {
				t.Errorf("err = %v, want %s", err, tt.code)
			}
		})
	}
}
