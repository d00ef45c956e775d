package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/wire"
)

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

func (f *fakeService) ListReservationAudit(_ context.Context, p capacity.Principal, nodeID, reservationID string, page capacity.PageRequest) (*capacity.AuditPage, error) {
	f.record(call{Method: "ListReservationAudit", Principal: p, NodeID: nodeID, ResID: reservationID, opCall: opCall{Page: page}})
	return orEmpty(f.auditPage, f.err), f.err
}

func (f *fakeService) ListNodeAudit(_ context.Context, p capacity.Principal, nodeID string, chain capacity.NodeChain, page capacity.PageRequest) (*capacity.AuditChainPage, error) {
	f.record(call{Method: "ListNodeAudit", Principal: p, NodeID: nodeID, opCall: opCall{Page: page, Chain: chain}})
	return orEmpty(f.chainPage, f.err), f.err
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

// decodeStrict decodes an answer into v, refusing members v does not know.
func decodeStrict(t *testing.T, body []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
}

// TestOperatorRoutes: every new route reaches its service method with the request built
// from path, body, query and headers, and answers the documented status, headers and body.
func TestOperatorRoutes(t *testing.T) {
	agentKey := []byte("0123456789abcdef0123456789abcdef")
	endsAt := now.Add(48 * time.Hour)
	tests := []struct {
		name         string
		q            req
		canned       opResults
		wantMethod   string
		wantStatus   int
		wantLocation string
		check        func(t *testing.T, c call, body []byte)
	}{
		{
			name: "put node registers: 201, Location, agentKey once",
			q: req{method: http.MethodPut, path: "/v1/nodes/n1", auth: opAuth, header: map[string]string{"Idempotency-Key": "k1"},
				body: `{"ownerOrgId":"owner","unitIds":["u0","u1"],"agentEndpoint":"https://agent.example","reason":"rack 4"}`},
			canned:     opResults{nodeRes: &capacity.NodeResult{Node: testNode, Created: true, AgentKey: agentKey}},
			wantMethod: "PutNode", wantStatus: 201, wantLocation: "/v1/nodes/n1",
			check: func(t *testing.T, c call, body []byte) {
				want := capacity.NodeRequest{NodeID: "n1", OwnerOrgID: "owner", AgentEndpoint: "https://agent.example", Reason: "rack 4",
					UnitIDs: []string{"u0", "u1"}, IdempotencyKey: "k1"}
				if !reflect.DeepEqual(c.NodeReq, want) {
					t.Errorf("request %+v, want %+v", c.NodeReq, want)
				}
				var a wire.NodeAnswerJSON
				decodeStrict(t, body, &a)
				if a.AgentKey != base64.StdEncoding.EncodeToString(agentKey) || !a.Created || a.SecretShown || !reflect.DeepEqual(a.Node, wire.Node(testNode)) {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name:       "put node replay of the registration: no agentKey, secretShown",
			q:          req{method: http.MethodPut, path: "/v1/nodes/n1", auth: opAuth, body: `{"ownerOrgId":"owner","unitIds":["u0"],"agentEndpoint":"https://a"}`},
			canned:     opResults{nodeRes: &capacity.NodeResult{Node: testNode, Created: true, SecretShown: true, Replayed: true}},
			wantMethod: "PutNode", wantStatus: 201, wantLocation: "/v1/nodes/n1",
			check: func(t *testing.T, _ call, body []byte) {
				if strings.Contains(string(body), `"agentKey"`) || !strings.Contains(string(body), `"secretShown":true`) {
					t.Errorf("answer %s, want secretShown and no agentKey", body)
				}
			},
		},
		{
			name: "rotate agent key: 200, the new key once",
			q: req{method: http.MethodPost, path: "/v1/nodes/n1/agent-key/rotate", auth: opAuth, header: map[string]string{"Idempotency-Key": "k9"},
				body: `{"reason":"key leaked"}`},
			canned:     opResults{rotation: &capacity.AgentKeyResult{NodeID: "n1", Gen: 4, AgentKey: agentKey, PreviousValidUntil: t0.Add(capacity.AgentKeyOverlap)}},
			wantMethod: "RotateAgentKey", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if want := (capacity.AgentKeyRotation{NodeID: "n1", Reason: "key leaked", IdempotencyKey: "k9"}); c.Rotation != want {
					t.Errorf("request %+v, want %+v", c.Rotation, want)
				}
				var a wire.AgentKeyAnswerJSON
				decodeStrict(t, body, &a)
				if a.AgentKey != base64.StdEncoding.EncodeToString(agentKey) || a.AgentKeyGen != 4 || a.SecretShown ||
					a.PreviousValidUntil != t0.Add(capacity.AgentKeyOverlap).UTC().Format(time.RFC3339) {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name:       "rotate agent key without a body, replayed: no key, secretShown",
			q:          req{method: http.MethodPost, path: "/v1/nodes/n1/agent-key/rotate", auth: opAuth},
			canned:     opResults{rotation: &capacity.AgentKeyResult{NodeID: "n1", Gen: 4, SecretShown: true, Replayed: true, PreviousValidUntil: t0}},
			wantMethod: "RotateAgentKey", wantStatus: 200,
			check: func(t *testing.T, _ call, body []byte) {
				if strings.Contains(string(body), `"agentKey"`) || !strings.Contains(string(body), `"secretShown":true`) {
					t.Errorf("answer %s, want secretShown and no agentKey", body)
				}
			},
		},
		{
			name:       "put node updates: 200, no Location, no agentKey",
			q:          req{method: http.MethodPut, path: "/v1/nodes/n1", auth: opAuth, body: `{"ownerOrgId":"owner2","unitIds":["u0"],"agentEndpoint":"https://a"}`},
			canned:     opResults{nodeRes: &capacity.NodeResult{Node: testNode}},
			wantMethod: "PutNode", wantStatus: 200,
			check: func(t *testing.T, _ call, body []byte) {
				if strings.Contains(string(body), `"agentKey"`) || strings.Contains(string(body), "secretShown") {
					t.Errorf("answer %s carries a secret member", body)
				}
			},
		},
		{
			name: "force-end: path ids, reason and Idempotency-Key to the service; the operation with the VM's reason",
			q: req{method: http.MethodPost, path: reservationPath + "/reclaims/rcl-1/vms/vm-1/force-end", auth: opAuth,
				header: map[string]string{"Idempotency-Key": "fe-1"}, body: `{"reason":"node wiped, OPS-7"}`},
			canned: opResults{forceEnd: &capacity.ForceEndResult{Outcome: capacity.OutcomeForceEnded, Ended: true, Operation: capacity.Operation{
				ID: "rcl-1", NodeID: "n1", ReservationID: "r1", State: capacity.OpCompleted, VMIDs: []string{"vm-1"}, UnitIDs: []string{"u1"},
				Outcomes:  map[string]capacity.VMOutcome{"vm-1": {Outcome: capacity.OutcomeForceEnded, Reason: "node wiped, OPS-7", At: t0, Attempt: 1}},
				CreatedAt: t0, UpdatedAt: t0}}},
			wantMethod: "ForceEnd", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				want := capacity.ForceEndRequest{NodeID: "n1", ReservationID: "r1", ReclaimID: "rcl-1", VMID: "vm-1", Reason: "node wiped, OPS-7", IdempotencyKey: "fe-1"}
				if c.ForceEnd != want {
					t.Errorf("request %+v, want %+v", c.ForceEnd, want)
				}
				var a wire.OperationJSON
				decodeStrict(t, body, &a)
				if a.State != "completed" || len(a.VMs) != 1 || a.VMs[0].Outcome != "force-ended" || a.VMs[0].Reason != "node wiped, OPS-7" {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name:       "get node (the service decides who may)",
			q:          req{method: http.MethodGet, path: "/v1/nodes/n1"},
			canned:     opResults{node: &testNode},
			wantMethod: "GetNode", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.NodeGetJSON
				decodeStrict(t, body, &a)
				if c.NodeID != "n1" || c.Principal.KeyID != "key-owner" || !reflect.DeepEqual(a.Node, wire.Node(testNode)) {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
		},
		{
			name: "set topology",
			q: req{method: http.MethodPut, path: "/v1/nodes/n1/topology", auth: opAuth, header: map[string]string{"Idempotency-Key": "k2"},
				body: `{"unitIds":["u0","u2"],"reason":"gpu-1 failed","expectedTopologyGen":3}`},
			canned: opResults{topology: &capacity.TopologyResult{Node: testNode, Changed: true, AddedUnitIDs: []string{"u2"},
				RemovedUnitIDs: []string{"u1"}, NeedsReview: []string{"r1"}, VMsOnRemovedUnits: []capacity.VM{testVM}}},
			wantMethod: "SetTopology", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				want := capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u2"}, Reason: "gpu-1 failed", IdempotencyKey: "k2",
					ExpectedTopologyGen: ptr(int64(3))}
				if !reflect.DeepEqual(c.Topology, want) {
					t.Errorf("request %+v, want %+v", c.Topology, want)
				}
				var a wire.TopologyJSON
				decodeStrict(t, body, &a)
				if !a.Changed || len(a.VMsOnRemovedUnits) != 1 || a.NeedsReview[0] != "r1" || a.AddedUnitIDs[0] != "u2" || a.RemovedUnitIDs[0] != "u1" {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name:       "set topology unchanged: lists are [], not null",
			q:          req{method: http.MethodPut, path: "/v1/nodes/n1/topology", auth: opAuth, body: `{"unitIds":["u0"]}`},
			canned:     opResults{topology: &capacity.TopologyResult{Node: testNode}},
			wantMethod: "SetTopology", wantStatus: 200,
			check: func(t *testing.T, _ call, body []byte) {
				for _, m := range []string{`"addedUnitIds":[]`, `"removedUnitIds":[]`, `"needsReview":[]`, `"vmsOnRemovedUnits":[]`, `"changed":false`} {
					if !strings.Contains(string(body), m) {
						t.Errorf("answer %s lacks %s", body, m)
					}
				}
			},
		},
		{
			name: "create reservation: 201 and Location",
			q: req{method: http.MethodPost, path: "/v1/nodes/n1/reservations", auth: opAuth, header: map[string]string{"Idempotency-Key": "k3"},
				body: `{"id":"r9","status":"pending","startsAt":"2026-11-01T00:00:00Z","endsAt":"` + endsAt.Format(time.RFC3339) + `",` +
					`"allowedOrgIds":["aud"],"managingOrgIds":["mgr"],"reservedUnitIds":["u0"],"contractRef":"c-1","reason":"deal"}`},
			canned:     opResults{resRes: &capacity.ReservationResult{Reservation: capacity.Reservation{ID: "r9", NodeID: "n1", StartsAt: t0, Status: capacity.StatusPending}}},
			wantMethod: "CreateReservation", wantStatus: 201, wantLocation: "/v1/nodes/n1/reservations/r9",
			check: func(t *testing.T, c call, body []byte) {
				want := capacity.ReservationRequest{NodeID: "n1", ID: "r9", Status: capacity.StatusPending, StartsAt: t0, EndsAt: &endsAt,
					AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: []string{"mgr"}, ReservedUnitIDs: []string{"u0"}, ContractRef: "c-1",
					Reason: "deal", IdempotencyKey: "k3"}
				got := c.ResReq
				if got.EndsAt == nil || !got.EndsAt.Equal(endsAt) || !got.StartsAt.Equal(t0) {
					t.Fatalf("times %+v", got)
				}
				got.EndsAt, want.EndsAt, got.StartsAt, want.StartsAt = nil, nil, time.Time{}, time.Time{}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("request %+v, want %+v", got, want)
				}
				var a wire.ReservationAnswerJSON
				decodeStrict(t, body, &a)
				if a.Reservation.ID != "r9" || a.VMsOnUnits != nil {
					t.Errorf("answer %s, want the reservation and no vmsOnUnits", body)
				}
			},
		},
		{
			name:       "create reservation, optional members left out",
			q:          req{method: http.MethodPost, path: "/v1/nodes/n1/reservations", auth: opAuth, body: `{"startsAt":"2026-11-01T00:00:00+01:00","allowedOrgIds":[],"managingOrgIds":[],"reservedUnitIds":["u0"]}`},
			canned:     opResults{resRes: &capacity.ReservationResult{Reservation: capacity.Reservation{ID: "res-x", NodeID: "n1"}}},
			wantMethod: "CreateReservation", wantStatus: 201, wantLocation: "/v1/nodes/n1/reservations/res-x",
			check: func(t *testing.T, c call, _ []byte) {
				if c.ResReq.EndsAt != nil || c.ResReq.ID != "" || c.ResReq.Status != "" || !c.ResReq.StartsAt.Equal(t0.Add(-time.Hour)) {
					t.Errorf("request %+v", c.ResReq)
				}
			},
		},
		{
			name: "cancel: vmsOnUnits listed",
			q: req{method: http.MethodPost, path: reservationPath + "/cancel", auth: opAuth, header: map[string]string{"Idempotency-Key": "k4"},
				body: `{"reason":"contract ended"}`},
			canned:     opResults{resRes: &capacity.ReservationResult{Reservation: reservation(nil, nil), VMsOnUnits: []capacity.VM{testVM}}},
			wantMethod: "CancelReservation", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				want := capacity.ReservationChange{NodeID: "n1", ReservationID: "r1", Reason: "contract ended", IdempotencyKey: "k4"}
				if c.Change != want {
					t.Errorf("request %+v, want %+v", c.Change, want)
				}
				var a wire.ReservationAnswerJSON
				decodeStrict(t, body, &a)
				if a.VMsOnUnits == nil || len(*a.VMsOnUnits) != 1 || (*a.VMsOnUnits)[0].ID != "vm-1" {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name:       "cancel without a body nor content type; no VMs: []",
			q:          req{method: http.MethodPost, path: reservationPath + "/cancel", auth: opAuth, contentType: ptr("")},
			canned:     opResults{resRes: &capacity.ReservationResult{Reservation: reservation(nil, nil)}},
			wantMethod: "CancelReservation", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if c.Change.Reason != "" || !strings.Contains(string(body), `"vmsOnUnits":[]`) {
					t.Errorf("call %+v, answer %s", c.Change, body)
				}
			},
		},
		{
			name:       "reaffirm: no vmsOnUnits",
			q:          req{method: http.MethodPost, path: reservationPath + "/reaffirm", auth: opAuth, body: `{}`},
			canned:     opResults{resRes: &capacity.ReservationResult{Reservation: reservation(nil, nil), VMsOnUnits: []capacity.VM{testVM}}},
			wantMethod: "ReaffirmReservation", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if c.Change.ReservationID != "r1" || strings.Contains(string(body), "vmsOnUnits") {
					t.Errorf("call %+v, answer %s", c.Change, body)
				}
			},
		},
		{
			name:       "list reservations: limit and cursor passed on",
			q:          req{method: http.MethodGet, path: "/v1/nodes/n1/reservations?limit=100&cursor=abc_-="},
			canned:     opResults{resPage: &capacity.ReservationPage{Reservations: []capacity.Reservation{reservation(nil, nil)}, NextCursor: "next"}},
			wantMethod: "ListReservations", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if c.Page != (capacity.PageRequest{Limit: 100, Cursor: "abc_-="}) || c.NodeID != "n1" {
					t.Errorf("call %+v", c)
				}
				var a wire.ReservationPageJSON
				decodeStrict(t, body, &a)
				if len(a.Reservations) != 1 || a.NextCursor != "next" {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name:       "list reservations, last page: no nextCursor, [] when empty",
			q:          req{method: http.MethodGet, path: "/v1/nodes/n1/reservations"},
			canned:     opResults{resPage: &capacity.ReservationPage{}},
			wantMethod: "ListReservations", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if c.Page != (capacity.PageRequest{}) || strings.TrimSpace(string(body)) != `{"reservations":[]}` {
					t.Errorf("call %+v, answer %s", c.Page, body)
				}
			},
		},
		{
			name:       "reservation audit",
			q:          req{method: http.MethodGet, path: reservationPath + "/audit?limit=1"},
			canned:     opResults{auditPage: &capacity.AuditPage{Records: []capacity.AuditRecord{testRecord}, NextCursor: "c2"}},
			wantMethod: "ListReservationAudit", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.AuditPageJSON
				decodeStrict(t, body, &a)
				if c.ResID != "r1" || c.Page.Limit != 1 || len(a.Records) != 1 || a.NextCursor != "c2" {
					t.Fatalf("call %+v, answer %s", c, body)
				}
				if got, err := wire.AuditRecordFrom(a.Records[0]); err != nil || !reflect.DeepEqual(got, testRecord) {
					t.Errorf("record %+v (%v), want %+v", got, err, testRecord)
				}
			},
		},
		{
			name:       "node audit: head and records",
			q:          req{method: http.MethodGet, path: "/v1/nodes/n1/audit?cursor=x", auth: opAuth},
			canned:     opResults{chainPage: &capacity.AuditChainPage{Head: capacity.AuditHead{Seq: 1, Hash: "h1"}, Records: []capacity.AuditRecord{testRecord}}},
			wantMethod: "ListNodeAudit", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.AuditChainPageJSON
				decodeStrict(t, body, &a)
				if c.NodeID != "n1" || c.Page.Cursor != "x" || c.Chain != "" || a.Head != (wire.AuditHeadJSON{Seq: 1, Hash: "h1"}) || len(a.Records) != 1 {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
		},
		{
			name:       "node audit: the calls chain",
			q:          req{method: http.MethodGet, path: "/v1/nodes/n1/audit?chain=calls&limit=5", auth: opAuth},
			canned:     opResults{chainPage: &capacity.AuditChainPage{Head: capacity.AuditHead{Seq: 2, Hash: "h2"}}},
			wantMethod: "ListNodeAudit", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if c.NodeID != "n1" || c.Chain != capacity.ChainCalls || c.Page.Limit != 5 {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
		},
		{
			name:       "key audit",
			q:          req{method: http.MethodGet, path: "/v1/keys/audit", auth: opAuth},
			canned:     opResults{chainPage: &capacity.AuditChainPage{}},
			wantMethod: "ListKeyAudit", wantStatus: 200,
			check: func(t *testing.T, _ call, body []byte) {
				if strings.TrimSpace(string(body)) != `{"head":{"seq":0,"hash":""},"records":[]}` {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name: "create key: 201, Location, secret once",
			q: req{method: http.MethodPost, path: "/v1/keys", auth: opAuth, header: map[string]string{"Idempotency-Key": "k5"},
				body: `{"orgId":"org1","permissions":["reservation.read"],"operator":true,"expiresAt":"2026-12-01T00:00:00Z","description":"ci"}`},
			canned:     opResults{keyRes: &capacity.KeyResult{Key: testKey, Secret: testSecret}},
			wantMethod: "CreateKey", wantStatus: 201, wantLocation: "/v1/keys/key-1",
			check: func(t *testing.T, c call, body []byte) {
				exp := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
				want := capacity.KeyRequest{OrgID: "org1", Permissions: []string{capacity.PermRead}, Operator: true, ExpiresAt: &exp,
					Description: "ci", IdempotencyKey: "k5"}
				if !reflect.DeepEqual(c.KeyReq, want) {
					t.Errorf("request %+v, want %+v", c.KeyReq, want)
				}
				var a wire.KeyAnswerJSON
				decodeStrict(t, body, &a)
				if a.Secret != testSecret || a.SecretShown || a.Key.KeyID != "key-1" || a.Key.CreatedBy != "key-op" || a.Key.ExpiresAt == "" {
					t.Errorf("answer %s", body)
				}
			},
		},
		{
			name:       "create key replay: no secret, secretShown",
			q:          req{method: http.MethodPost, path: "/v1/keys", auth: opAuth, body: `{"orgId":"org1","permissions":[]}`},
			canned:     opResults{keyRes: &capacity.KeyResult{Key: testKey, SecretShown: true, Replayed: true}},
			wantMethod: "CreateKey", wantStatus: 201, wantLocation: "/v1/keys/key-1",
			check: func(t *testing.T, c call, body []byte) {
				if c.KeyReq.ExpiresAt != nil || strings.Contains(string(body), `"secret"`) || !strings.Contains(string(body), `"secretShown":true`) {
					t.Errorf("call %+v, answer %s", c.KeyReq, body)
				}
			},
		},
		{
			name:       "list keys",
			q:          req{method: http.MethodGet, path: "/v1/keys?limit=2", auth: opAuth},
			canned:     opResults{keyPage: &capacity.KeyPage{Keys: []capacity.APIKey{testKey}, NextCursor: "n"}},
			wantMethod: "ListKeys", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.KeyPageJSON
				decodeStrict(t, body, &a)
				if c.Page.Limit != 2 || len(a.Keys) != 1 || a.NextCursor != "n" || strings.Contains(string(body), "hash") {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
		},
		{
			name:       "get key (the Location of a created one)",
			q:          req{method: http.MethodGet, path: "/v1/keys/key-1", auth: opAuth},
			canned:     opResults{key: &testKey},
			wantMethod: "GetKey", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.KeyGetJSON
				decodeStrict(t, body, &a)
				if c.KeyID != "key-1" || a.Key.KeyID != testKey.KeyID || a.Key.OrgID != testKey.OrgID || strings.Contains(string(body), "hash") {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
		},
		{
			name:       "key audit is not a key id",
			q:          req{method: http.MethodGet, path: "/v1/keys/audit", auth: opAuth},
			canned:     opResults{chainPage: &capacity.AuditChainPage{}},
			wantMethod: "ListKeyAudit", wantStatus: 200,
			check: func(*testing.T, call, []byte) {},
		},
		{
			name:       "revoke key, empty body",
			q:          req{method: http.MethodPost, path: "/v1/keys/key-1/revoke", auth: opAuth, contentType: ptr("")},
			canned:     opResults{key: &capacity.APIKey{KeyID: "key-1", Revoked: true, RevokedAt: &now}},
			wantMethod: "RevokeKey", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.KeyGetJSON
				decodeStrict(t, body, &a)
				if c.KeyID != "key-1" || c.Revoke.Reason != "" || !a.Key.Revoked || a.Key.RevokedAt == "" {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
		},
		{
			name:       "revoke key with a reason",
			q:          req{method: http.MethodPost, path: "/v1/keys/key-1/revoke", auth: opAuth, body: `{"reason":"leaked"}`},
			canned:     opResults{key: &capacity.APIKey{KeyID: "key-1", Revoked: true, RevokedAt: &now}},
			wantMethod: "RevokeKey", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if c.Revoke != (capacity.KeyRevocation{KeyID: "key-1", Reason: "leaked"}) {
					t.Errorf("call %+v, want the body's reason passed on", c)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{opResults: tc.canned}
			w := tc.q.do(t, newHandler(svc))
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.wantStatus, w.Body.String())
			}
			if got := w.Header().Get("Location"); got != tc.wantLocation {
				t.Errorf("Location %q, want %q", got, tc.wantLocation)
			}
			if got := w.Header().Get("Cache-Control"); got != "no-store" {
				t.Errorf("Cache-Control %q, want no-store (secrets and private data)", got)
			}
			calls := svc.Calls()
			if len(calls) != 1 || calls[0].Method != tc.wantMethod {
				t.Fatalf("calls %+v, want one %s", calls, tc.wantMethod)
			}
			if calls[0].Meta.RequestID == "" && tc.q.method != http.MethodGet {
				t.Error("no request id passed on")
			}
			tc.check(t, calls[0], w.Body.Bytes())
			checkDocument(t, tc.q, w)
		})
	}
}

var document struct {
	once sync.Once
	v    validator.Validator
	err  error
}

// checkDocument validates a request and its answer against the OpenAPI document, as the end
// to end suite does: the document must describe what the handlers answer.
func checkDocument(t *testing.T, q req, w *httptest.ResponseRecorder) {
	t.Helper()
	document.once.Do(func() {
		doc, err := libopenapi.NewDocument(httpapi.OpenAPI)
		if err != nil {
			document.err = err
			return
		}
		v, errs := validator.NewValidator(doc)
		if len(errs) > 0 {
			document.err = errors.Join(errs...)
		}
		document.v = v
	})
	if document.err != nil {
		t.Fatalf("openapi.json: %v", document.err)
	}
	newReq := func() *http.Request {
		r := httptest.NewRequest(q.method, "http://api"+q.path, strings.NewReader(q.body))
		r.Header.Set("Authorization", "Bearer x")
		if q.contentType == nil || *q.contentType != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		for k, v := range q.header {
			r.Header.Set(k, v)
		}
		return r
	}
	if ok, errs := document.v.ValidateHttpRequest(newReq()); !ok {
		t.Errorf("the document refuses the request: %v", errs)
	}
	resp := w.Result()
	resp.Request = newReq()
	if ok, errs := document.v.ValidateHttpResponse(newReq(), resp); !ok {
		for _, e := range errs {
			t.Errorf("the answer does not match the document: %v", e)
		}
	}
}

// TestOperatorRoutesReplayIsMarked: a replayed answer says so.
func TestOperatorRoutesReplayIsMarked(t *testing.T) {
	for _, tc := range []struct {
		q      req
		canned opResults
	}{
		{req{method: http.MethodPut, path: "/v1/nodes/n1", auth: opAuth, body: `{"ownerOrgId":"o","unitIds":["u"],"agentEndpoint":"https://a"}`},
			opResults{nodeRes: &capacity.NodeResult{Replayed: true}}},
		{req{method: http.MethodPut, path: "/v1/nodes/n1/topology", auth: opAuth, body: `{"unitIds":["u"]}`},
			opResults{topology: &capacity.TopologyResult{Replayed: true}}},
		{req{method: http.MethodPost, path: "/v1/nodes/n1/reservations", auth: opAuth, body: `{"startsAt":"2026-11-01T00:00:00Z","reservedUnitIds":["u"]}`},
			opResults{resRes: &capacity.ReservationResult{Replayed: true}}},
		{req{method: http.MethodPost, path: reservationPath + "/cancel", auth: opAuth},
			opResults{resRes: &capacity.ReservationResult{Replayed: true}}},
		{req{method: http.MethodPost, path: reservationPath + "/reaffirm", auth: opAuth},
			opResults{resRes: &capacity.ReservationResult{Replayed: true}}},
		{req{method: http.MethodPost, path: "/v1/keys", auth: opAuth, body: `{"orgId":"o","permissions":[]}`},
			opResults{keyRes: &capacity.KeyResult{Replayed: true}}},
		{req{method: http.MethodPost, path: reservationPath + "/reclaims/rcl-1/vms/vm-1/force-end", auth: opAuth, body: `{"reason":"wiped"}`},
			opResults{forceEnd: &capacity.ForceEndResult{Replayed: true}}},
	} {
		t.Run(tc.q.method+" "+tc.q.path, func(t *testing.T) {
			w := tc.q.do(t, newHandler(&fakeService{opResults: tc.canned}))
			if w.Code >= 300 || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("status %d, Idempotent-Replayed %q: %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
			}
		})
	}
}

// operatorBodyRoutes are the operator-only routes that read a body, each with a valid body.
var operatorBodyRoutes = []struct {
	method, path string
	members      map[string]string
}{
	{http.MethodPut, "/v1/nodes/n1", map[string]string{"ownerOrgId": `"o"`, "unitIds": `["u1"]`, "agentEndpoint": `"https://a"`, "reason": `"r"`}},
	{http.MethodPut, "/v1/nodes/n1/topology", map[string]string{"unitIds": `["u1"]`, "reason": `"r"`, "expectedTopologyGen": `2`}},
	{http.MethodPost, "/v1/nodes/n1/reservations", map[string]string{"id": `"r9"`, "status": `"active"`, "startsAt": `"2026-11-01T00:00:00Z"`,
		"endsAt": `"2027-11-01T00:00:00Z"`, "allowedOrgIds": `["a"]`, "managingOrgIds": `["m"]`, "reservedUnitIds": `["u1"]`, "contractRef": `"c"`, "reason": `"r"`}},
	{http.MethodPost, reservationPath + "/cancel", map[string]string{"reason": `"r"`}},
	{http.MethodPost, reservationPath + "/reaffirm", map[string]string{"reason": `"r"`}},
	{http.MethodPost, "/v1/keys", map[string]string{"orgId": `"o"`, "permissions": `["reservation.read"]`, "operator": `false`,
		"expiresAt": `"2027-01-01T00:00:00Z"`, "description": `"d"`}},
	{http.MethodPost, "/v1/keys/key-1/revoke", map[string]string{"reason": `"r"`}},
	{http.MethodPost, reservationPath + "/reclaims/rcl-1/vms/vm-1/force-end", map[string]string{"reason": `"node wiped, ticket OPS-1"`}},
	{http.MethodPost, "/v1/nodes/n1/agent-key/rotate", map[string]string{"reason": `"r"`}},
}

// TestOperatorRoutesAre404ForOthers: a caller without the operator flag gets one 404, before
// the body is read (the same answer for a valid body, garbage, or no JSON at all), and the
// service is never called. So does an operator naming an id that cannot exist.
func TestOperatorRoutesAre404ForOthers(t *testing.T) {
	for _, rt := range operatorBodyRoutes {
		for _, who := range []string{secretOwner, secretStranger, secretAudience, secretNoRights} {
			var first string
			for _, body := range []struct{ body, ct string }{
				{objectOf(rt.members), "application/json"}, {`{"bogus":1}`, "application/json"}, {`not json`, "text/plain"},
			} {
				t.Run(fmt.Sprintf("%s %s as %s: %s", rt.method, rt.path, who, body.body), func(t *testing.T) {
					svc := &fakeService{}
					w := req{method: rt.method, path: rt.path, body: body.body, auth: ptr("Bearer " + who), contentType: ptr(body.ct)}.do(t, newHandler(svc))
					problem(t, w, http.StatusNotFound, capacity.CodeNotFound)
					assertNoCalls(t, svc)
					if first == "" {
						first = w.Body.String()
					} else if w.Body.String() != first {
						t.Errorf("body %s differs from %s", w.Body.String(), first)
					}
				})
			}
		}
	}
	for _, path := range []struct{ method, path string }{
		{http.MethodPut, "/v1/nodes/..."}, {http.MethodPut, "/v1/nodes/-x/topology"}, {http.MethodPost, "/v1/nodes/-x/agent-key/rotate"}, {http.MethodPost, "/v1/nodes/n1/reservations/_r/cancel"},
		{http.MethodPost, "/v1/keys/" + strings.Repeat("k", 129) + "/revoke"},
	} {
		t.Run("operator, bad id "+path.path, func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: path.method, path: path.path, body: `{}`, auth: opAuth}.do(t, newHandler(svc))
			problem(t, w, http.StatusNotFound, capacity.CodeNotFound)
			assertNoCalls(t, svc)
		})
	}
}

// TestOperatorListsAre404ForOthers: the operator-only lists refuse a non-operator before
// they read the query, so a bad limit, an unknown parameter or none at all all answer the
// same 404 (the one the service would give), and the service is never called.
func TestOperatorListsAre404ForOthers(t *testing.T) {
	for _, list := range []struct{ path, detail string }{
		{"/v1/nodes/n1/audit", "node not found"}, {"/v1/keys", "not found"}, {"/v1/keys/audit", "not found"},
		{"/v1/keys/key-1", "key not found"},
	} {
		for _, who := range []string{secretOwner, secretStranger, secretAudience, secretNoRights} {
			var first string
			for _, query := range []string{"", "?limit=0", "?x=1", "?limit=500", "?cursor=", "?limit=1&limit=2"} {
				t.Run(list.path+query+" as "+who, func(t *testing.T) {
					// The service's own refusal, so a handler that reached it would differ
					// only in the answers to a bad query.
					svc := &fakeService{err: capacity.Errorf(capacity.CodeNotFound, "%s", list.detail)}
					w := req{method: http.MethodGet, path: list.path + query, auth: ptr("Bearer " + who)}.do(t, newHandler(svc))
					assertSame404(t, w, svc, list.detail, &first)
				})
			}
		}
	}
	t.Run("operator, bad node id", func(t *testing.T) {
		svc := &fakeService{}
		w := req{method: http.MethodGet, path: "/v1/nodes/-x/audit?limit=0", auth: opAuth}.do(t, newHandler(svc))
		problem(t, w, http.StatusNotFound, capacity.CodeNotFound)
		assertNoCalls(t, svc)
	})
}

// assertSame404 checks that w is the service's own 404 with detail, that the service was not
// called, and that the body is the same as the first one (*first, which the first call sets).
func assertSame404(t *testing.T, w *httptest.ResponseRecorder, svc *fakeService, detail string, first *string) {
	t.Helper()
	if p := problem(t, w, http.StatusNotFound, capacity.CodeNotFound); p.Detail != detail {
		t.Errorf("detail %q, want %q", p.Detail, detail)
	}
	assertNoCalls(t, svc)
	if *first == "" {
		*first = w.Body.String()
	} else if w.Body.String() != *first {
		t.Errorf("body %s differs from %s", w.Body.String(), *first)
	}
}

// TestReaderListsAre404WithoutReadBeforeTheQuery: the lists open to other callers than
// operators refuse one without the permission to read before reading the query, with the
// service's own 404, and never call the service.
func TestReaderListsAre404WithoutReadBeforeTheQuery(t *testing.T) {
	for _, list := range []struct{ path, detail string }{
		{"/v1/nodes/n1/reservations", "node not found"}, {reservationPath + "/audit", "reservation not found"},
	} {
		var first string
		for _, query := range []string{"", "?limit=0", "?x=1", "?limit=500", "?cursor=", "?limit=1&limit=2"} {
			t.Run(list.path+query, func(t *testing.T) {
				svc := &fakeService{err: capacity.Errorf(capacity.CodeNotFound, "%s", list.detail)}
				w := req{method: http.MethodGet, path: list.path + query, auth: ptr("Bearer " + secretNoRights)}.do(t, newHandler(svc))
				assertSame404(t, w, svc, list.detail, &first)
			})
		}
	}
	// A reader still gets the answers to a bad query (the service decides the rest).
	svc := &fakeService{}
	w := req{method: http.MethodGet, path: "/v1/nodes/n1/reservations?x=1", auth: ptr("Bearer " + secretNoPerm)}.do(t, newHandler(svc))
	problem(t, w, http.StatusBadRequest, httpapi.CodeMalformedRequest)
}

// TestOperatorBodiesAreStrict: each operator body refuses what the reclaim body refuses, and
// bad times, before the service is called.
func TestOperatorBodiesAreStrict(t *testing.T) {
	type refusal struct {
		name   string
		body   func(members map[string]string) string
		status int
		code   capacity.Code
		names  string // the detail names this
	}
	for _, rt := range operatorBodyRoutes {
		var first string
		for k := range rt.members {
			first = k
			break
		}
		refusals := []refusal{
			{"unknown member", func(m map[string]string) string { m["dryrun"] = "true"; return objectOf(m) }, 400, httpapi.CodeMalformedRequest, "dryrun"},
			{"member in another case", func(m map[string]string) string {
				m[strings.ToUpper(first[:1])+first[1:]] = m[first]
				delete(m, first)
				return objectOf(m)
			}, 400, httpapi.CodeMalformedRequest, strings.ToUpper(first[:1]) + first[1:]},
			{"duplicate member", func(m map[string]string) string {
				return strings.TrimSuffix(objectOf(m), "}") + `,"` + first + `":` + m[first] + "}"
			}, 400, httpapi.CodeMalformedRequest, first},
			{"two objects", func(m map[string]string) string { return objectOf(m) + "{}" }, 400, httpapi.CodeMalformedRequest, ""},
			{"an array", func(map[string]string) string { return `[]` }, 400, httpapi.CodeMalformedRequest, ""},
		}
		for member := range rt.members {
			refusals = append(refusals, refusal{"null " + member, func(m map[string]string) string { m[member] = "null"; return objectOf(m) },
				400, httpapi.CodeMalformedRequest, member})
			if strings.HasPrefix(rt.members[member], "[") {
				refusals = append(refusals, refusal{"null in " + member, func(m map[string]string) string { m[member] = `["u1",null]`; return objectOf(m) },
					400, httpapi.CodeMalformedRequest, member})
			}
			if strings.HasSuffix(member, "At") {
				for _, bad := range []string{`"2026-11-01"`, `"yesterday"`, `"2026-11-01 00:00:00Z"`, `""`} {
					refusals = append(refusals, refusal{"bad time " + member + " " + bad, func(m map[string]string) string { m[member] = bad; return objectOf(m) },
						422, capacity.CodeInvalidRequest, member})
				}
			}
		}
		for _, rf := range refusals {
			t.Run(rt.method+" "+rt.path+" "+rf.name, func(t *testing.T) {
				members := map[string]string{}
				for k, v := range rt.members {
					members[k] = v
				}
				svc := &fakeService{}
				w := req{method: rt.method, path: rt.path, body: rf.body(members), auth: opAuth}.do(t, newHandler(svc))
				p := problem(t, w, rf.status, rf.code)
				if !strings.Contains(p.Detail, rf.names) {
					t.Errorf("detail %q does not name %q", p.Detail, rf.names)
				}
				assertNoCalls(t, svc)
			})
		}
		t.Run(rt.method+" "+rt.path+" wrong content type", func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: rt.method, path: rt.path, body: objectOf(rt.members), auth: opAuth, contentType: ptr("text/plain")}.do(t, newHandler(svc))
			problem(t, w, http.StatusUnsupportedMediaType, httpapi.CodeUnsupportedMediaType)
			assertNoCalls(t, svc)
		})
		t.Run(rt.method+" "+rt.path+" valid", func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: rt.method, path: rt.path, body: objectOf(rt.members), auth: opAuth}.do(t, newHandler(svc))
			if w.Code >= 300 || len(svc.Calls()) != 1 {
				t.Errorf("status %d, calls %d: %s", w.Code, len(svc.Calls()), w.Body.String())
			}
		})
	}
	for _, bad := range []string{`1.5`, `"3"`, `true`, `9223372036854775808`} {
		t.Run("topology expectedTopologyGen "+bad, func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: http.MethodPut, path: "/v1/nodes/n1/topology", body: `{"unitIds":["u1"],"expectedTopologyGen":` + bad + `}`, auth: opAuth}.do(t, newHandler(svc))
			if p := problem(t, w, 400, httpapi.CodeMalformedRequest); !strings.Contains(p.Detail, "expectedTopologyGen") {
				t.Errorf("detail %q", p.Detail)
			}
			assertNoCalls(t, svc)
		})
	}
	t.Run("reservation without startsAt", func(t *testing.T) {
		svc := &fakeService{}
		w := req{method: http.MethodPost, path: "/v1/nodes/n1/reservations", body: `{"reservedUnitIds":["u1"]}`, auth: opAuth}.do(t, newHandler(svc))
		if p := problem(t, w, 422, capacity.CodeInvalidRequest); !strings.Contains(p.Detail, "startsAt") {
			t.Errorf("detail %q", p.Detail)
		}
		assertNoCalls(t, svc)
	})
}

