package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/httpapi"
)

// ---------------------------------------------------------------------------------------
// Fixtures: keys, a recording fake Service, request helpers.

var (
	t0  = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	now = t0.Add(24 * time.Hour)
)

func ptr[T any](v T) *T { return &v }

// Secrets of the test keys. The key store holds only their hashes, as production does.
var (
	secretOwner    = capacity.FixedKeySecret("owner")    // node owner, may move capacity and read
	secretNoPerm   = capacity.FixedKeySecret("noperm")   // node owner, may only read
	secretNoRights = capacity.FixedKeySecret("norights") // node owner, no permission at all
	secretAudience = capacity.FixedKeySecret("audience") // in the reservation's audience, may move capacity
	secretStranger = capacity.FixedKeySecret("stranger") // unrelated org, may move capacity
	secretOperator = capacity.FixedKeySecret("operator") // the marketplace scheduler: operator, may place VMs only
	secretPlatform = capacity.FixedKeySecret("platform") // platform operator holding every permission
	secretOpNoVM   = capacity.FixedKeySecret("opnovm")   // platform operator, may move capacity but not place VMs
	secretPlacer   = capacity.FixedKeySecret("placer")   // node owner with vm.place, but not an operator
	secretRevoked  = capacity.FixedKeySecret("revoked")
	secretExpired  = capacity.FixedKeySecret("expired")
)

var ownerPrincipal = capacity.Principal{
	KeyID: "key-owner", OrgID: "owner", Permissions: []string{capacity.PermCapacity, capacity.PermRead},
}

func testKeys() *capacitytest.Keys {
	keys := &capacitytest.Keys{}
	add := func(secret string, k capacity.APIKey) { keys.Put(auth.Hash(secret), k) }
	add(secretOwner, capacity.APIKey{KeyID: "key-owner", OrgID: "owner", Permissions: []string{capacity.PermCapacity, capacity.PermRead}})
	add(secretNoPerm, capacity.APIKey{KeyID: "key-noperm", OrgID: "owner", Permissions: []string{capacity.PermRead}})
	add(secretNoRights, capacity.APIKey{KeyID: "key-norights", OrgID: "owner"})
	add(secretAudience, capacity.APIKey{KeyID: "key-aud", OrgID: "aud", Permissions: []string{capacity.PermCapacity, capacity.PermRead}})
	add(secretStranger, capacity.APIKey{KeyID: "key-stranger", OrgID: "stranger", Permissions: []string{capacity.PermCapacity, capacity.PermRead}})
	add(secretOperator, capacity.APIKey{KeyID: "key-op", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermPlace}})
	add(secretPlatform, capacity.APIKey{KeyID: "key-platform", OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions})
	add(secretOpNoVM, capacity.APIKey{KeyID: "key-opnovm", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermCapacity, capacity.PermRead}})
	add(secretPlacer, capacity.APIKey{KeyID: "key-placer", OrgID: "owner", Permissions: []string{capacity.PermPlace, capacity.PermCapacity}})
	add(secretRevoked, capacity.APIKey{KeyID: "key-revoked", OrgID: "owner", Permissions: []string{capacity.PermCapacity}, Revoked: true})
	add(secretExpired, capacity.APIKey{KeyID: "key-expired", OrgID: "owner", Permissions: []string{capacity.PermCapacity}, ExpiresAt: ptr(now)})
	return keys
}

// failingKeys is a key store that is down.
type failingKeys struct{}

func (failingKeys) LookupKey(context.Context, string) (*capacity.APIKey, error) {
	return nil, errors.New("dynamodb: GetItem arn:aws:dynamodb:eu-west-1:123456789012:table/state: throttled")
}

// call is one call the fake service received.
type call struct {
	Method    string
	Principal capacity.Principal
	Capacity  capacity.CapacityRequest
	Placement capacity.PlacementRequest
	NodeID    string
	ResID     string
	ID        string // a scheduled reclaim's
	At        time.Time
	Meta      capacity.RequestMeta
	opCall    // the operator routes' requests (operator_test.go)
}

// fakeService records its calls and answers with canned results.
type fakeService struct {
	mu        sync.Mutex
	calls     []call
	capacity  *capacity.CapacityResult
	placement *capacity.PlacementResult
	res       *capacity.Reservation
	op        *capacity.OperationView
	scheduled *capacity.ScheduleResult
	opResults // the operator routes' canned results (operator_test.go)
	err       error
}

func (f *fakeService) record(c call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *fakeService) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeService) Reclaim(_ context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error) {
	f.record(call{Method: "Reclaim", Principal: p, Capacity: req, Meta: meta})
	return orEmpty(f.capacity, f.err), f.err
}

func (f *fakeService) Release(_ context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error) {
	f.record(call{Method: "Release", Principal: p, Capacity: req, Meta: meta})
	return orEmpty(f.capacity, f.err), f.err
}

func (f *fakeService) Place(_ context.Context, p capacity.Principal, req capacity.PlacementRequest, meta capacity.RequestMeta) (*capacity.PlacementResult, error) {
	f.record(call{Method: "Place", Principal: p, Placement: req, Meta: meta})
	return orEmpty(f.placement, f.err), f.err
}

func (f *fakeService) GetReservation(_ context.Context, p capacity.Principal, nodeID, reservationID string) (*capacity.Reservation, error) {
	f.record(call{Method: "GetReservation", Principal: p, NodeID: nodeID, ResID: reservationID})
	return orEmpty(f.res, f.err), f.err
}

func (f *fakeService) GetOperation(_ context.Context, p capacity.Principal, nodeID, reservationID, opID string) (*capacity.OperationView, error) {
	f.record(call{Method: "GetOperation", Principal: p, NodeID: nodeID, ResID: reservationID})
	return orEmpty(f.op, f.err), f.err
}

func (f *fakeService) Redrive(_ context.Context, p capacity.Principal, nodeID, reservationID, opID string, meta capacity.RequestMeta) (*capacity.RedriveResult, error) {
	f.record(call{Method: "Redrive", Principal: p, NodeID: nodeID, ResID: reservationID, Meta: meta})
	return orEmpty((*capacity.RedriveResult)(nil), f.err), f.err
}

func (f *fakeService) ScheduleReclaim(_ context.Context, p capacity.Principal, req capacity.CapacityRequest, at time.Time, meta capacity.RequestMeta) (*capacity.ScheduleResult, error) {
	f.record(call{Method: "ScheduleReclaim", Principal: p, Capacity: req, Meta: meta, At: at})
	return orEmpty(f.scheduled, f.err), f.err
}

