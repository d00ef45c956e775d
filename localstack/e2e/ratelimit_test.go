package e2e

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
)

// newRateKey creates, through the API, a key of the demo node's owner org that may move and
// read its capacity, with its own rate limit (nil: the environment's), and returns its secret.
func newRateKey(t testing.TB, rateLimit map[string]any, description string) string {
	t.Helper()
	body := map[string]any{"orgId": demo.OrgOwner, "permissions": []string{capacity.PermCapacity, capacity.PermRead}, "description": description}
	if rateLimit != nil {
		body["rateLimit"] = rateLimit
	}
	created := call(t, http.MethodPost, "/v1/keys", keyOperator, body)
	var k struct {
		Key struct {
			RateLimit map[string]any `json:"rateLimit"`
		} `json:"key"`
		Secret string `json:"secret"`
	}
	if created.Status != http.StatusCreated || json.Unmarshal(created.Body, &k) != nil || k.Secret == "" {
		t.Fatalf("create key: %d %s", created.Status, created.Body)
	}
	if !reflect.DeepEqual(k.Key.RateLimit, rateLimit) && (rateLimit != nil || k.Key.RateLimit != nil) {
		t.Fatalf("created key's rateLimit %v, want %v", k.Key.RateLimit, rateLimit)
	}
	return k.Secret
}

// TestRateLimitedKeyGets429: through API Gateway, a key created with its own limit (1 call a
// second, burst 2) is answered 429 rate_limited with Retry-After once past its burst, on reads
// and on capacity calls alike, and nothing changes for those calls: no node item, no audit
// record (a refused dry run would otherwise append one). Another key of the same org, calling
// meanwhile, is answered as usual. After Retry-After the limited key is answered again.
func TestRateLimitedKeyGets429(t *testing.T) {
	node := newNode(t, nil)
	limited := newRateKey(t, map[string]any{"perSecond": float64(1), "burst": float64(2)}, "e2e: rate limited")
	other := newRateKey(t, nil, "e2e: the environment's limit")
	resPath := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID
	dryRun := map[string]any{"unitIds": []string{"gpu-2"}, "dryRun": true}

	for i := range 2 {
		if r := call(t, http.MethodGet, resPath, limited, nil); r.Status != http.StatusOK {
			t.Fatalf("call %d within the burst: %d %s", i+1, r.Status, r.Body)
		}
	}
	before, audit := partition(t, node), auditOf(t, node)
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{http.MethodGet, resPath, nil},
		{http.MethodPost, reclaimPath(node), dryRun},
		{http.MethodPost, releasePath(node), map[string]any{"unitIds": []string{"gpu-1"}}},
	} {
		r := call(t, c.method, c.path, limited, c.body)
		if r.Status != http.StatusTooManyRequests || r.json(t)["code"] != string(capacity.CodeRateLimited) {
			t.Fatalf("%s %s past the burst: %d %s, want 429 rate_limited", c.method, c.path, r.Status, r.Body)
		}
		// 1 call a second: the next is admitted within a second.
		if got := r.Header.Get("Retry-After"); got != "1" {
			t.Errorf("%s %s: Retry-After %q, want \"1\"", c.method, c.path, got)
		}
		// Meanwhile the other key is answered as usual, by the same node.
		if o := call(t, http.MethodPost, reclaimPath(node), other, dryRun); o.Status != http.StatusOK {
			t.Errorf("the other key's dry run: %d %s", o.Status, o.Body)
		}
	}
	assertUnchanged(t, node, before)
	// The other key's three dry runs are on the calls chain; the limited key's calls are not.
	if got := len(auditOf(t, node)); got != len(audit)+3 {
		t.Errorf("audit records %d, want %d: the other key's 3 dry runs and nothing for the refused calls", got, len(audit)+3)
	}
	retry, _ := strconv.Atoi(call(t, http.MethodGet, resPath, limited, nil).Header.Get("Retry-After"))
	time.Sleep(time.Duration(retry) * time.Second)
	if r := call(t, http.MethodGet, resPath, limited, nil); r.Status != http.StatusOK {
		t.Errorf("after Retry-After: %d %s", r.Status, r.Body)
	}
}
