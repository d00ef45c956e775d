package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// graceSeconds reaches the reclaim, bounded; the answer says when termination begins, and
// only when something was evicted.
func TestGraceSeconds(t *testing.T) {
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		code   capacity.Code // for a refusal
		after  string        // the answer's terminateAfter ("" absent)
	}{
		{"reclaim with grace", reclaimPath, `{"unitIds":["u2"],"graceSeconds":90}`, 200, "", now.Add(90 * time.Second).Format(time.RFC3339)},
		{"reclaim without grace", reclaimPath, `{"unitIds":["u2"]}`, 200, "", now.Format(time.RFC3339)},
		{"grace at the bound", reclaimPath, `{"unitIds":["u2"],"graceSeconds":120}`, 200, "", now.Add(2 * time.Minute).Format(time.RFC3339)},
		{"dry run with grace", reclaimPath, `{"unitIds":["u2"],"graceSeconds":30,"dryRun":true}`, 200, "", ""},
		{"nothing evicted", reclaimPath, `{"unitIds":["u1"],"graceSeconds":30}`, 200, "", ""},
		{"grace over the bound", reclaimPath, `{"unitIds":["u2"],"graceSeconds":121}`, 422, capacity.CodeInvalidRequest, ""},
		{"negative grace", reclaimPath, `{"unitIds":["u2"],"graceSeconds":-1}`, 422, capacity.CodeInvalidRequest, ""},
		{"fractional grace", reclaimPath, `{"unitIds":["u2"],"graceSeconds":1.5}`, 400, httpapi.CodeMalformedRequest, ""},
		{"grace as a string", reclaimPath, `{"unitIds":["u2"],"graceSeconds":"30"}`, 400, httpapi.CodeMalformedRequest, ""},
		{"release with grace", releasePath, `{"unitIds":["u1"],"graceSeconds":5}`, 422, capacity.CodeInvalidRequest, ""},
		{"release with zero grace", releasePath, `{"unitIds":["u1"],"graceSeconds":0}`, 200, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newRealHandler(t)
			w := req{method: http.MethodPost, path: tt.path, body: tt.body}.do(t, h)
			if tt.code != "" {
				p := problem(t, w, tt.status, tt.code)
				if tt.status == 422 && !strings.Contains(p.Detail, "graceSeconds") {
					t.Errorf("detail %q does not name graceSeconds", p.Detail)
				}
				return
			}
			if w.Code != tt.status {
				t.Fatalf("status = %d: %s", w.Code, w.Body.String())
			}
			m := jsonObject(t, w)
			if tt.after == "" {
				assertAbsent(t, m, "terminateAfter")
				return
			}
			var got string
			if err := json.Unmarshal(m["terminateAfter"], &got); err != nil || got != tt.after {
				t.Errorf("terminateAfter = %s, want %q", m["terminateAfter"], tt.after)
			}
		})
	}
}