func (f *fakeService) GetScheduledReclaim(_ context.Context, p capacity.Principal, nodeID, reservationID, id string) (*capacity.ScheduledReclaim, error) {
	f.record(call{Method: "GetScheduledReclaim", Principal: p, NodeID: nodeID, ResID: reservationID, ID: id})
	return orEmpty(scheduledOf(f.scheduled), f.err), f.err
}

func (f *fakeService) ListScheduledReclaims(_ context.Context, p capacity.Principal, nodeID, reservationID string, page capacity.PageRequest) (*capacity.ScheduledPage, error) {
	c := call{Method: "ListScheduledReclaims", Principal: p, NodeID: nodeID, ResID: reservationID}
	c.Page = page
	f.record(c)
	if f.err != nil {
		return nil, f.err
	}
	out := &capacity.ScheduledPage{Scheduled: []capacity.ScheduledReclaim{}, NextCursor: "next-1"}
	if sr := scheduledOf(f.scheduled); sr != nil {
		out.Scheduled = append(out.Scheduled, *sr)
	}
	return out, nil
}

func (f *fakeService) CancelScheduledReclaim(_ context.Context, p capacity.Principal, nodeID, reservationID, id string, meta capacity.RequestMeta) (*capacity.ScheduledReclaim, error) {
	f.record(call{Method: "CancelScheduledReclaim", Principal: p, NodeID: nodeID, ResID: reservationID, ID: id, Meta: meta})
	return orEmpty(scheduledOf(f.scheduled), f.err), f.err
}

func scheduledOf(r *capacity.ScheduleResult) *capacity.ScheduledReclaim {
	if r == nil {
		return nil
	}
	return &r.Scheduled
}

// orEmpty answers a zero result when no result or error was canned, as a real service
// would never answer (nil, nil).
func orEmpty[T any](v *T, err error) *T {
	if v == nil && err == nil {
		return new(T)
	}
	return v
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newHandler serves svc behind the real authenticator over testKeys, at the fixed time now.
func newHandler(svc httpapi.Service) http.Handler {
	return newHandlerWithKeys(svc, testKeys())
}

func newHandlerWithKeys(svc httpapi.Service, keys auth.KeyStore) http.Handler {
	h := &httpapi.Handler{
		Service: svc,
		Auth:    &auth.Authenticator{Keys: keys, TTL: time.Minute, Now: func() time.Time { return now }},
		Logger:  quiet,
	}
	return h.Mux()
}

// req describes a request; zero fields mean: owner's key, JSON content type.
type req struct {
	method, path string
	body         string
	auth         *string // nil: "Bearer " + secretOwner
	contentType  *string // nil: application/json
	header       map[string]string
}

func (q req) do(t *testing.T, h http.Handler) *httptest.ResponseRecorder {
	t.Helper()
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	r := httptest.NewRequest(q.method, q.path, body)
	switch {
	case q.auth == nil:
		r.Header.Set("Authorization", "Bearer "+secretOwner)
	case *q.auth != "":
		r.Header.Set("Authorization", *q.auth)
	}
	switch {
	case q.contentType == nil:
		r.Header.Set("Content-Type", "application/json")
	case *q.contentType != "":
		r.Header.Set("Content-Type", *q.contentType)
	}
	for k, v := range q.header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

const (
	reservationPath = "/v1/nodes/n1/reservations/r1"
	reclaimPath     = reservationPath + "/reclaim"
	releasePath     = reservationPath + "/release"
	vmsPath         = "/v1/nodes/n1/vms"
)

// jsonObject decodes a response body into its top-level members.
func jsonObject(t *testing.T, w *httptest.ResponseRecorder) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("body is not a JSON object: %v\n%s", err, w.Body.String())
	}
	return m
}

// problem checks that w is an RFC 9457 problem with the status and code, and returns it.
func problem(t *testing.T, w *httptest.ResponseRecorder, status int, code capacity.Code) httpapi.Problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body: %s", w.Code, status, w.Body.String())
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	m := jsonObject(t, w)
	for _, f := range []string{"type", "title", "status", "detail", "code"} {
		if _, ok := m[f]; !ok {
			t.Errorf("problem lacks %q: %s", f, w.Body.String())
		}
	}
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.DisallowUnknownFields()
	var p httpapi.Problem
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("decode problem: %v", err)
	}
	if p.Status != status || p.Code != code || p.Title != http.StatusText(status) ||
		p.Type != httpapi.ProblemTypeBase+string(code) || p.Detail == "" {
		t.Errorf("problem = %+v, want status %d, code %q, title %q, type %q and a detail",
			p, status, code, http.StatusText(status), httpapi.ProblemTypeBase+string(code))
	}
	return p
}

func stringsField(t *testing.T, m map[string]json.RawMessage, name string) []string {
	t.Helper()
	raw, ok := m[name]
	if !ok {
		t.Fatalf("field %q is absent", name)
	}
	var out []string
	if err := json.Unmarshal(raw, &out); err != nil || out == nil {
		t.Fatalf("field %q = %s, want an array of strings", name, raw)
	}
	return out
}

func assertAbsent(t *testing.T, m map[string]json.RawMessage, names ...string) {
	t.Helper()
	for _, n := range names {
		if v, ok := m[n]; ok {
			t.Errorf("field %q = %s, want it absent", n, v)
		}
	}
}

func assertNoCalls(t *testing.T, svc *fakeService) {
	t.Helper()
	if calls := svc.Calls(); len(calls) != 0 {
		t.Errorf("service was called: %+v", calls)
	}
}

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
		"/v1/nodes",
		"/v1/nodes/n1/",
		"/v1/nodes/n1/units",
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
// Authentication.

