package httpapi_test

import (
	"bytes"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// ---------------------------------------------------------------------------------------
// Requests: nulls, permission before the body, reason, the audience's operation view.

// validBodies are a valid body of each route with a body, as JSON members.
var validBodies = []struct {
	path    string
	auth    string
	members map[string]string
}{
	{reclaimPath, secretOwner, map[string]string{"unitIds": `["u1"]`, "dryRun": `true`, "reason": `"r"`, "graceSeconds": `5`}},
	{releasePath, secretOwner, map[string]string{"unitIds": `["u1"]`, "dryRun": `true`, "reason": `"r"`}},
	{vmsPath, secretOperator, map[string]string{"vmId": `"v1"`, "orgId": `"o1"`, "tier": `"spot"`, "unitIds": `["u1"]`}},
}

func objectOf(members map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(members)) {
		parts = append(parts, strconv.Quote(k)+":"+members[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// A null is never a default: {"unitIds":["u3"],"dryRun":null} must not run a real reclaim.
// Every member of every body, set to null or holding one, is refused like a wrong type.
func TestNullIsRefusedInEveryField(t *testing.T) {
	for _, b := range validBodies {
		for field := range b.members {
			for _, null := range []string{`null`, `[null]`, `["u1",null]`} {
				if null != `null` && !strings.HasPrefix(b.members[field], "[") {
					continue
				}
				members := maps.Clone(b.members)
				members[field] = null
				body := objectOf(members)
				t.Run(b.path+" "+body, func(t *testing.T) {
					svc := &fakeService{}
					w := req{method: http.MethodPost, path: b.path, body: body, auth: ptr("Bearer " + b.auth)}.do(t, newHandler(svc))
					p := problem(t, w, http.StatusBadRequest, httpapi.CodeMalformedRequest)
					if !strings.Contains(p.Detail, field) {
						t.Errorf("detail %q does not name %q", p.Detail, field)
					}
					assertNoCalls(t, svc)
				})
			}
		}
	}
}

// A caller who may not make the call gets the one 404 of a missing reservation (or node),
// byte for byte, whatever its body, content type or size: the body is never looked at.
func TestPermissionIsCheckedBeforeTheBody(t *testing.T) {
	big := `{"unitIds":["u1"],"reason":"` + strings.Repeat("a", httpapi.MaxBodyBytes) + `"}`
	bodies := []struct {
		name, contentType, body string
	}{
		{"valid", "application/json", ""},
		{"malformed", "application/json", `{"unitIds":`},
		{"unknown field", "application/json", `{"unitIds":["u1"],"dryrun":true}`},
		{"null", "application/json", `{"unitIds":["u1"],"dryRun":null}`},
		{"empty", "application/json", ``},
		{"invalid units", "application/json", `{"unitIds":[]}`},
		{"text/plain", "text/plain", `hello`},
		{"no content type", "", `{"unitIds":["u1"]}`},
		{"too large", "application/json", big},
	}
	routes := []struct {
		name      string
		path      string
		reference req // a caller who may call, on something that does not exist
		callers   []string
	}{
		{"reclaim", reclaimPath,
			req{method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/reclaim", body: `{"unitIds":["u1"]}`},
			[]string{secretNoPerm, secretNoRights, secretPlacer + "-without-capacity"}},
		{"release", releasePath,
			req{method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/release", body: `{"unitIds":["u1"]}`},
			[]string{secretNoPerm, secretNoRights}},
		{"placement", vmsPath,
			req{method: http.MethodPost, path: "/v1/nodes/n9/vms", auth: ptr("Bearer " + secretOperator), body: `{"vmId":"v1","orgId":"o1","tier":"spot","unitIds":["u1"]}`},
			[]string{secretOwner, secretPlacer, secretOpNoVM, secretNoRights}},
	}
	for _, rt := range routes {
		t.Run(rt.name, func(t *testing.T) {
			h, store := newRealHandler(t)
			want := rt.reference.do(t, h)
			problem(t, want, http.StatusNotFound, capacity.CodeNotFound)
			for _, caller := range rt.callers {
				if strings.HasSuffix(caller, "-without-capacity") {
					continue // only listed to document that vm.place grants no capacity call
				}
				for _, b := range bodies {
					body := b.body
					if b.name == "valid" {
						body = rt.reference.body
					}
					w := req{method: http.MethodPost, path: rt.path, body: body, contentType: &b.contentType, auth: ptr("Bearer " + caller)}.do(t, h)
					if w.Code != http.StatusNotFound || !bytes.Equal(w.Body.Bytes(), want.Body.Bytes()) {
						t.Errorf("%s, %s body: %d %s\nwant the 404 %s", caller, b.name, w.Code, w.Body.String(), want.Body.String())
					}
					got, ref := w.Header().Clone(), want.Header().Clone()
					got.Del("X-Request-Id")
					ref.Del("X-Request-Id")
					if !reflect.DeepEqual(got, ref) {
						t.Errorf("%s, %s body: headers %v, want %v", caller, b.name, got, ref)
					}
				}
			}
			if len(store.audits) != 0 {
				t.Errorf("refusals were audited: %+v", store.audits)
			}
		})
	}
}

// The answer of a reclaim or release echoes the call's reason (a field of the published
// response), the replay included; without one it is absent.
func TestCapacityAnswersEchoTheReason(t *testing.T) {
	h, _ := newRealHandler(t)
	tests := []struct {
		name, path, body, key, want string
	}{
		{"reclaim", reclaimPath, `{"unitIds":["u2"],"reason":"training run"}`, "k-r", `"training run"`},
		{"reclaim replayed", reclaimPath, `{"unitIds":["u2"],"reason":"training run"}`, "k-r", `"training run"`},
		{"reclaim dry run", reclaimPath, `{"unitIds":["u3"],"dryRun":true,"reason":"what if"}`, "", `"what if"`},
		{"release", releasePath, `{"unitIds":["u1"],"reason":"idle over the weekend"}`, "", `"idle over the weekend"`},
		{"reclaim without a reason", reclaimPath, `{"unitIds":["u3"]}`, "", ""},
	}
	for _, tt := range tests {
		q := req{method: http.MethodPost, path: tt.path, body: tt.body}
		if tt.key != "" {
			q.header = map[string]string{"Idempotency-Key": tt.key}
		}
		w := q.do(t, h)
		if w.Code != http.StatusOK {
			t.Fatalf("%s = %d: %s", tt.name, w.Code, w.Body.String())
		}
		if got := string(jsonObject(t, w)["reason"]); got != tt.want {
			t.Errorf("%s: reason = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestOperationViews(t *testing.T) {
	at := now
	full := &capacity.OperationView{Operation: capacity.Operation{
		ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpFailed,
		VMIDs: []string{"vm-b", "vm-a"}, UnitIDs: []string{"u1"},
		ExecutionARN: "arn:aws:states:eu-west-1:123456789012:execution:t:rcl_1",
		Outcomes: map[string]capacity.VMOutcome{
			"vm-a": {Outcome: capacity.OutcomeFailed, Error: "https://10.0.0.9:8443 refused", At: at},
		},
		CreatedAt: t0, UpdatedAt: at,
	}}
	redacted := &capacity.OperationView{
		Operation: capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpFailed,
			UnitIDs: []string{"u1"}, CreatedAt: t0, UpdatedAt: at},
		Redacted: true, Counts: capacity.OutcomeCounts{Pending: 1, Failed: 1},
	}
	path := reservationPath + "/reclaims/rcl_1"
	// The whole view, for who may move the reservation's capacity: every VM and its outcome.
	w := req{method: http.MethodGet, path: path}.do(t, newHandler(&fakeService{op: full}))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	m := jsonObject(t, w)
	for name, want := range map[string]string{
		"vms":          `[{"vmId":"vm-a","outcome":"failed","error":"https://10.0.0.9:8443 refused","at":"2026-11-02T00:00:00Z"},{"vmId":"vm-b","outcome":"pending"}]`,
		"executionArn": `"arn:aws:states:eu-west-1:123456789012:execution:t:rcl_1"`,
		"state":        `"failed"`,
	} {
		if got := string(m[name]); got != want {
			t.Errorf("whole view: %s = %s, want %s", name, got, want)
		}
	}
	assertAbsent(t, m, "vmCounts")

	// The audience's view, exactly: counts, no VM ids, errors or execution.
	w = req{method: http.MethodGet, path: path}.do(t, newHandler(&fakeService{op: redacted}))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	want := `{"id":"rcl_1","nodeId":"n1","reservationId":"r1","state":"failed","unitIds":["u1"],` +
		`"vmCounts":{"pending":1,"terminated":0,"alreadyGone":0,"failed":1},"createdAt":"2026-11-01T00:00:00Z","updatedAt":"2026-11-02T00:00:00Z"}`
	if got := strings.TrimSpace(w.Body.String()); got != want {
		t.Errorf("redacted view\n%s\nwant\n%s", got, want)
	}
}