// TestListQuery: limit is 1..100, cursor non-empty, nothing else; a cursor the store refuses
// comes back as the service's own error.
func TestListQuery(t *testing.T) {
	lists := []string{"/v1/nodes/n1/reservations", reservationPath + "/audit", "/v1/nodes/n1/audit", "/v1/keys", "/v1/keys/audit"}
	for _, list := range lists {
		for _, tc := range []struct {
			query  string
			status int
			code   capacity.Code
			want   capacity.PageRequest
		}{
			{"", 200, "", capacity.PageRequest{}},
			{"?limit=1", 200, "", capacity.PageRequest{Limit: 1}},
			{"?limit=100&cursor=eyJwayI6Im4xIn0", 200, "", capacity.PageRequest{Limit: 100, Cursor: "eyJwayI6Im4xIn0"}},
			{"?limit=0", 422, capacity.CodeInvalidRequest, capacity.PageRequest{}},
			{"?limit=101", 422, capacity.CodeInvalidRequest, capacity.PageRequest{}},
			{"?limit=-1", 422, capacity.CodeInvalidRequest, capacity.PageRequest{}},
			{"?limit=ten", 422, capacity.CodeInvalidRequest, capacity.PageRequest{}},
			{"?limit=", 422, capacity.CodeInvalidRequest, capacity.PageRequest{}},
			{"?limit=1.5", 422, capacity.CodeInvalidRequest, capacity.PageRequest{}},
			{"?cursor=", 422, capacity.CodeInvalidRequest, capacity.PageRequest{}},
			{"?limit=1&limit=2", 400, httpapi.CodeMalformedRequest, capacity.PageRequest{}},
			{"?Limit=5", 400, httpapi.CodeMalformedRequest, capacity.PageRequest{}},
			{"?offset=5", 400, httpapi.CodeMalformedRequest, capacity.PageRequest{}},
		} {
			t.Run(list+tc.query, func(t *testing.T) {
				svc := &fakeService{}
				w := req{method: http.MethodGet, path: list + tc.query, auth: opAuth}.do(t, newHandler(svc))
				if tc.status != 200 {
					problem(t, w, tc.status, tc.code)
					assertNoCalls(t, svc)
					return
				}
				calls := svc.Calls()
				if w.Code != 200 || len(calls) != 1 || calls[0].Page != tc.want {
					t.Errorf("status %d, calls %+v, want page %+v", w.Code, calls, tc.want)
				}
			})
		}
		t.Run(list+"?chain=calls", func(t *testing.T) {
			// Only a node's audit has two chains to choose from.
			svc := &fakeService{}
			w := req{method: http.MethodGet, path: list + "?chain=calls", auth: opAuth}.do(t, newHandler(svc))
			if list != "/v1/nodes/n1/audit" {
				problem(t, w, 400, httpapi.CodeMalformedRequest)
				assertNoCalls(t, svc)
			} else if calls := svc.Calls(); w.Code != 200 || len(calls) != 1 || calls[0].Chain != capacity.ChainCalls {
				t.Errorf("status %d, calls %+v", w.Code, calls)
			}
		})
		t.Run(list+" cursor refused by the store", func(t *testing.T) {
			svc := &fakeService{err: capacity.Errorf(capacity.CodeInvalidRequest, "invalid cursor")}
			w := req{method: http.MethodGet, path: list + "?cursor=garbage", auth: opAuth}.do(t, newHandler(svc))
			if p := problem(t, w, 422, capacity.CodeInvalidRequest); p.Detail != "invalid cursor" {
				t.Errorf("detail %q", p.Detail)
			}
			if calls := svc.Calls(); len(calls) != 1 || calls[0].Page.Cursor != "garbage" {
				t.Errorf("calls %+v", calls)
			}
		})
	}
}