func TestUnauthenticatedIs401AndNeverReachesTheService(t *testing.T) {
	headers := []struct {
		name, auth string
	}{
		{"missing", ""},
		{"scheme only", "Bearer"},
		{"empty key", "Bearer "},
		{"blank key", "Bearer    "},
		{"no scheme", secretOwner},
		{"basic scheme with a valid secret", "Basic " + secretOwner},
		{"basic credentials", "Basic dXNlcjpwYXNz"},
		{"other scheme", "Token " + secretOwner},
		{"scheme glued to key", "Bearer" + secretOwner},
		{"unknown key", "Bearer " + capacity.FixedKeySecret("nobody")},
		{"retired ork_ key", "Bearer ork_owner"},
		{"ocap_ junk", "Bearer " + capacity.KeyPrefix + strings.Repeat("x", 49)},
		{"key with a typo", "Bearer " + secretOwner + "x"},
		{"revoked key", "Bearer " + secretRevoked},
		{"expired key (expires now)", "Bearer " + secretExpired},
	}
	routes := []req{
		{method: http.MethodGet, path: reservationPath},
		{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`},
		{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
		{method: http.MethodPost, path: vmsPath, body: `{"vmId":"v","orgId":"o","tier":"spot","unitIds":["u1"]}`},
		// authentication comes before the body is looked at
		{method: http.MethodPost, path: reclaimPath, body: `{"dryrun":true`, contentType: ptr("text/plain")},
	}
	for _, hd := range headers {
		for _, rt := range routes {
			t.Run(hd.name+"/"+rt.method+" "+rt.path, func(t *testing.T) {
				svc := &fakeService{capacity: &capacity.CapacityResult{}, res: &capacity.Reservation{},
					placement: &capacity.PlacementResult{}}
				rt.auth = ptr(hd.auth)
				w := rt.do(t, newHandler(svc))
				problem(t, w, http.StatusUnauthorized, capacity.CodeUnauthenticated)
				if got := w.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer ") {
					t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", got)
				}
				assertNoCalls(t, svc)
			})
		}
	}
}

// A junk bearer that looks like a key costs no key-table read: an ocap_ one that fails its
// checksum, and any ork_ one (the retired unchecksummed format), even one the table holds.
// A well-formed unknown key is the control: it is read once.
func TestJunkBearerIs401WithoutAKeyRead(t *testing.T) {
	keys := testKeys()
	legacy, _ := keys.Get(auth.Hash(secretOwner))
	keys.Put(auth.Hash("ork_owner"), legacy)
	for _, tt := range []struct {
		name, bearer string
		reads        int
	}{
		{"ocap_ with a wrong checksum", secretOwner[:len(secretOwner)-1] + "x", 0},
		{"ocap_ truncated", secretOwner[:len(secretOwner)-1], 0},
		{"ocap_ junk of a key's length", capacity.KeyPrefix + strings.Repeat("x", 49), 0},
		{"ork_ junk", "ork_" + strings.Repeat("x", 40), 0},
		{"ork_ key the table holds", "ork_owner", 0},
		{"well-formed unknown ocap_ key", capacity.FixedKeySecret("nobody"), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := keys.AllLookups()
			svc := &fakeService{}
			w := req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`, auth: ptr("Bearer " + tt.bearer)}.do(t, newHandlerWithKeys(svc, keys))
			problem(t, w, http.StatusUnauthorized, capacity.CodeUnauthenticated)
			if reads := keys.AllLookups() - before; reads != tt.reads {
				t.Errorf("key table reads = %d, want %d", reads, tt.reads)
			}
			assertNoCalls(t, svc)
		})
	}
}

