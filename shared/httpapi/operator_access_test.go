package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/routes"
)

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
	{http.MethodPost, "/v1/nodes/n1/agent-key/end-overlap", map[string]string{"reason": `"r"`}},
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
		{"/v1/nodes", "not found"}, {reservationPath + "/reclaims", "reservation not found"},
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
