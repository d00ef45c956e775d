package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// Through the handler and the DynamoDB store: a cursor no list handed out is 422
// invalid_request on every list that starts its query at a cursor, never the 500 of the
// ValidationException DynamoDB answers such a start key with; the list's own cursor pages on.
func TestForgedCursorsAre422(t *testing.T) {
	env := dynamotest.New(t)
	ctx := context.Background()
	if err := env.Store.Put(ctx, dynamo.Seed{
		Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: []string{"u0", "u1", "u2"}, Version: 1}},
		Reservations: []capacity.Reservation{{
			ID: "r1", NodeID: "n1", ReservedUnitIDs: []string{"u0", "u1", "u2"}, ReleasedUnitIDs: []string{"u0", "u1", "u2"},
			StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, CreatedAt: t0, UpdatedAt: t0, Version: 1,
		}},
	}); err != nil {
		t.Fatal(err)
	}
	svc := &capacity.Service{Store: env.Store, Schedules: env.Store, Now: func() time.Time { return now }, Logger: quiet}
	for _, u := range []string{"u0", "u1", "u2"} {
		if _, err := svc.Reclaim(ctx, ownerPrincipal, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{u}}, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
	}
	h := newHandler(svc)
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	platform := "Bearer " + secretPlatform
	lists := []struct {
		name, path string
		auth       *string
	}{
		{"reservation audit", reservationPath + "/audit", nil},
		{"scheduled reclaims", reservationPath + "/scheduled-reclaims", nil},
		{"node audit", "/v1/nodes/n1/audit", &platform},
		{"key audit", "/v1/keys/audit", &platform},
	}
	forged := []struct{ name, cursor string }{
		{"garbage base64", "%%%"},
		{"another node's partition", b64(`{"pk":"NODE#n2","sk":"SEQ#00000000000000000001","resKey":"NODE#n2#RES#r1"}`)},
		{"a sort key of another prefix", b64(`{"pk":"NODE#n1","sk":"RES#r1","resKey":"NODE#n1#RES#r1"}`)},
		{"an extra attribute", b64(`{"pk":"NODE#n1","sk":"SEQ#00000000000000000001","resKey":"NODE#n1#RES#r1","x":"y"}`)},
		{"another node's scheduled reclaim", b64(`{"pk":"NODE#n2#SCHED#s1","sk":"SCHED","gsi1pk":"NODE#n2#RES#r1#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s1"}`)},
	}
	for _, l := range lists {
		for _, f := range forged {
			t.Run(l.name+"/"+f.name, func(t *testing.T) {
				w := req{method: http.MethodGet, path: l.path + "?cursor=" + url.QueryEscape(f.cursor), auth: l.auth}.do(t, h)
				if p := problem(t, w, http.StatusUnprocessableEntity, capacity.CodeInvalidRequest); p.Detail != "invalid cursor" {
					t.Errorf("detail %q, want \"invalid cursor\"", p.Detail)
				}
			})
		}
	}
	// The reservation audit's own cursor pages on.
	w := req{method: http.MethodGet, path: reservationPath + "/audit?limit=1"}.do(t, h)
	next, _ := jsonObject(t, w)["nextCursor"]
	if w.Code != http.StatusOK || len(next) < 3 {
		t.Fatalf("first page: %d %s", w.Code, w.Body.String())
	}
	var cursor string
	if err := json.Unmarshal(next, &cursor); err != nil {
		t.Fatal(err)
	}
	if w := (req{method: http.MethodGet, path: reservationPath + "/audit?limit=1&cursor=" + url.QueryEscape(cursor)}.do(t, h)); w.Code != http.StatusOK {
		t.Errorf("its own cursor: %d %s", w.Code, w.Body.String())
	}
}