func TestKeyStoreFailureIs500WithoutDetails(t *testing.T) {
	svc := &fakeService{}
	w := req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`}.do(t, newHandlerWithKeys(svc, failingKeys{}))
	p := problem(t, w, http.StatusInternalServerError, capacity.CodeInternal)
	if p.Detail != "internal error" {
		t.Errorf("detail = %q", p.Detail)
	}
	for _, leak := range []string{"dynamodb", "arn:", "throttled", "123456789012"} {
		if strings.Contains(w.Body.String(), leak) {
			t.Errorf("500 body leaks %q: %s", leak, w.Body.String())
		}
	}
	if got := w.Header().Get("WWW-Authenticate"); got != "" {
		t.Errorf("WWW-Authenticate = %q on a 500", got)
	}
	assertNoCalls(t, svc)
}

// ---------------------------------------------------------------------------------------
// Strict decoding: a body that is not exactly the documented one never reaches the service.

func TestBadBodyNeverReachesTheService(t *testing.T) {
	big := `{"unitIds":["u1"],"reason":"` + strings.Repeat("a", httpapi.MaxBodyBytes) + `"}`
	tests := []struct {
		name        string
		path        string
		contentType *string
		body        string
		status      int
		code        capacity.Code
	}{
		{"malformed JSON", reclaimPath, nil, `{"unitIds":["u1"]`, 400, httpapi.CodeMalformedRequest},
		{"unquoted key", reclaimPath, nil, `{unitIds:["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"empty body", reclaimPath, nil, ``, 400, httpapi.CodeMalformedRequest},
		{"whitespace body", reclaimPath, nil, " \n\t", 400, httpapi.CodeMalformedRequest},
		{"typo dryrun true", reclaimPath, nil, `{"unitIds":["u1"],"dryrun":true}`, 400, httpapi.CodeMalformedRequest},
		{"typo dryrun false", reclaimPath, nil, `{"unitIds":["u1"],"dryrun":false}`, 400, httpapi.CodeMalformedRequest},
		{"typo DryRun", reclaimPath, nil, `{"unitIds":["u1"],"DryRun":true}`, 400, httpapi.CodeMalformedRequest},
		{"typo dry_run", reclaimPath, nil, `{"unitIds":["u1"],"dry_run":true}`, 400, httpapi.CodeMalformedRequest},
		{"upper-case unitIds", reclaimPath, nil, `{"UNITIDS":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds with a long s", reclaimPath, nil, `{"unitId\u017f":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"unknown field", reclaimPath, nil, `{"unitIds":["u1"],"force":true}`, 400, httpapi.CodeMalformedRequest},
		{"duplicate dryRun", reclaimPath, nil, `{"unitIds":["u1"],"dryRun":true,"dryRun":false}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds as string", reclaimPath, nil, `{"unitIds":"u1"}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds of numbers", reclaimPath, nil, `{"unitIds":[1,2]}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds nested", reclaimPath, nil, `{"unitIds":[["u1"]]}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds object", reclaimPath, nil, `{"unitIds":{"u1":true}}`, 400, httpapi.CodeMalformedRequest},
		{"dryRun as string", reclaimPath, nil, `{"unitIds":["u1"],"dryRun":"yes"}`, 400, httpapi.CodeMalformedRequest},
		{"dryRun as number", reclaimPath, nil, `{"unitIds":["u1"],"dryRun":1}`, 400, httpapi.CodeMalformedRequest},
		{"reason as number", reclaimPath, nil, `{"unitIds":["u1"],"reason":42}`, 400, httpapi.CodeMalformedRequest},
		{"array body", reclaimPath, nil, `["u1"]`, 400, httpapi.CodeMalformedRequest},
		{"string body", reclaimPath, nil, `"u1"`, 400, httpapi.CodeMalformedRequest},
		{"null body", reclaimPath, nil, `null`, 400, httpapi.CodeMalformedRequest},
		{"two objects", reclaimPath, nil, `{"unitIds":["u1"]}{"unitIds":["u2"],"dryRun":true}`, 400, httpapi.CodeMalformedRequest},
		{"trailing garbage", reclaimPath, nil, `{"unitIds":["u1"]} x`, 400, httpapi.CodeMalformedRequest},
		{"trailing bracket", reclaimPath, nil, `{"unitIds":["u1"]}]`, 400, httpapi.CodeMalformedRequest},
		{"body over 64 KiB", reclaimPath, nil, big, 413, httpapi.CodeBodyTooLarge},
		{"text/plain", reclaimPath, ptr("text/plain"), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"no content type", reclaimPath, ptr(""), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"form content type", reclaimPath, ptr("application/x-www-form-urlencoded"), `unitIds=u1`, 415, httpapi.CodeUnsupportedMediaType},
		{"unparsable content type", reclaimPath, ptr("application/json; ;"), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"release unknown field", releasePath, nil, `{"unitIds":["u1"],"dryrun":true}`, 400, httpapi.CodeMalformedRequest},
		{"release text/plain", releasePath, ptr("text/plain"), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"release too large", releasePath, nil, big, 413, httpapi.CodeBodyTooLarge},
		{"placement unknown field", vmsPath, nil, `{"vmId":"v","orgId":"o","tier":"spot","unitIds":["u1"],"force":1}`, 400, httpapi.CodeMalformedRequest},
		{"placement case variant", vmsPath, nil, `{"vmid":"v","orgId":"o","tier":"spot","unitIds":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"placement wrong type", vmsPath, nil, `{"vmId":"v","orgId":"o","tier":1,"unitIds":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"placement no content type", vmsPath, ptr(""), `{"vmId":"v","orgId":"o","tier":"spot","unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{}
			authz := "Bearer " + secretOwner
			if tt.path == vmsPath {
				authz = "Bearer " + secretOperator
			}
			w := req{method: http.MethodPost, path: tt.path, body: tt.body, contentType: tt.contentType, auth: &authz}.do(t, newHandler(svc))
			problem(t, w, tt.status, tt.code)
			assertNoCalls(t, svc)
		})
	}
}

func TestAcceptableBodiesReachTheService(t *testing.T) {
	atLimit := `{"unitIds":["u1"],"reason":"`
	atLimit += strings.Repeat("a", httpapi.MaxBodyBytes-len(atLimit)-2) + `"}`
	tests := []struct {
		name        string
		contentType string
		body        string
		want        capacity.CapacityRequest
	}{
		{"charset parameter", "application/json; charset=utf-8", `{"unitIds":["u1"]}`,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}}},
		{"upper-case media type", "Application/JSON", `{"unitIds":["u1"]}`,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}}},
		{"surrounding whitespace", "application/json", " \n{\"unitIds\":[\"u1\"],\"dryRun\":true}\n ",
			capacity.CapacityRequest{UnitIDs: []string{"u1"}, DryRun: true}},
		{"escaped member name is the same name", "application/json", `{"unit\u0049ds":["u1"]}`,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}}},
		{"exactly 64 KiB", "application/json", atLimit,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}, Reason: strings.Repeat("a", httpapi.MaxBodyBytes-len(`{"unitIds":["u1"],"reason":""}`))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{capacity: &capacity.CapacityResult{}}
			w := req{method: http.MethodPost, path: reclaimPath, body: tt.body, contentType: &tt.contentType}.do(t, newHandler(svc))
			if w.Code != http.StatusOK {
				t.Fatalf("status = %d: %s", w.Code, w.Body.String())
			}
			calls := svc.Calls()
			if len(calls) != 1 {
				t.Fatalf("calls = %d, want 1", len(calls))
			}
			tt.want.NodeID, tt.want.ReservationID = "n1", "r1"
			if got := calls[0].Capacity; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("request = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------
// Error codes map to statuses.

func TestEveryErrorCodeMapsToItsStatus(t *testing.T) {
	tests := []struct {
		code   capacity.Code
		status int
	}{
		{capacity.CodeUnauthenticated, 401},
		{capacity.CodeForbidden, 403},
		{capacity.CodeNotFound, 404},
		{capacity.CodeReservationNotActive, 409},
		{capacity.CodeOutsideTerm, 409},
		{capacity.CodeTopologyChanged, 409},
		{capacity.CodeUnitsInUse, 409},
		{capacity.CodeUnitsUnavailable, 409},
		{capacity.CodeVMExists, 409},
		{capacity.CodeConcurrentModification, 409},
		{capacity.CodeOperationRunning, 409},
		{capacity.CodeScheduledReclaimCancelled, 409},
		{capacity.CodeScheduledReclaimFired, 409},
		{capacity.CodeCreatorKeyInvalid, 409},
		{capacity.CodeScheduledReclaimNotDue, 409},
		{capacity.CodeScheduledReclaimLimit, 409},
		{capacity.CodeReservationExists, 409},
		{capacity.CodeReservationOverlap, 409},
		{capacity.CodeInvalidTransition, 409},
		{capacity.CodePlanChanged, 412},
		{capacity.CodeSchedulingUnavailable, 501},
		{capacity.CodeRateLimited, 429},
		{capacity.CodeThrottled, 503},
		{capacity.CodeInvalidRequest, 422},
		{capacity.CodeUnitsNotReserved, 422},
		{capacity.CodeUnknownUnits, 422},
		{capacity.CodeIdempotencyKeyReused, 422},
		{capacity.CodeInternal, 500},
		{httpapi.CodeMalformedRequest, 400},
		{httpapi.CodeBodyTooLarge, 413},
		{httpapi.CodeUnsupportedMediaType, 415},
		{httpapi.CodeMethodNotAllowed, 405},
		{"no_such_code", 500},
	}
	covered := map[capacity.Code]bool{}
	for _, tt := range tests {
		covered[tt.code] = true
	}
	for _, c := range declaredCodes(t) {
		if !covered[c] {
			t.Errorf("code %q is declared in shared/capacity or shared/httpapi but not covered here", c)
		}
	}

	routes := []req{
		{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`},
		{method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
		{method: http.MethodPost, path: vmsPath, auth: ptr("Bearer " + secretOperator), body: `{"vmId":"v","orgId":"o","tier":"spot","unitIds":["u1"]}`},
		{method: http.MethodGet, path: reservationPath},
		{method: http.MethodPut, path: "/v1/nodes/n1", auth: ptr("Bearer " + secretPlatform), body: `{"ownerOrgId":"o","unitIds":["u1"],"agentEndpoint":"https://a"}`},
		{method: http.MethodPost, path: reservationPath + "/cancel", auth: ptr("Bearer " + secretPlatform)},
		{method: http.MethodGet, path: "/v1/keys", auth: ptr("Bearer " + secretPlatform)},
		{method: http.MethodGet, path: "/v1/nodes/n1/reservations/r1/audit"},
	}
	for _, tt := range tests {
		for _, rt := range routes {
			t.Run(fmt.Sprintf("%s/%s %s", tt.code, rt.method, rt.path), func(t *testing.T) {
				err := &capacity.Error{Code: tt.code, Message: "message for " + string(tt.code), UnitIDs: []string{"u7"}}
				svc := &fakeService{err: fmt.Errorf("wrapped: %w", err)}
				w := rt.do(t, newHandler(svc))
				p := problem(t, w, tt.status, tt.code)
				if tt.status < 500 {
					if p.Detail != err.Message || !slices.Equal(p.UnitIDs, err.UnitIDs) {
						t.Errorf("problem = %+v, want detail %q and unitIds %v", p, err.Message, err.UnitIDs)
					}
				}
				if got := w.Header().Get("WWW-Authenticate"); (tt.status == 401) != strings.HasPrefix(got, "Bearer ") {
					t.Errorf("WWW-Authenticate = %q with status %d", got, tt.status)
				}
				if got := w.Header().Get("Cache-Control"); got != "no-store" {
					t.Errorf("Cache-Control = %q, want no-store", got)
				}
			})
		}
	}
}

// declaredCodes returns the values of every Code constant in shared/capacity and
// shared/httpapi, so that a code added later without a status fails the test above.
func declaredCodes(t *testing.T) []capacity.Code {
	t.Helper()
	fset := token.NewFileSet()
	var codes []capacity.Code
	for _, dir := range []string{"../capacity", "."} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
			if err != nil {
				t.Fatalf("parse %s: %v", e.Name(), err)
			}
			{
				ast.Inspect(f, func(n ast.Node) bool {
					vs, ok := n.(*ast.ValueSpec)
					if !ok || vs.Type == nil || len(vs.Values) != len(vs.Names) {
						return true
					}
					typ := types(vs.Type)
					if typ != "Code" && typ != "capacity.Code" {
						return true
					}
					for _, v := range vs.Values {
						if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							s, _ := strconv.Unquote(lit.Value)
							codes = append(codes, capacity.Code(s))
						}
					}
					return true
				})
			}
		}
	}
	if len(codes) < 15 {
		t.Fatalf("found only %d codes: %v", len(codes), codes)
	}
	return codes
}

func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return types(e.X) + "." + e.Sel.Name
	}
	return ""
}

func TestInternalErrorsDoNotLeak(t *testing.T) {
	secret := "dynamodb: TransactWriteItems arn:aws:dynamodb:eu-west-1:123456789012:table/state: ValidationException"
	tests := []struct {
		name string
		err  error
	}{
		{"plain error", errors.New(secret)},
		{"wrapped error", fmt.Errorf("commit reclaim of reservation r1: %w", errors.New(secret))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{err: tt.err}
			w := req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`}.do(t, newHandler(svc))
			p := problem(t, w, http.StatusInternalServerError, capacity.CodeInternal)
			for _, leak := range []string{"dynamodb", "arn:", "123456789012", "ValidationException", "commit reclaim"} {
				if strings.Contains(w.Body.String(), leak) {
					t.Errorf("500 body leaks %q: %s", leak, w.Body.String())
				}
			}
			if p.Detail != "internal error" {
				t.Errorf("detail = %q, want \"internal error\"", p.Detail)
			}
		})
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

// ---------------------------------------------------------------------------------------
// The real domain service behind the handler, over an in-memory store.

// memStore is an in-memory capacity.Store: one node state per node id, conditioned commits.
type memStore struct {
	mu     sync.Mutex
	nodes  map[string]*capacity.NodeState
	idem   map[string]*capacity.IdempotencyRecord
	audits []capacity.AuditRecord
}

// clone deep-copies v, so the service never shares memory with the store.
func clone[T any](v T) T {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

func (s *memStore) LoadNode(_ context.Context, nodeID, scope string) (*capacity.NodeState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.nodes[nodeID]
	if !ok {
		return nil, capacity.Errorf(capacity.CodeNotFound, "node %s not found", nodeID)
	}
	out := clone(st)
	if scope != "" {
		if rec, ok := s.idem[scope]; ok {
			out.Idempotency = clone(rec)
		}
	}
	return out, nil
}

func (s *memStore) Commit(_ context.Context, c capacity.Commit) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.nodes[c.Node.ID]
	if st == nil || st.Node.Version != c.Node.Version {
		return fmt.Errorf("commit: %w", capacity.ErrConflict)
	}
	if c.BumpNode {
		st.Node.Version++
	}
	if c.Reservation != nil {
		r := st.Reservation(c.Reservation.ID)
		if r == nil || r.Version != c.Reservation.Version {
			return fmt.Errorf("commit: %w", capacity.ErrConflict)
		}
		*r = *c.Reservation
		r.Version++
	}
	for _, ev := range c.Evict {
		for i := range st.VMs {
			if st.VMs[i].ID == ev.ID {
				st.VMs[i].State = capacity.VMTerminating
				st.VMs[i].ReclaimID = c.Operation.ID
				st.VMs[i].Version++
			}
		}
	}
	if c.NewVM != nil {
		st.VMs = append(st.VMs, *c.NewVM)
	}
	if c.Idempotency != nil {
		s.idem[c.Idempotency.Scope] = c.Idempotency
	}
	s.audits = append(s.audits, c.Audit)
	return nil
}

func (s *memStore) GetOperation(context.Context, string, string) (*capacity.Operation, error) {
	return nil, capacity.Errorf(capacity.CodeNotFound, "no operations in this fake")
}

func (s *memStore) RedriveOperation(context.Context, capacity.Operation, capacity.AuditRecord, time.Time) error {
	return capacity.Errorf(capacity.CodeNotFound, "no operations in this fake")
}

// Landed finds the commit's audit record, as the DynamoDB store does (this store's commits
// never fail ambiguously, but a wrapper in a test may make them).
func (s *memStore) Landed(_ context.Context, c capacity.Commit) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.audits, func(a capacity.AuditRecord) bool { return a.ID == c.Audit.ID }), nil
}

