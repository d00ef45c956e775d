package e2e

import (
	"net/http"
	"testing"
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