// TestRevokeChecksIdempotencyKeyForm: revoke is repeat-safe, but a malformed key, or one
// with the service's own prefixes, is refused as on every other call.
func TestRevokeChecksIdempotencyKeyForm(t *testing.T) {
	for _, key := range []string{"bad key\x01", "scheduled:srcl_1", "event:e1"} {
		svc := &fakeService{}
		w := req{method: http.MethodPost, path: "/v1/keys/key-1/revoke", auth: opAuth, header: map[string]string{"Idempotency-Key": key}}.do(t, newHandler(svc))
		problem(t, w, 422, capacity.CodeInvalidRequest)
		assertNoCalls(t, svc)
	}
}

// ---------------------------------------------------------------------------------------
// Plan ETags on reclaims.

func dryRunPlan(etag string) *capacity.CapacityResult {
	return &capacity.CapacityResult{Reservation: reservation(nil, nil), DryRun: true, Terminated: []string{"vm-1"}, Skipped: []string{}, PlanETag: etag}
}

func TestDryRunAnswersThePlanETag(t *testing.T) {
	const etag = `"0123456789abcdef0123456789abcdef"`
	for _, tc := range []struct {
		name     string
		body     string
		canned   *capacity.CapacityResult
		wantETag string
	}{
		{"dry run", `{"unitIds":["u1"],"dryRun":true}`, dryRunPlan(etag), etag},
		{"dry run with at", `{"unitIds":["u1"],"dryRun":true,"at":"2027-01-01T00:00:00Z"}`, dryRunPlan(etag), etag},
		{"real reclaim: no ETag", `{"unitIds":["u1"]}`, &capacity.CapacityResult{Reservation: reservation(nil, nil), PlanETag: etag}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{capacity: tc.canned}
			q := req{method: http.MethodPost, path: reclaimPath, body: tc.body}
			w := q.do(t, newHandler(svc))
			checkDocument(t, q, w)
			if w.Code != 200 || w.Header().Get("ETag") != tc.wantETag {
				t.Fatalf("status %d, ETag %q, want %q: %s", w.Code, w.Header().Get("ETag"), tc.wantETag, w.Body.String())
			}
			m := jsonObject(t, w)
			if tc.wantETag == "" {
				assertAbsent(t, m, "planEtag")
			} else if string(m["planEtag"]) != fmt.Sprintf("%q", etag) {
				t.Errorf("planEtag = %s, want %q", m["planEtag"], etag)
			}
		})
	}
}