func (s *memStore) AppendAudit(_ context.Context, rec capacity.AuditRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.audits = append(s.audits, rec)
	return nil
}

func (s *memStore) RecordUnchanged(_ context.Context, rec capacity.AuditRecord, idem *capacity.IdempotencyRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if idem != nil {
		s.idem[idem.Scope] = idem
	}
	s.audits = append(s.audits, rec)
	return nil
}

// newRealHandler serves the real capacity.Service over a node n1 of units u0..u7 with one
// open-ended active reservation r1 of u0..u5 (audience "aud", managed by "mgr", u2..u5
// released), and VMs: vm-res (reserved, u0), vm-spot-a (spot, u2), vm-spot-b (spot, u3).
func newRealHandler(t *testing.T) (http.Handler, *memStore) {
	t.Helper()
	store := &memStore{
		nodes: map[string]*capacity.NodeState{"n1": {
			Node: capacity.Node{ID: "n1", OwnerOrgID: "owner", TopologyGen: 3,
				UnitIDs: []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}, Version: 10},
			Reservations: []capacity.Reservation{{
				ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: []string{"mgr"},
				ReservedUnitIDs: []string{"u0", "u1", "u2", "u3", "u4", "u5"}, ReleasedUnitIDs: []string{"u2", "u3", "u4", "u5"},
				StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 3, Version: 4, CreatedAt: t0, UpdatedAt: t0,
			}},
			VMs: []capacity.VM{
				{ID: "vm-res", NodeID: "n1", OrgID: "aud", Tier: capacity.TierReserved, UnitIDs: []string{"u0"}, State: capacity.VMRunning, Version: 1},
				{ID: "vm-spot-a", NodeID: "n1", OrgID: "x", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}, State: capacity.VMRunning, Version: 1},
				{ID: "vm-spot-b", NodeID: "n1", OrgID: "y", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}, State: capacity.VMRunning, Version: 1},
			},
		}},
		idem: map[string]*capacity.IdempotencyRecord{},
	}
	var n int
	var mu sync.Mutex
	svc := &capacity.Service{
		Store:  store,
		Now:    func() time.Time { return now },
		Logger: quiet,
		NewID: func() string {
			mu.Lock()
			defer mu.Unlock()
			n++
			return fmt.Sprintf("id%d", n)
		},
	}
	return newHandler(svc), store
}

