package httpapi_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// ---------------------------------------------------------------------------------------
// Routes reach the service, and responses have the documented shape.

func reservation(endsAt *time.Time, released []string) capacity.Reservation {
	return capacity.Reservation{
		ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u0", "u1", "u2"},
		ReleasedUnitIDs: released, ManagingOrgIDs: []string{"mgr"}, StartsAt: t0, EndsAt: endsAt,
		Status: capacity.StatusActive, ContractRef: "c-42", CreatedAt: t0, UpdatedAt: now, TopologyGen: 3, Version: 7,
	}
}

func TestRoutesReachServiceWithTheRequest(t *testing.T) {
	const reqID = "req-fixed"
	reclaimBody := `{"unitIds":["u1","u2"],"dryRun":false,"reason":"customer needs the GPUs back"}`
	tests := []struct {
		name       string
		req        req
		svc        *fakeService
		wantCall   call
		wantStatus int
		check      func(t *testing.T, m map[string]json.RawMessage)
	}{
		{
			name:       "get reservation, open-ended, nothing released",
			req:        req{method: http.MethodGet, path: reservationPath},
			svc:        &fakeService{res: ptr(reservation(nil, nil))},
			wantCall:   call{Method: "GetReservation", Principal: ownerPrincipal, NodeID: "n1", ResID: "r1"},
			wantStatus: http.StatusOK,
			check: func(t *testing.T, m map[string]json.RawMessage) {
				assertReservation(t, m)
				if got := stringsField(t, m, "releasedUnitIds"); len(got) != 0 {
					t.Errorf("releasedUnitIds = %v, want []", got)
				}
				assertAbsent(t, m, "endsAt", "reclaimId", "terminated", "skipped", "wouldTerminate", "wouldSkip", "Version", "version")
			},
		},
		{
			name:       "get reservation with an end",
			req:        req{method: http.MethodGet, path: reservationPath},
			svc:        &fakeService{res: ptr(reservation(ptr(t0.Add(720*time.Hour)), []string{"u2"}))},
			wantCall:   call{Method: "GetReservation", Principal: ownerPrincipal, NodeID: "n1", ResID: "r1"},
			wantStatus: http.StatusOK,
			check: func(t *testing.T, m map[string]json.RawMessage) {
				assertReservation(t, m)
				if got := string(m["endsAt"]); got != `"2026-12-01T00:00:00Z"` {
					t.Errorf("endsAt = %s, want \"2026-12-01T00:00:00Z\"", got)
				}
				if got := stringsField(t, m, "releasedUnitIds"); !slices.Equal(got, []string{"u2"}) {
					t.Errorf("releasedUnitIds = %v, want [u2]", got)
				}
			},
		},
		{
			name: "reclaim evicting spot VMs",
			req: req{method: http.MethodPost, path: reclaimPath, body: reclaimBody,
				header: map[string]string{"Idempotency-Key": "idem-1"}},
			svc: &fakeService{capacity: &capacity.CapacityResult{
				Reservation: reservation(nil, nil), ReclaimID: "rcl_1",
				Terminated: []string{"vm-a", "vm-b"}, Skipped: []string{"vm-res"},
			}},
			wantCall: call{Method: "Reclaim", Principal: ownerPrincipal, Meta: capacity.RequestMeta{RequestID: reqID},
				Capacity: capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1", "u2"},
					Reason: "customer needs the GPUs back", IdempotencyKey: "idem-1"}},
			wantStatus: http.StatusOK,
			check: func(t *testing.T, m map[string]json.RawMessage) {
				assertReservation(t, m)
				if got := string(m["reclaimId"]); got != `"rcl_1"` {
					t.Errorf("reclaimId = %s, want \"rcl_1\"", got)
				}
				if got := stringsField(t, m, "terminated"); !slices.Equal(got, []string{"vm-a", "vm-b"}) {
					t.Errorf("terminated = %v", got)
				}
				if got := stringsField(t, m, "skipped"); !slices.Equal(got, []string{"vm-res"}) {
					t.Errorf("skipped = %v", got)
				}
				assertAbsent(t, m, "wouldTerminate", "wouldSkip", "endsAt")
			},
		},
		{
			name: "reclaim evicting nothing still lists terminated and skipped",
			req:  req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`},
			svc:  &fakeService{capacity: &capacity.CapacityResult{Reservation: reservation(nil, nil)}},
			wantCall: call{Method: "Reclaim", Principal: ownerPrincipal, Meta: capacity.RequestMeta{RequestID: reqID},
				Capacity: capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}}},
			wantStatus: http.StatusOK,
			check: func(t *testing.T, m map[string]json.RawMessage) {
				if got := stringsField(t, m, "terminated"); len(got) != 0 {
					t.Errorf("terminated = %v, want []", got)
				}
				if got := stringsField(t, m, "skipped"); len(got) != 0 {
					t.Errorf("skipped = %v, want []", got)
				}
				assertAbsent(t, m, "reclaimId", "wouldTerminate", "wouldSkip")
			},
		},
		{
			name: "reclaim dry run reports wouldTerminate and wouldSkip",
			req:  req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"],"dryRun":true}`},
			svc: &fakeService{capacity: &capacity.CapacityResult{
				Reservation: reservation(nil, []string{"u1"}), DryRun: true, Terminated: []string{"vm-a"},
			}},
			wantCall: call{Method: "Reclaim", Principal: ownerPrincipal, Meta: capacity.RequestMeta{RequestID: reqID},
				Capacity: capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, DryRun: true}},
			wantStatus: http.StatusOK,
			check: func(t *testing.T, m map[string]json.RawMessage) {
				if got := stringsField(t, m, "wouldTerminate"); !slices.Equal(got, []string{"vm-a"}) {
					t.Errorf("wouldTerminate = %v, want [vm-a]", got)
				}
				if got := stringsField(t, m, "wouldSkip"); len(got) != 0 {
					t.Errorf("wouldSkip = %v, want []", got)
				}
				assertAbsent(t, m, "terminated", "skipped", "reclaimId")
			},
		},
		{
			name: "release answers the reservation",
			req: req{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"],"reason":"idle"}`,
				header: map[string]string{"Idempotency-Key": "idem-2"}},
			svc: &fakeService{capacity: &capacity.CapacityResult{Reservation: reservation(nil, []string{"u1"})}},
			wantCall: call{Method: "Release", Principal: ownerPrincipal, Meta: capacity.RequestMeta{RequestID: reqID},
				Capacity: capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"},
					Reason: "idle", IdempotencyKey: "idem-2"}},
			wantStatus: http.StatusOK,
			check: func(t *testing.T, m map[string]json.RawMessage) {
				assertReservation(t, m)
				if got := stringsField(t, m, "releasedUnitIds"); !slices.Equal(got, []string{"u1"}) {
					t.Errorf("releasedUnitIds = %v, want [u1]", got)
				}
				assertAbsent(t, m, "reclaimId", "terminated", "skipped", "wouldTerminate", "wouldSkip")
			},
		},
		{
			name: "placement answers 201 with the VM",
			req: req{method: http.MethodPost, path: vmsPath, auth: ptr("Bearer " + secretOperator),
				body:   `{"vmId":"vm-9","orgId":"o9","tier":"spot","unitIds":["u3","u4"]}`,
				header: map[string]string{"Idempotency-Key": "idem-3"}},
			svc: &fakeService{placement: &capacity.PlacementResult{VM: capacity.VM{
				ID: "vm-9", NodeID: "n1", OrgID: "o9", Tier: capacity.TierSpot, UnitIDs: []string{"u3", "u4"},
				State: capacity.VMRunning, CreatedAt: now, Version: 1,
			}}},
			wantCall: call{Method: "Place", Meta: capacity.RequestMeta{RequestID: reqID},
				Principal: capacity.Principal{KeyID: "key-op", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermPlace}},
				Placement: capacity.PlacementRequest{NodeID: "n1", VMID: "vm-9", OrgID: "o9", Tier: capacity.TierSpot,
					UnitIDs: []string{"u3", "u4"}, IdempotencyKey: "idem-3"}},
			wantStatus: http.StatusCreated,
			check: func(t *testing.T, m map[string]json.RawMessage) {
				want := map[string]string{
					"id": `"vm-9"`, "nodeId": `"n1"`, "orgId": `"o9"`, "tier": `"spot"`,
					"unitIds": `["u3","u4"]`, "state": `"running"`, "createdAt": `"2026-11-02T00:00:00Z"`,
				}
				got := map[string]string{}
				for k, v := range m {
					got[k] = string(v)
				}
				if !maps.Equal(got, want) {
					t.Errorf("VM = %v, want %v", got, want)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.svc
			h := &httpapi.Handler{
				Service:   svc,
				Auth:      &auth.Authenticator{Keys: testKeys(), Now: func() time.Time { return now }},
				Logger:    quiet,
				RequestID: func(*http.Request) string { return reqID },
			}
			w := tt.req.do(t, h.Mux())
			if w.Code != tt.wantStatus {
				t.Fatalf("status = %d, want %d; body: %s", w.Code, tt.wantStatus, w.Body.String())
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			if got := w.Header().Get("Idempotent-Replayed"); got != "" {
				t.Errorf("Idempotent-Replayed = %q on a fresh result", got)
			}
			if got := w.Header().Get("X-Request-Id"); got != reqID {
				t.Errorf("X-Request-Id = %q, want %q", got, reqID)
			}
			calls := svc.Calls()
			if len(calls) != 1 || !reflect.DeepEqual(calls[0], tt.wantCall) {
				t.Fatalf("service calls = %+v\nwant exactly %+v", calls, tt.wantCall)
			}
			tt.check(t, jsonObject(t, w))
		})
	}
}

