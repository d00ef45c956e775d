package httpapi_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/wire"
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
			name: "end agent key overlap: 200, the generation and when the previous key stopped",
			q: req{method: http.MethodPost, path: "/v1/nodes/n1/agent-key/end-overlap", auth: opAuth, header: map[string]string{"Idempotency-Key": "k8"},
				body: `{"reason":"old key leaked"}`},
			canned:     opResults{rotation: &capacity.AgentKeyResult{NodeID: "n1", Gen: 4, PreviousValidUntil: t0}},
			wantMethod: "EndAgentKeyOverlap", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if want := (capacity.AgentKeyRotation{NodeID: "n1", Reason: "old key leaked", IdempotencyKey: "k8"}); c.Rotation != want {
					t.Errorf("request %+v, want %+v", c.Rotation, want)
				}
				var a wire.AgentKeyAnswerJSON
				decodeStrict(t, body, &a)
				if a.AgentKey != "" || a.AgentKeyGen != 4 || a.PreviousValidUntil != t0.UTC().Format(time.RFC3339) {
					t.Errorf("answer %s", body)
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
			name:       "reservation audit: the calls about it",
			q:          req{method: http.MethodGet, path: reservationPath + "/audit?chain=calls"},
			canned:     opResults{auditPage: &capacity.AuditPage{}},
			wantMethod: "ListReservationAudit", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				if c.ResID != "r1" || c.Chain != capacity.ChainCalls {
					t.Errorf("call %+v, answer %s", c, body)
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
			name:       "the caller's own key, an operator's (not a key id)",
			q:          req{method: http.MethodGet, path: "/v1/keys/self", auth: opAuth},
			wantMethod: "SelfKey", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.SelfKeyJSON
				decodeStrict(t, body, &a)
				if a.Key.KeyID != "key-platform" || a.Key.OrgID != "platform" || !a.Key.Operator || len(a.Key.Permissions) != len(capacity.AllPermissions) {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
		},
		{
			name:       "the caller's own key, a tenant's: no permission needed",
			q:          req{method: http.MethodGet, path: "/v1/keys/self"},
			wantMethod: "SelfKey", wantStatus: 200,
			check: func(t *testing.T, c call, body []byte) {
				var a wire.SelfKeyJSON
				decodeStrict(t, body, &a)
				if a.Key.KeyID != "key-owner" || a.Key.OrgID != "owner" || a.Key.Operator || strings.Contains(string(body), "hash") ||
					strings.Join(a.Key.Permissions, ",") != capacity.PermCapacity+","+capacity.PermRead {
					t.Errorf("call %+v, answer %s", c, body)
				}
			},
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