func TestNotFoundIsIndistinguishable(t *testing.T) {
	body := `{"unitIds":["u2"]}`
	groups := []struct {
		name  string
		cases []req
	}{
		{"reclaim", []req{
			{auth: ptr("Bearer " + secretNoPerm), method: http.MethodPost, path: reclaimPath, body: body},
			{auth: ptr("Bearer " + secretNoRights), method: http.MethodPost, path: reclaimPath, body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/reclaim", body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n9/reservations/r1/reclaim", body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r!/reclaim", body: body},
			{auth: ptr("Bearer " + secretStranger), method: http.MethodPost, path: reclaimPath, body: body},
			{auth: ptr("Bearer " + secretNoPerm), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/reclaim", body: `{"unitIds":[]}`},
		}},
		{"release", []req{
			{auth: ptr("Bearer " + secretNoPerm), method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/release", body: `{"unitIds":["u1"]}`},
			{auth: ptr("Bearer " + secretStranger), method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
		}},
		{"get", []req{
			{auth: ptr("Bearer " + secretNoRights), method: http.MethodGet, path: reservationPath},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n1/reservations/r9"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n9/reservations/r1"},
			{auth: ptr("Bearer " + secretStranger), method: http.MethodGet, path: reservationPath},
			// Malformed path ids name nothing, on every reservation route.
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n1/reservations/" + strings.Repeat("r", 2048)},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n1/reservations/%2E%2E"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: reservationPath + "/reclaims/" + strings.Repeat("x", 2048)},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: reservationPath + "/reclaims/rcl%2F1"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: reservationPath + "/reclaims/%2E%2E"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n%201/reservations/r1/reclaims/rcl_1"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/" + strings.Repeat("n", 129) + "/reservations/r1/reclaim", body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/-r1/release", body: body},
		}},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			h, store := newRealHandler(t)
			var first *httptest.ResponseRecorder
			for i, q := range g.cases {
				w := q.do(t, h)
				problem(t, w, http.StatusNotFound, capacity.CodeNotFound)
				if first == nil {
					first = w
					continue
				}
				if !bytes.Equal(w.Body.Bytes(), first.Body.Bytes()) {
					t.Errorf("case %d body differs:\n%s\nvs case 0:\n%s", i, w.Body.String(), first.Body.String())
				}
				a, b := first.Header().Clone(), w.Header().Clone()
				if a.Get("X-Request-Id") == "" || b.Get("X-Request-Id") == "" {
					t.Errorf("X-Request-Id missing")
				}
				a.Del("X-Request-Id")
				b.Del("X-Request-Id")
				if !reflect.DeepEqual(a, b) {
					t.Errorf("case %d headers differ: %v vs case 0: %v", i, b, a)
				}
			}
			if len(store.audits) != 0 {
				t.Errorf("404s were audited against the reservation: %+v", store.audits)
			}
		})
	}
}

