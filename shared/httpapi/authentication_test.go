package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
)

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

// TestExpiredKeyProblemSaysWhen: an expired key's 401 says that it expired and when (detail
// and expiredAt); a revoked or unknown key's says nothing of the kind.
func TestExpiredKeyProblemSaysWhen(t *testing.T) {
	for _, tt := range []struct {
		name, secret, expiredAt string
	}{
		{"expired", secretExpired, now.UTC().Format(time.RFC3339)},
		{"revoked", secretRevoked, ""},
		{"unknown", capacity.FixedKeySecret("nobody"), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt := req{method: http.MethodGet, path: reservationPath, auth: ptr("Bearer " + tt.secret)}
			p := problem(t, rt.do(t, newHandler(&fakeService{})), http.StatusUnauthorized, capacity.CodeUnauthenticated)
			if p.ExpiredAt != tt.expiredAt {
				t.Errorf("expiredAt = %q, want %q", p.ExpiredAt, tt.expiredAt)
			}
			if said := strings.Contains(p.Detail, "expired at"); said != (tt.expiredAt != "") {
				t.Errorf("detail %q: says when the key expired: %v", p.Detail, said)
			}
		})
	}
}