// TestIfMatchIsPassedOn: the header reaches the domain as sent (several lines joined into one
// list, as RFC 9110 reads them); the domain compares.
func TestIfMatchIsPassedOn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   string
	}{
		{"none", nil, ""},
		{"one", []string{`"abc"`}, `"abc"`},
		{"weak", []string{`W/"abc"`}, `W/"abc"`},
		{"star", []string{`*`}, `*`},
		{"a list", []string{`"a", "b"`}, `"a", "b"`},
		{"two lines", []string{`"a"`, `"b"`}, `"a", "b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{}
			w := serve(newHandler(svc), reclaimIfMatch(secretOwner, tc.values))
			calls := svc.Calls()
			if w.Code != 200 || len(calls) != 1 || calls[0].Capacity.IfMatch != tc.want {
				t.Errorf("status %d, calls %+v, want IfMatch %q", w.Code, calls, tc.want)
			}
		})
	}
}

// TestMalformedIfMatchIsRefused: an If-Match that is not "*" or a list of quoted entity tags
// is the client's mistake: 400 malformed_request before the domain is called, never a 412
// (as if the plan had changed) nor a reclaim without a precondition (an empty value). The
// permission still comes first: a caller without it gets the 404 whatever the header.
func TestMalformedIfMatchIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"unquoted", []string{`abc`}},
		{"empty", []string{``}},
		{"only commas", []string{` , ,`}},
		{"star in a list", []string{`"a", *`}},
		{"unterminated", []string{`"abc`}},
		{"junk after a tag", []string{`"abc"x`}},
		{"a space inside", []string{`"a b"`}},
		{"weak unquoted", []string{`W/abc`}},
		{"one bad line of two", []string{`"a"`, `b`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{}
			w := serve(newHandler(svc), reclaimIfMatch(secretOwner, tc.values))
			if p := problem(t, w, http.StatusBadRequest, httpapi.CodeMalformedRequest); !strings.Contains(p.Detail, "If-Match") {
				t.Errorf("detail %q", p.Detail)
			}
			assertNoCalls(t, svc)
			problem(t, serve(newHandler(svc), reclaimIfMatch(secretNoPerm, tc.values)), http.StatusNotFound, capacity.CodeNotFound)
		})
	}
}

