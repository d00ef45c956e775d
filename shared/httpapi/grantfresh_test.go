package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
)

// A key revoked a moment ago, still valid in this instance's key cache: the routes that
// hand out a secret outliving the call (a new API key, an agent key at a node's put or a
// rotation) read the caller's key past the cache and refuse it 401 without calling the
// service, while a read that grants nothing may still pass within the cache's TTL. Once a
// granting route has read the key revoked, the cache holds that too, so every route refuses.
func TestGrantingRoutesReadTheCallerFresh(t *testing.T) {
	opAuth := ptr("Bearer " + secretPlatform)
	granting := []req{
		{method: http.MethodPost, path: "/v1/keys", auth: opAuth, body: `{"orgId":"owner","permissions":["reservation.read"]}`},
		{method: http.MethodPut, path: "/v1/nodes/n1", auth: opAuth, body: `{"ownerOrgId":"owner2","unitIds":["u0"],"agentEndpoint":"https://a"}`},
		{method: http.MethodPost, path: "/v1/nodes/n1/agent-key/rotate", auth: opAuth},
	}
	read := req{method: http.MethodGet, path: "/v1/keys", auth: opAuth}
	for _, g := range granting {
		t.Run(g.method+" "+g.path, func(t *testing.T) {
			keys := testKeys()
			hash := auth.Hash(secretPlatform)
			svc := &fakeService{opResults: opResults{keyRes: &capacity.KeyResult{Key: capacity.APIKey{KeyID: "key-new", OrgID: "owner"}},
				nodeRes: &capacity.NodeResult{}, rotation: &capacity.AgentKeyResult{}, keyPage: &capacity.KeyPage{}}}
			h := newHandlerWithKeys(svc, keys)
			if w := read.do(t, h); w.Code != http.StatusOK {
				t.Fatalf("a read with the valid key: %d %s", w.Code, w.Body)
			}
			// Valid: the granting route is served, with a consistent read of the key.
			if w := g.do(t, h); w.Code >= 300 {
				t.Fatalf("with the valid key: %d %s", w.Code, w.Body)
			}
			if n := keys.ConsistentLookups(hash); n != 1 {
				t.Errorf("the granting route read the key consistently %d times, want 1", n)
			}
			keys.Update(hash, func(k *capacity.APIKey) { k.Revoked = true })
			if w := read.do(t, h); w.Code != http.StatusOK {
				t.Errorf("a read within the cache's TTL: %d, want 200 (cached)", w.Code)
			}
			before := len(svc.Calls())
			w := g.do(t, h)
			problem(t, w, http.StatusUnauthorized, capacity.CodeUnauthenticated)
			if calls := svc.Calls()[before:]; len(calls) != 0 {
				t.Errorf("the revoked key reached the service: %+v", calls)
			}
			problem(t, read.do(t, h), http.StatusUnauthorized, capacity.CodeUnauthenticated)
		})
	}
}