func TestAudienceGets403(t *testing.T) {
	h, _ := newRealHandler(t)
	w := req{auth: ptr("Bearer " + secretAudience), method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u2"]}`}.do(t, h)
	problem(t, w, http.StatusForbidden, capacity.CodeForbidden)
	// The audience may still read the reservation.
	w = req{auth: ptr("Bearer " + secretAudience), method: http.MethodGet, path: reservationPath}.do(t, h)
	if w.Code != http.StatusOK {
		t.Fatalf("GET as audience = %d: %s", w.Code, w.Body.String())
	}
}

func TestReclaimThroughTheRealService(t *testing.T) {
	h, store := newRealHandler(t)
	reclaim := func(body, key string) *httptest.ResponseRecorder {
		q := req{method: http.MethodPost, path: reclaimPath, body: body}
		if key != "" {
			q.header = map[string]string{"Idempotency-Key": key}
		}
		return q.do(t, h)
	}

	// A dry run reports and changes nothing.
	w := reclaim(`{"unitIds":["u0","u2"],"dryRun":true,"reason":"préemption 🚀"}`, "")
	if w.Code != http.StatusOK {
		t.Fatalf("dry run = %d: %s", w.Code, w.Body.String())
	}
	m := jsonObject(t, w)
	if got := stringsField(t, m, "wouldTerminate"); !slices.Equal(got, []string{"vm-spot-a"}) {
		t.Errorf("wouldTerminate = %v", got)
	}
	if got := stringsField(t, m, "wouldSkip"); !slices.Equal(got, []string{"vm-res"}) {
		t.Errorf("wouldSkip = %v", got)
	}
	if got := stringsField(t, m, "releasedUnitIds"); !slices.Equal(got, []string{"u2", "u3", "u4", "u5"}) {
		t.Errorf("dry run releasedUnitIds = %v, want unchanged", got)
	}
	assertAbsent(t, m, "terminated", "skipped", "reclaimId", "endsAt")
	if st := store.nodes["n1"]; st.Node.Version != 10 || st.VMs[1].State != capacity.VMRunning {
		t.Fatalf("dry run changed the store: %+v", st)
	}

	// The real reclaim evicts, and a retry with the same key replays the same answer.
	body := `{"unitIds":["u0","u2"],"reason":"customer needs them"}`
	w = reclaim(body, "k-1")
	if w.Code != http.StatusOK {
		t.Fatalf("reclaim = %d: %s", w.Code, w.Body.String())
	}
	if got := w.Header().Get("Idempotent-Replayed"); got != "" {
		t.Errorf("first call Idempotent-Replayed = %q", got)
	}
	m = jsonObject(t, w)
	if got := stringsField(t, m, "terminated"); !slices.Equal(got, []string{"vm-spot-a"}) {
		t.Errorf("terminated = %v", got)
	}
	if got := stringsField(t, m, "skipped"); !slices.Equal(got, []string{"vm-res"}) {
		t.Errorf("skipped = %v", got)
	}
	if got := stringsField(t, m, "releasedUnitIds"); !slices.Equal(got, []string{"u3", "u4", "u5"}) {
		t.Errorf("releasedUnitIds = %v", got)
	}
	var reclaimID string
	if err := json.Unmarshal(m["reclaimId"], &reclaimID); err != nil || !strings.HasPrefix(reclaimID, "rcl_") {
		t.Errorf("reclaimId = %s, want rcl_…", m["reclaimId"])
	}
	assertAbsent(t, m, "wouldTerminate", "wouldSkip", "endsAt")
	if vm := store.nodes["n1"].VMs[1]; vm.State != capacity.VMTerminating || vm.ReclaimID != reclaimID {
		t.Errorf("evicted VM = %+v", vm)
	}

	replay := reclaim(body, "k-1")
	if replay.Code != http.StatusOK || replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay = %d, Idempotent-Replayed %q: %s", replay.Code, replay.Header().Get("Idempotent-Replayed"), replay.Body.String())
	}
	if !bytes.Equal(replay.Body.Bytes(), w.Body.Bytes()) {
		t.Errorf("replayed body differs:\n%s\nfirst:\n%s", replay.Body.String(), w.Body.String())
	}

	// The same key for a different request is refused.
	w = reclaim(`{"unitIds":["u3"]}`, "k-1")
	problem(t, w, http.StatusUnprocessableEntity, capacity.CodeIdempotencyKeyReused)

	// Units outside the reservation name themselves in the problem.
	w = reclaim(`{"unitIds":["u3","u7"]}`, "")
	p := problem(t, w, http.StatusUnprocessableEntity, capacity.CodeUnitsNotReserved)
	if !slices.Equal(p.UnitIDs, []string{"u7"}) {
		t.Errorf("unitIds = %v, want [u7]", p.UnitIDs)
	}

	// Validation errors reach a caller with the permission as 422.
	for _, b := range []string{`{"unitIds":[]}`, `{"unitIds":["u1","u1"]}`, `{"unitIds":["bad id"]}`} {
		problem(t, reclaim(b, ""), http.StatusUnprocessableEntity, capacity.CodeInvalidRequest)
	}
}

// ---------------------------------------------------------------------------------------
// Requests: nulls, permission before the body, reason, the audience's operation view.

// validBodies are a valid body of each route with a body, as JSON members.
var validBodies = []struct {
	path    string
	auth    string
	members map[string]string
}{
	{reclaimPath, secretOwner, map[string]string{"unitIds": `["u1"]`, "dryRun": `true`, "reason": `"r"`, "graceSeconds": `5`}},
	{releasePath, secretOwner, map[string]string{"unitIds": `["u1"]`, "dryRun": `true`, "reason": `"r"`}},
	{vmsPath, secretOperator, map[string]string{"vmId": `"v1"`, "orgId": `"o1"`, "tier": `"spot"`, "unitIds": `["u1"]`}},
}