// reclaimIfMatch is a reclaim of u1 with the key's secret and each value as an If-Match line.
func reclaimIfMatch(secret string, values []string) *http.Request {
	r := httptestRequest(http.MethodPost, reclaimPath, `{"unitIds":["u1"]}`)
	r.Header.Set("Authorization", "Bearer "+secret)
	for _, v := range values {
		r.Header.Add("If-Match", v)
	}
	return r
}

// TestIfMatchWithoutAPlanIsRefused: a release, or a reclaim scheduled for later, has no plan
// of now to match: If-Match there is refused, not ignored.
func TestIfMatchWithoutAPlanIsRefused(t *testing.T) {
	for _, tc := range []struct{ path, body string }{
		{releasePath, `{"unitIds":["u1"]}`},
		{reclaimPath, `{"unitIds":["u1"],"at":"2027-01-01T00:00:00Z"}`},
	} {
		t.Run(tc.path+" "+tc.body, func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: http.MethodPost, path: tc.path, body: tc.body, header: map[string]string{"If-Match": `"abc"`}}.do(t, newHandler(svc))
			if p := problem(t, w, 422, capacity.CodeInvalidRequest); !strings.Contains(p.Detail, "If-Match") {
				t.Errorf("detail %q", p.Detail)
			}
			assertNoCalls(t, svc)
		})
	}
}

