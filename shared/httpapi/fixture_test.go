package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
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

func (f failingKeys) LookupKeyConsistent(ctx context.Context, h string) (*capacity.APIKey, error) {
	return f.LookupKey(ctx, h)
}

// call is one call the fake service received.
type call struct {
	Method    string
	Principal capacity.Principal
	Capacity  capacity.CapacityRequest
	Placement capacity.PlacementRequest
	Plan      capacity.ReclaimPlanRequest
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
	plan      *capacity.ReclaimPlan
	res       *capacity.Reservation
	op        *capacity.OperationView
	scheduled *capacity.ScheduleResult
	opResults // the operator routes' canned results (operator_test.go)
	err       error
}

// answerAdmitted answers as a capacity call of the service does when the rate limiter runs
// beside its read (capacity.Admission): with the limiter's refusal, if it refused, before
// anything else.
func answerAdmitted[T any](ctx context.Context, v *T, err error) (*T, error) {
	if aerr := capacity.Admitted(ctx); aerr != nil {
		return nil, aerr
	}
	return orEmpty(v, err), err
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

func (f *fakeService) Reclaim(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error) {
	f.record(call{Method: "Reclaim", Principal: p, Capacity: req, Meta: meta})
	return answerAdmitted(ctx, f.capacity, f.err)
}

func (f *fakeService) PlanReclaim(_ context.Context, p capacity.Principal, req capacity.ReclaimPlanRequest, meta capacity.RequestMeta) (*capacity.ReclaimPlan, error) {
	f.record(call{Method: "PlanReclaim", Principal: p, Plan: req, Meta: meta})
	return orEmpty(f.plan, f.err), f.err
}

func (f *fakeService) Release(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error) {
	f.record(call{Method: "Release", Principal: p, Capacity: req, Meta: meta})
	return answerAdmitted(ctx, f.capacity, f.err)
}

func (f *fakeService) Place(ctx context.Context, p capacity.Principal, req capacity.PlacementRequest, meta capacity.RequestMeta) (*capacity.PlacementResult, error) {
	f.record(call{Method: "Place", Principal: p, Placement: req, Meta: meta})
	return answerAdmitted(ctx, f.placement, f.err)
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

func (f *fakeService) ScheduleReclaim(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, at time.Time, meta capacity.RequestMeta) (*capacity.ScheduleResult, error) {
	f.record(call{Method: "ScheduleReclaim", Principal: p, Capacity: req, Meta: meta, At: at})
	return answerAdmitted(ctx, f.scheduled, f.err)
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
		p.Type != httpapi.ProblemType(fixtureAPIBase, code) || p.Detail == "" {
		t.Errorf("problem = %+v, want status %d, code %q, title %q, type %q and a detail",
			p, status, code, http.StatusText(status), httpapi.ProblemType(fixtureAPIBase, code))
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

// opCall is what an operator route handed the service.
type opCall struct {
	NodeReq  capacity.NodeRequest
	ResReq   capacity.ReservationRequest
	Change   capacity.ReservationChange
	Topology capacity.TopologyRequest
	Rotation capacity.AgentKeyRotation
	KeyReq   capacity.KeyRequest
	KeyID    string
	Revoke   capacity.KeyRevocation
	Page     capacity.PageRequest
	ForceEnd capacity.ForceEndRequest
	Chain    capacity.NodeChain
}

// opResults are the operator routes' canned answers.
type opResults struct {
	nodeRes   *capacity.NodeResult
	node      *capacity.Node
	resRes    *capacity.ReservationResult
	topology  *capacity.TopologyResult
	rotation  *capacity.AgentKeyResult
	resPage   *capacity.ReservationPage
	keyRes    *capacity.KeyResult
	keyPage   *capacity.KeyPage
	key       *capacity.APIKey
	auditPage *capacity.AuditPage
	chainPage *capacity.AuditChainPage
	forceEnd  *capacity.ForceEndResult
}

func (f *fakeService) PutNode(_ context.Context, p capacity.Principal, req capacity.NodeRequest, meta capacity.RequestMeta) (*capacity.NodeResult, error) {
	f.record(call{Method: "PutNode", Principal: p, NodeID: req.NodeID, Meta: meta, opCall: opCall{NodeReq: req}})
	return orEmpty(f.nodeRes, f.err), f.err
}

func (f *fakeService) GetNode(_ context.Context, p capacity.Principal, nodeID string) (*capacity.Node, error) {
	f.record(call{Method: "GetNode", Principal: p, NodeID: nodeID})
	return orEmpty(f.node, f.err), f.err
}

func (f *fakeService) CreateReservation(_ context.Context, p capacity.Principal, req capacity.ReservationRequest, meta capacity.RequestMeta) (*capacity.ReservationResult, error) {
	f.record(call{Method: "CreateReservation", Principal: p, NodeID: req.NodeID, Meta: meta, opCall: opCall{ResReq: req}})
	return orEmpty(f.resRes, f.err), f.err
}

func (f *fakeService) CancelReservation(_ context.Context, p capacity.Principal, req capacity.ReservationChange, meta capacity.RequestMeta) (*capacity.ReservationResult, error) {
	f.record(call{Method: "CancelReservation", Principal: p, NodeID: req.NodeID, ResID: req.ReservationID, Meta: meta, opCall: opCall{Change: req}})
	return orEmpty(f.resRes, f.err), f.err
}

func (f *fakeService) ReaffirmReservation(_ context.Context, p capacity.Principal, req capacity.ReservationChange, meta capacity.RequestMeta) (*capacity.ReservationResult, error) {
	f.record(call{Method: "ReaffirmReservation", Principal: p, NodeID: req.NodeID, ResID: req.ReservationID, Meta: meta, opCall: opCall{Change: req}})
	return orEmpty(f.resRes, f.err), f.err
}

func (f *fakeService) ForceEnd(_ context.Context, p capacity.Principal, req capacity.ForceEndRequest, meta capacity.RequestMeta) (*capacity.ForceEndResult, error) {
	f.record(call{Method: "ForceEnd", Principal: p, NodeID: req.NodeID, ResID: req.ReservationID, Meta: meta, opCall: opCall{ForceEnd: req}})
	return orEmpty(f.forceEnd, f.err), f.err
}

func (f *fakeService) SetTopology(_ context.Context, p capacity.Principal, req capacity.TopologyRequest, meta capacity.RequestMeta) (*capacity.TopologyResult, error) {
	f.record(call{Method: "SetTopology", Principal: p, NodeID: req.NodeID, Meta: meta, opCall: opCall{Topology: req}})
	return orEmpty(f.topology, f.err), f.err
}

func (f *fakeService) RotateAgentKey(_ context.Context, p capacity.Principal, req capacity.AgentKeyRotation, meta capacity.RequestMeta) (*capacity.AgentKeyResult, error) {
	f.record(call{Method: "RotateAgentKey", Principal: p, NodeID: req.NodeID, Meta: meta, opCall: opCall{Rotation: req}})
	return orEmpty(f.rotation, f.err), f.err
}

func (f *fakeService) EndAgentKeyOverlap(_ context.Context, p capacity.Principal, req capacity.AgentKeyRotation, meta capacity.RequestMeta) (*capacity.AgentKeyResult, error) {
	f.record(call{Method: "EndAgentKeyOverlap", Principal: p, NodeID: req.NodeID, Meta: meta, opCall: opCall{Rotation: req}})
	return orEmpty(f.rotation, f.err), f.err
}

func (f *fakeService) ListReservations(_ context.Context, p capacity.Principal, nodeID string, page capacity.PageRequest) (*capacity.ReservationPage, error) {
	f.record(call{Method: "ListReservations", Principal: p, NodeID: nodeID, opCall: opCall{Page: page}})
	return orEmpty(f.resPage, f.err), f.err
}

func (f *fakeService) CreateKey(_ context.Context, p capacity.Principal, req capacity.KeyRequest, meta capacity.RequestMeta) (*capacity.KeyResult, error) {
	f.record(call{Method: "CreateKey", Principal: p, Meta: meta, opCall: opCall{KeyReq: req}})
	return orEmpty(f.keyRes, f.err), f.err
}

func (f *fakeService) ListKeys(_ context.Context, p capacity.Principal, page capacity.PageRequest) (*capacity.KeyPage, error) {
	f.record(call{Method: "ListKeys", Principal: p, opCall: opCall{Page: page}})
	return orEmpty(f.keyPage, f.err), f.err
}

func (f *fakeService) GetKey(_ context.Context, p capacity.Principal, keyID string) (*capacity.APIKey, error) {
	f.record(call{Method: "GetKey", Principal: p, opCall: opCall{KeyID: keyID}})
	return orEmpty(f.key, f.err), f.err
}

func (f *fakeService) RevokeKey(_ context.Context, p capacity.Principal, req capacity.KeyRevocation, meta capacity.RequestMeta) (*capacity.APIKey, error) {
	f.record(call{Method: "RevokeKey", Principal: p, Meta: meta, opCall: opCall{KeyID: req.KeyID, Revoke: req}})
	return orEmpty(f.key, f.err), f.err
}

func (f *fakeService) ListReservationAudit(_ context.Context, p capacity.Principal, nodeID, reservationID string, chain capacity.NodeChain, page capacity.PageRequest) (*capacity.AuditPage, error) {
	f.record(call{Method: "ListReservationAudit", Principal: p, NodeID: nodeID, ResID: reservationID, opCall: opCall{Page: page, Chain: chain}})
	return orEmpty(f.auditPage, f.err), f.err
}

func (f *fakeService) ListNodeAudit(_ context.Context, p capacity.Principal, nodeID string, chain capacity.NodeChain, page capacity.PageRequest) (*capacity.AuditChainPage, error) {
	f.record(call{Method: "ListNodeAudit", Principal: p, NodeID: nodeID, opCall: opCall{Page: page, Chain: chain}})
	return orEmpty(f.chainPage, f.err), f.err
}

func (f *fakeService) SelfKey(ctx context.Context, p capacity.Principal) (*capacity.CallerKey, error) {
	f.record(call{Method: "SelfKey", Principal: p})
	if f.err != nil {
		return nil, f.err
	}
	return (&capacity.Service{}).SelfKey(ctx, p)
}

func (f *fakeService) ListKeyAudit(_ context.Context, p capacity.Principal, page capacity.PageRequest) (*capacity.AuditChainPage, error) {
	f.record(call{Method: "ListKeyAudit", Principal: p, opCall: opCall{Page: page}})
	return orEmpty(f.chainPage, f.err), f.err
}

var (
	testSecret = "ocap_" + strings.Repeat("A", 49)
	opAuth     = ptr("Bearer " + secretPlatform)
	testNode   = capacity.Node{ID: "n1", OwnerOrgID: "owner", UnitIDs: []string{"u0", "u1"}, AgentEndpoint: "https://agent.example",
		TopologyGen: 3, Version: 9, AuditHead: capacity.AuditHead{Seq: 5, Hash: "abc"}}
	testKey = capacity.APIKey{KeyID: "key-1", OrgID: "org1", Permissions: []string{capacity.PermRead}, Description: "ci",
		CreatedAt: t0, CreatedByKeyID: "key-op", ExpiresAt: ptr(now.Add(time.Hour))}
	testVM     = capacity.VM{ID: "vm-1", NodeID: "n1", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u1"}, State: capacity.VMRunning, CreatedAt: t0}
	testRecord = capacity.AuditRecord{ID: "aud-1", Seq: 1, Hash: "h1", Time: t0.Add(123 * time.Nanosecond), Action: capacity.ActionReclaim,
		NodeID: "n1", ReservationID: "r1", Outcome: "ok", Via: capacity.ViaHTTP}
)

func (f *fakeService) ListNodes(_ context.Context, p capacity.Principal, page capacity.PageRequest) (*capacity.NodePage, error) {
	f.record(call{Method: "ListNodes", Principal: p, opCall: opCall{Page: page}})
	return orEmpty[capacity.NodePage](nil, f.err), f.err
}

func (f *fakeService) GetNodeUnits(_ context.Context, p capacity.Principal, nodeID string) (*capacity.NodeUnits, error) {
	f.record(call{Method: "GetNodeUnits", Principal: p, NodeID: nodeID})
	return orEmpty[capacity.NodeUnits](nil, f.err), f.err
}

func (f *fakeService) ListReclaimOperations(_ context.Context, p capacity.Principal, nodeID, reservationID, state string, page capacity.PageRequest) (*capacity.OperationPage, error) {
	f.record(call{Method: "ListReclaimOperations", Principal: p, NodeID: nodeID, ResID: reservationID, ID: state, opCall: opCall{Page: page}})
	return orEmpty[capacity.OperationPage](nil, f.err), f.err
}

// fixtureAPIBase is the API's address as the fixture's requests (httptest.NewRequest) call it.
const fixtureAPIBase = "http://example.com"
