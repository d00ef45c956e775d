package e2e

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// TestIfMatchThroughTheAPI: through API Gateway, a malformed If-Match is 400 malformed_request
// (not 412, not a reclaim without a precondition), and a dry run's ETag of [gpu-2] does not
// admit a reclaim of [gpu-2, gpu-4] although it would evict the same VM. Neither changes the
// node.
func TestIfMatchThroughTheAPI(t *testing.T) {
	node := newNode(t, nil)
	dry := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2"}, "dryRun": true})
	etag := dry.Header.Get("ETag")
	if dry.Status != http.StatusOK || etag == "" {
		t.Fatalf("dry run: %d %q %s", dry.Status, etag, dry.Body)
	}
	before := partition(t, node)
	for _, tc := range []struct {
		name    string
		units   []string
		ifMatch string
		status  int
		code    string
	}{
		{"unquoted", []string{"gpu-2"}, "abc", http.StatusBadRequest, "malformed_request"},
		{"star in a list", []string{"gpu-2"}, etag + ", *", http.StatusBadRequest, "malformed_request"},
		{"the dry run's ETag for more units", []string{"gpu-2", "gpu-4"}, etag, http.StatusPreconditionFailed, "plan_changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": tc.units}, "If-Match", tc.ifMatch)
			if r.Status != tc.status || r.json(t)["code"] != tc.code {
				t.Fatalf("%d %s, want %d %s", r.Status, r.Body, tc.status, tc.code)
			}
			assertUnchanged(t, node, before)
		})
	}
	// The tag still admits the plan it names.
	if r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2"}}, "If-Match", etag); r.Status != http.StatusOK {
		t.Fatalf("reclaim with its own plan's ETag: %d %s", r.Status, r.Body)
	}
}

// TestIdempotencyKeyPerAPIKeyThroughTheAPI: a second key of the node owner's org that sends
// the same Idempotency-Key is a request of its own (not the first key's stored answer), the
// first key's retry replays and leaves an audit record of the replay, and a client key
// with the service's own prefix is refused.
func TestIdempotencyKeyPerAPIKeyThroughTheAPI(t *testing.T) {
	created := call(t, http.MethodPost, "/v1/keys", keyOperator,
		map[string]any{"orgId": demo.OrgOwner, "permissions": []string{capacity.PermCapacity}, "description": "second owner key"})
	if created.Status != http.StatusCreated {
		t.Fatalf("create key: %d %s", created.Status, created.Body)
	}
	second, _ := created.json(t)["secret"].(string)
	node := newNode(t, nil)
	body := map[string]any{"unitIds": []string{"gpu-2"}}
	first := call(t, http.MethodPost, reclaimPath(node), keyOwner, body, "Idempotency-Key", "shared-idem")
	if first.Status != http.StatusOK || first.json(t)["reclaimId"] == nil {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	awaitOperation(t, node, first.json(t)["reclaimId"].(string), 30*time.Second) // its workflow writes too
	other := call(t, http.MethodPost, reclaimPath(node), second, map[string]any{"unitIds": []string{"gpu-4"}}, "Idempotency-Key", "shared-idem")
	if other.Status != http.StatusOK || other.Header.Get("Idempotent-Replayed") != "" || string(other.Body) == string(first.Body) {
		t.Fatalf("another key, same Idempotency-Key: %d %q %s", other.Status, other.Header.Get("Idempotent-Replayed"), other.Body)
	}
	again := call(t, http.MethodPost, reclaimPath(node), keyOwner, body, "Idempotency-Key", "shared-idem")
	if again.Status != http.StatusOK || again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Fatalf("retry: %d %q %s", again.Status, again.Header.Get("Idempotent-Replayed"), again.Body)
	}
	replays := 0
	for _, it := range auditOf(t, node) {
		if s, ok := it["Outcome"].(*types.AttributeValueMemberS); ok && s.Value == capacity.OutcomeReplayed {
			replays++
		}
	}
	if replays != 1 {
		t.Errorf("%d audit records of a replay, want 1", replays)
	}
	state := partition(t, node)
	for _, key := range []string{"scheduled:srcl_x", "event:e1"} {
		r := call(t, http.MethodPost, reclaimPath(node), keyOwner, body, "Idempotency-Key", key)
		if r.Status != http.StatusUnprocessableEntity || r.json(t)["code"] != "invalid_request" {
			t.Errorf("Idempotency-Key %s: %d %s", key, r.Status, r.Body)
		}
	}
	assertUnchanged(t, node, state)
}

// TestListCursorsThroughTheAPI: a caller with reservation.read that sees nothing on a node
// gets, whatever its cursor, the very 404 of a node that does not exist; the keys list's
// cursor carries no key hash.
func TestListCursorsThroughTheAPI(t *testing.T) {
	hidden := newNode(t, func(s *dynamo.Seed) {
		s.Nodes[0].OwnerOrgID = "org-else"
		s.Reservations[0].AllowedOrgIDs = []string{"org-else"}
		s.Reservations[0].ManagingOrgIDs = nil
	})
	missing := call(t, http.MethodGet, "/v1/nodes/node-404/reservations", keyAudience, nil)
	if missing.Status != http.StatusNotFound {
		t.Fatalf("missing node: %d %s", missing.Status, missing.Body)
	}
	for _, cursor := range []string{"garbage", "eyJwayI6Ik5PREUjeCJ9", "WyJ2MSIsInJlc2VydmF0aW9ucyIsIngiLCJ5Il0"} {
		r := call(t, http.MethodGet, "/v1/nodes/"+hidden+"/reservations?cursor="+cursor, keyAudience, nil)
		if r.Status != http.StatusNotFound || string(r.Body) != string(missing.Body) {
			t.Errorf("cursor %s: %d %s, want the missing node's %s", cursor, r.Status, r.Body, missing.Body)
		}
	}
	page := call(t, http.MethodGet, "/v1/keys?limit=1", keyOperator, nil)
	if page.Status != http.StatusOK {
		t.Fatalf("keys: %d %s", page.Status, page.Body)
	}
	next, _ := page.json(t)["nextCursor"].(string)
	decoded, _ := base64.RawURLEncoding.DecodeString(next)
	if next == "" || strings.Contains(string(decoded), "APIKEY") || strings.Contains(string(decoded), auth.Hash(keyOperator)) {
		t.Errorf("keys cursor %q (%s)", next, decoded)
	}
	if r := call(t, http.MethodGet, "/v1/keys?limit=1&cursor="+next, keyOperator, nil); r.Status != http.StatusOK {
		t.Errorf("next keys page: %d %s", r.Status, r.Body)
	}
}