// TestPlanChangedAnswersTheNewPlan: 412 with the new plan as a dry run shows it, and its tag
// in ETag.
func TestPlanChangedAnswersTheNewPlan(t *testing.T) {
	const etag = `"ffffffffffffffffffffffffffffffff"`
	plan := dryRunPlan(etag)
	plan.DryRun = false // the problem shows it as a dry run whatever the domain set
	svc := &fakeService{err: fmt.Errorf("reclaim: %w", &capacity.Error{Code: capacity.CodePlanChanged, Message: "the plan has changed", Plan: plan})}
	q := req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`, header: map[string]string{"If-Match": `"old"`}}
	w := q.do(t, newHandler(svc))
	p := problem(t, w, http.StatusPreconditionFailed, capacity.CodePlanChanged)
	checkDocument(t, q, w)
	if w.Header().Get("ETag") != etag {
		t.Errorf("ETag %q, want %q", w.Header().Get("ETag"), etag)
	}
	if p.Plan == nil || p.Plan.PlanETag != etag || p.Plan.WouldTerminate == nil || (*p.Plan.WouldTerminate)[0] != "vm-1" ||
		p.Plan.Terminated != nil || p.Plan.ID != "r1" {
		t.Errorf("plan %+v", p.Plan)
	}
	// Any other problem has neither.
	svc = &fakeService{err: capacity.Errorf(capacity.CodeOutsideTerm, "no")}
	w = req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`}.do(t, newHandler(svc))
	if problem(t, w, 409, capacity.CodeOutsideTerm); w.Header().Get("ETag") != "" || strings.Contains(w.Body.String(), "plan") {
		t.Errorf("ETag %q, body %s", w.Header().Get("ETag"), w.Body.String())
	}
}