func objectOf(members map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(members)) {
		parts = append(parts, strconv.Quote(k)+":"+members[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// A null is never a default: {"unitIds":["u3"],"dryRun":null} must not run a real reclaim.
// Every member of every body, set to null or holding one, is refused like a wrong type.
func TestNullIsRefusedInEveryField(t *testing.T) {
	for _, b := range validBodies {
		for field := range b.members {
			for _, null := range []string{`null`, `[null]`, `["u1",null]`} {
				if null != `null` && !strings.HasPrefix(b.members[field], "[") {
					continue
				}
				members := maps.Clone(b.members)
				members[field] = null
				body := objectOf(members)
				t.Run(b.path+" "+body, func(t *testing.T) {
					svc := &fakeService{}
					w := req{method: http.MethodPost, path: b.path, body: body, auth: ptr("Bearer " + b.auth)}.do(t, newHandler(svc))
					p := problem(t, w, http.StatusBadRequest, httpapi.CodeMalformedRequest)
					if !strings.Contains(p.Detail, field) {
						t.Errorf("detail %q does not name %q", p.Detail, field)
					}
					assertNoCalls(t, svc)
				})
			}
		}
	}
}

// A caller who may not make the call gets the one 404 of a missing reservation (or node),
// byte for byte, whatever its body, content type or size: the body is never looked at.
func TestPermissionIsCheckedBeforeTheBody(t *testing.T) {
	big := `{"unitIds":["u1"],"reason":"` + strings.Repeat("a", httpapi.MaxBodyBytes) + `"}`
	bodies := []struct {
		name, contentType, body string
	}{
		{"valid", "application/json", ""},
		{"malformed", "application/json", `{"unitIds":`},
		{"unknown field", "application/json", `{"unitIds":["u1"],"dryrun":true}`},
		{"null", "application/json", `{"unitIds":["u1"],"dryRun":null}`},
		{"empty", "application/json", ``},
		{"invalid units", "application/json", `{"unitIds":[]}`},
		{"text/plain", "text/plain", `hello`},
		{"no content type", "", `{"unitIds":["u1"]}`},
		{"too large", "application/json", big},
	}
	routes := []struct {
		name      string
		path      string
		reference req // a caller who may call, on something that does not exist
		callers   []string
	}{
		{"reclaim", reclaimPath,
			req{method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/reclaim", body: `{"unitIds":["u1"]}`},
			[]string{secretNoPerm, secretNoRights, secretPlacer + "-without-capacity"}},
		{"release", releasePath,
			req{method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/release", body: `{"unitIds":["u1"]}`},
			[]string{secretNoPerm, secretNoRights}},
		{"placement", vmsPath,
			req{method: http.MethodPost, path: "/v1/nodes/n9/vms", auth: ptr("Bearer " + secretOperator), body: `{"vmId":"v1","orgId":"o1","tier":"spot","unitIds":["u1"]}`},
			[]string{secretOwner, secretPlacer, secretOpNoVM, secretNoRights}},
	}
	for _, rt := range routes {
		t.Run(rt.name, func(t *testing.T) {
			h, store := newRealHandler(t)
			want := rt.reference.do(t, h)
			problem(t, want, http.StatusNotFound, capacity.CodeNotFound)
			for _, caller := range rt.callers {
				if strings.HasSuffix(caller, "-without-capacity") {
					continue // only listed to document that vm.place grants no capacity call
				}
				for _, b := range bodies {
					body := b.body
					if b.name == "valid" {
						body = rt.reference.body
					}
					w := req{method: http.MethodPost, path: rt.path, body: body, contentType: &b.contentType, auth: ptr("Bearer " + caller)}.do(t, h)
					if w.Code != http.StatusNotFound || !bytes.Equal(w.Body.Bytes(), want.Body.Bytes()) {
						t.Errorf("%s, %s body: %d %s\nwant the 404 %s", caller, b.name, w.Code, w.Body.String(), want.Body.String())
					}
					got, ref := w.Header().Clone(), want.Header().Clone()
					got.Del("X-Request-Id")
					ref.Del("X-Request-Id")
					if !reflect.DeepEqual(got, ref) {
						t.Errorf("%s, %s body: headers %v, want %v", caller, b.name, got, ref)
					}
				}
			}
			if len(store.audits) != 0 {
				t.Errorf("refusals were audited: %+v", store.audits)
			}
		})
	}
}

// The answer of a reclaim or release echoes the call's reason (a field of the published
// response), the replay included; without one it is absent.
func TestCapacityAnswersEchoTheReason(t *testing.T) {
	h, _ := newRealHandler(t)
	tests := []struct {
		name, path, body, key, want string
	}{
		{"reclaim", reclaimPath, `{"unitIds":["u2"],"reason":"training run"}`, "k-r", `"training run"`},
		{"reclaim replayed", reclaimPath, `{"unitIds":["u2"],"reason":"training run"}`, "k-r", `"training run"`},
		{"reclaim dry run", reclaimPath, `{"unitIds":["u3"],"dryRun":true,"reason":"what if"}`, "", `"what if"`},
		{"release", releasePath, `{"unitIds":["u1"],"reason":"idle over the weekend"}`, "", `"idle over the weekend"`},
		{"reclaim without a reason", reclaimPath, `{"unitIds":["u3"]}`, "", ""},
	}
	for _, tt := range tests {
		q := req{method: http.MethodPost, path: tt.path, body: tt.body}
		if tt.key != "" {
			q.header = map[string]string{"Idempotency-Key": tt.key}
		}
		w := q.do(t, h)
		if w.Code != http.StatusOK {
			t.Fatalf("%s = %d: %s", tt.name, w.Code, w.Body.String())
		}
		if got := string(jsonObject(t, w)["reason"]); got != tt.want {
			t.Errorf("%s: reason = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestOperationViews(t *testing.T) {
	at := now
	full := &capacity.OperationView{Operation: capacity.Operation{
		ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpFailed,
		VMIDs: []string{"vm-b", "vm-a"}, UnitIDs: []string{"u1"},
		ExecutionARN: "arn:aws:states:eu-west-1:123456789012:execution:t:rcl_1",
		Outcomes: map[string]capacity.VMOutcome{
			"vm-a": {Outcome: capacity.OutcomeFailed, Error: "https://10.0.0.9:8443 refused", At: at},
		},
		CreatedAt: t0, UpdatedAt: at,
	}}
	redacted := &capacity.OperationView{
		Operation: capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpFailed,
			UnitIDs: []string{"u1"}, CreatedAt: t0, UpdatedAt: at},
		Redacted: true, Counts: capacity.OutcomeCounts{Pending: 1, Failed: 1},
	}
	path := reservationPath + "/reclaims/rcl_1"
	// The whole view, for who may move the reservation's capacity: every VM and its outcome.
	w := req{method: http.MethodGet, path: path}.do(t, newHandler(&fakeService{op: full}))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	m := jsonObject(t, w)
	for name, want := range map[string]string{
		"vms":          `[{"vmId":"vm-a","outcome":"failed","error":"https://10.0.0.9:8443 refused","at":"2026-11-02T00:00:00Z"},{"vmId":"vm-b","outcome":"pending"}]`,
		"executionArn": `"arn:aws:states:eu-west-1:123456789012:execution:t:rcl_1"`,
		"state":        `"failed"`,
	} {
		if got := string(m[name]); got != want {
			t.Errorf("whole view: %s = %s, want %s", name, got, want)
		}
	}
	assertAbsent(t, m, "vmCounts")

	// The audience's view, exactly: counts, no VM ids, errors or execution.
	w = req{method: http.MethodGet, path: path}.do(t, newHandler(&fakeService{op: redacted}))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	want := `{"id":"rcl_1","nodeId":"n1","reservationId":"r1","state":"failed","unitIds":["u1"],` +
		`"vmCounts":{"pending":1,"terminated":0,"alreadyGone":0,"failed":1},"createdAt":"2026-11-01T00:00:00Z","updatedAt":"2026-11-02T00:00:00Z"}`
	if got := strings.TrimSpace(w.Body.String()); got != want {
		t.Errorf("redacted view\n%s\nwant\n%s", got, want)
	}
}