// assertReservation checks the fields the spec marks required, and their types.
func assertReservation(t *testing.T, m map[string]json.RawMessage) {
	t.Helper()
	for name, want := range map[string]string{
		"id": `"r1"`, "nodeId": `"n1"`, "startsAt": `"2026-11-01T00:00:00Z"`, "status": `"active"`,
		"topologyGen": `3`, "contractRef": `"c-42"`, "createdAt": `"2026-11-01T00:00:00Z"`,
		"updatedAt": `"2026-11-02T00:00:00Z"`,
	} {
		if got := string(m[name]); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	if got := stringsField(t, m, "allowedOrgIds"); !slices.Equal(got, []string{"aud"}) {
		t.Errorf("allowedOrgIds = %v", got)
	}
	if got := stringsField(t, m, "reservedUnitIds"); !slices.Equal(got, []string{"u0", "u1", "u2"}) {
		t.Errorf("reservedUnitIds = %v", got)
	}
	if got := stringsField(t, m, "managingOrgIds"); !slices.Equal(got, []string{"mgr"}) {
		t.Errorf("managingOrgIds = %v", got)
	}
	stringsField(t, m, "releasedUnitIds")
}

func TestReplayedResultIsMarked(t *testing.T) {
	tests := []struct {
		name string
		req  req
		svc  *fakeService
	}{
		{"reclaim", req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`},
			&fakeService{capacity: &capacity.CapacityResult{Reservation: reservation(nil, nil), Replayed: true}}},
		{"release", req{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
			&fakeService{capacity: &capacity.CapacityResult{Reservation: reservation(nil, nil), Replayed: true}}},
		{"placement", req{method: http.MethodPost, path: vmsPath, auth: ptr("Bearer " + secretOperator),
			body: `{"vmId":"vm-9","orgId":"o9","tier":"spot","unitIds":["u3"]}`},
			&fakeService{placement: &capacity.PlacementResult{VM: capacity.VM{ID: "vm-9"}, Replayed: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.header = map[string]string{"Idempotency-Key": "k1"}
			w := tt.req.do(t, newHandler(tt.svc))
			if w.Code >= 300 {
				t.Fatalf("status = %d: %s", w.Code, w.Body.String())
			}
			if got := w.Header().Get("Idempotent-Replayed"); got != "true" {
				t.Errorf("Idempotent-Replayed = %q, want \"true\"", got)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------
// Routing errors.

func TestWrongMethodIs405WithAllow(t *testing.T) {
	tests := []struct {
		method, path, allow string
	}{
		{http.MethodPost, reservationPath, "GET"},
		{http.MethodDelete, reservationPath, "GET"},
		{http.MethodGet, reclaimPath, "POST"},
		{http.MethodPut, reclaimPath, "POST"},
		{http.MethodGet, releasePath, "POST"},
		{http.MethodPatch, releasePath, "POST"},
		{http.MethodGet, vmsPath, "POST"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: tt.method, path: tt.path, body: `{"unitIds":["u1"]}`}.do(t, newHandler(svc))
			problem(t, w, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
			if got := w.Header().Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
			assertNoCalls(t, svc)
		})
	}
}

func TestUnknownPathIs404Problem(t *testing.T) {
	for _, path := range []string{
		"/",
		"/v1",
		"/v1/nodes/",
		"/v1/nodes/n1/",
		"/v1/nodes/n1/units/u1",
		reclaimPath + "/",
		reservationPath + "/cancel/x",
		"/v1/keys/key-1/x",
		"/v2/nodes/n1/reservations/r1/reclaim",
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			t.Run(method+" "+path, func(t *testing.T) {
				svc := &fakeService{}
				w := req{method: method, path: path, body: `{"unitIds":["u1"]}`}.do(t, newHandler(svc))
				problem(t, w, http.StatusNotFound, capacity.CodeNotFound)
				if got := w.Header().Get("Allow"); got != "" {
					t.Errorf("Allow = %q on a 404", got)
				}
				assertNoCalls(t, svc)
			})
		}
	}
}

// ---------------------------------------------------------------------------------------
// Request ids.

func TestRequestID(t *testing.T) {
	long := strings.Repeat("x", 129)
	tests := []struct {
		name     string
		fn       func(*http.Request) string
		header   string
		path     string
		authz    *string
		want     string // "" means: generated, non-empty and not the header
		wantCode int
	}{
		{"from RequestID func, success", func(*http.Request) string { return "apigw-1" }, "client-1", reclaimPath, nil, "apigw-1", 200},
		{"from RequestID func, 401", func(*http.Request) string { return "apigw-2" }, "", reclaimPath, ptr(""), "apigw-2", 401},
		{"from RequestID func, 404", func(*http.Request) string { return "apigw-3" }, "", "/nowhere", nil, "apigw-3", 404},
		{"from RequestID func, 405", func(*http.Request) string { return "apigw-4" }, "", reservationPath, nil, "apigw-4", 405},
		{"func empty: client header", func(*http.Request) string { return "" }, "client-5", reclaimPath, nil, "client-5", 200},
		{"no func: client header", nil, "client-6", reclaimPath, nil, "client-6", 200},
		{"no func, no header: generated", nil, "", reclaimPath, nil, "", 200},
		{"over-long header: generated", nil, long, reclaimPath, nil, "", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{capacity: &capacity.CapacityResult{}}
			h := &httpapi.Handler{
				Service:   svc,
				Auth:      &auth.Authenticator{Keys: testKeys(), Now: func() time.Time { return now }},
				Logger:    quiet,
				RequestID: tt.fn,
			}
			q := req{method: http.MethodPost, path: tt.path, body: `{"unitIds":["u1"]}`, auth: tt.authz}
			if tt.header != "" {
				q.header = map[string]string{"X-Request-Id": tt.header}
			}
			w := q.do(t, h.Mux())
			if w.Code != tt.wantCode {
				t.Fatalf("status = %d, want %d: %s", w.Code, tt.wantCode, w.Body.String())
			}
			got := w.Header().Get("X-Request-Id")
			switch {
			case tt.want != "" && got != tt.want:
				t.Errorf("X-Request-Id = %q, want %q", got, tt.want)
			case tt.want == "" && (got == "" || got == tt.header):
				t.Errorf("X-Request-Id = %q, want a generated id", got)
			}
			if calls := svc.Calls(); len(calls) == 1 && calls[0].Meta.RequestID != got {
				t.Errorf("service saw request id %q, response says %q", calls[0].Meta.RequestID, got)
			}
		})
	}
}