// httptestRequest is a JSON request with the owner's key.
func httptestRequest(method, path, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+secretOwner)
	r.Header.Set("Content-Type", "application/json")
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestOperatorRoutePermissions: every operator route of the route table, called by an
// operator key holding every permission but the route's own, by the marketplace
// scheduler's key (operator, vm.place) or by a tenant, answers the same 404 body, before its
// body or query is read (a valid body, garbage or a bad query alike), and never reaches the
// service; an operator key holding only the route's permission reaches it. The permission
// comes from shared/routes, the one table the mux, the gateway and the OpenAPI document use.
func TestOperatorRoutePermissions(t *testing.T) {
	bodies := map[string]string{}
	for _, rt := range operatorBodyRoutes {
		bodies[rt.method+" "+rt.path] = objectOf(rt.members)
	}
	concrete := strings.NewReplacer("{nodeId}", "n1", "{id}", "r1", "{keyId}", "key-1", "{reclaimId}", "rcl-1", "{vmId}", "vm-1")
	seen := 0
	for _, rt := range routes.All {
		if rt.Permission == "" {
			continue
		}
		seen++
		path := concrete.Replace(rt.Path)
		valid := bodies[rt.Method+" "+path]
		if valid == "" && rt.Method != http.MethodGet {
			t.Errorf("%s %s: no valid body in operatorBodyRoutes", rt.Method, path)
		}
		keys := testKeys()
		add := func(name string, perms ...string) string {
			secret := capacity.FixedKeySecret(name)
			keys.Put(auth.Hash(secret), capacity.APIKey{KeyID: "key-" + name, OrgID: "platform", Operator: true, Permissions: perms})
			return "Bearer " + secret
		}
		others := slices.DeleteFunc(slices.Clone(capacity.AllPermissions), func(p string) bool { return p == rt.Permission })
		callers := map[string]string{
			"operator without " + rt.Permission: add("allbut", others...),
			"marketplace scheduler":             "Bearer " + secretOperator,
			"tenant":                            "Bearer " + secretOwner,
		}
		t.Run(rt.OperationID, func(t *testing.T) {
			var first string
			for name, authz := range callers {
				for _, variant := range []struct{ query, body, ct string }{
					{"", valid, "application/json"}, {"?limit=0", `{"bogus":1}`, "application/json"}, {"?x=1", "not json", "text/plain"},
				} {
					svc := &fakeService{}
					w := req{method: rt.Method, path: path + variant.query, body: variant.body, auth: ptr(authz), contentType: ptr(variant.ct)}.do(t, newHandlerWithKeys(svc, keys))
					problem(t, w, http.StatusNotFound, capacity.CodeNotFound)
					assertNoCalls(t, svc)
					if first == "" {
						first = w.Body.String()
					} else if w.Body.String() != first {
						t.Errorf("%s: body %s differs from %s", name, w.Body.String(), first)
					}
				}
			}
			svc := &fakeService{}
			w := req{method: rt.Method, path: path, body: valid, auth: ptr(add("only", rt.Permission))}.do(t, newHandlerWithKeys(svc, keys))
			if w.Code >= 300 || len(svc.Calls()) != 1 {
				t.Errorf("operator holding only %s: %d %s, %d calls; want the service's answer", rt.Permission, w.Code, w.Body.String(), len(svc.Calls()))
			}
		})
	}
	if seen == 0 {
		t.Fatal("no operator route in the table")
	}
}

// TestEveryRouteNamesItsOperatorPermission: every route of the table answers a key holding
// every permission (with any body) without the panic of an operator handler whose route
// names no operator permission in shared/routes.
func TestEveryRouteNamesItsOperatorPermission(t *testing.T) {
	concrete := strings.NewReplacer("{nodeId}", "n1", "{id}", "r1", "{keyId}", "key-1", "{reclaimId}", "op-1", "{scheduledReclaimId}", "s-1")
	for _, rt := range routes.All {
		t.Run(rt.OperationID, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s %s: %v", rt.Method, rt.Path, p)
				}
			}()
			req{method: rt.Method, path: concrete.Replace(rt.Path), body: `{}`, auth: opAuth}.do(t, newHandler(&fakeService{}))
		})
	}
}
