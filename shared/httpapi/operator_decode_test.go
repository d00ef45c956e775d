package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

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
	lists := []string{"/v1/nodes/n1/reservations", reservationPath + "/audit", "/v1/nodes/n1/audit", "/v1/keys", "/v1/keys/audit",
		"/v1/nodes", reservationPath + "/reclaims"}
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
			// Only a node's audit and a reservation's have two chains to choose from.
			svc := &fakeService{}
			w := req{method: http.MethodGet, path: list + "?chain=calls", auth: opAuth}.do(t, newHandler(svc))
			if list != "/v1/nodes/n1/audit" && list != reservationPath+"/audit" {
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

// TestReclaimListState: the reclaim list's state filter reaches the service as sent (which
// judges its value), once, beside the page; the node list takes no filter.
func TestReclaimListState(t *testing.T) {
	for _, tc := range []struct {
		query, state string
		status       int
	}{
		{"?state=in-flight", "in-flight", 200},
		{"?state=done&limit=5", "done", 200}, // the service's to refuse, after its 404s
		{"?state=failed&state=completed", "", 400},
		{"?State=failed", "", 400},
	} {
		t.Run(tc.query, func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: http.MethodGet, path: reservationPath + "/reclaims" + tc.query, auth: opAuth}.do(t, newHandler(svc))
			if tc.status != 200 {
				problem(t, w, tc.status, httpapi.CodeMalformedRequest)
				assertNoCalls(t, svc)
				return
			}
			if calls := svc.Calls(); w.Code != 200 || len(calls) != 1 || calls[0].Method != "ListReclaimOperations" || calls[0].ID != tc.state {
				t.Errorf("status %d, calls %+v", w.Code, calls)
			}
		})
	}
	svc := &fakeService{}
	w := req{method: http.MethodGet, path: "/v1/nodes?state=failed", auth: opAuth}.do(t, newHandler(svc))
	problem(t, w, 400, httpapi.CodeMalformedRequest)
	assertNoCalls(t, svc)
}
