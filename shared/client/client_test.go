package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/client"
)

// seen is one request as the test server got it.
type seen struct {
	Method, Path, Query string
	Header              http.Header
	Body                map[string]any
}

// server answers every request with status, header and body, and records it.
func server(t *testing.T, status int, header map[string]string, body string) (*client.Client, *seen) {
	t.Helper()
	got := &seen{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Method, got.Path, got.Query, got.Header = r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone()
		raw, _ := io.ReadAll(r.Body)
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &got.Body); err != nil {
				t.Errorf("request body is not a JSON object: %s", raw)
			}
		}
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(ts.Close)
	return client.New(ts.URL+"/dev/", "ocap_test", ts.Client()), got
}

func TestRoutes(t *testing.T) {
	ctx := context.Background()
	opt := client.Options{IdempotencyKey: "k-1"}
	tests := []struct {
		name     string
		call     func(c *client.Client) (any, *client.Meta, error)
		method   string
		path     string
		query    string
		body     map[string]any // nil: no body
		idemKey  string
		answer   string
		wantJSON string // the decoded answer, re-encoded
	}{
		{"put node", func(c *client.Client) (any, *client.Meta, error) {
			return c.PutNode(ctx, "node-1", client.NodeRequest{OwnerOrgID: "org-o", UnitIDs: []string{"gpu-0"}, AgentEndpoint: "https://a"}, opt)
		}, "PUT", "/dev/v1/nodes/node-1", "",
			map[string]any{"ownerOrgId": "org-o", "unitIds": []any{"gpu-0"}, "agentEndpoint": "https://a"}, "k-1",
			`{"node":{"nodeId":"node-1","ownerOrgId":"org-o","unitIds":["gpu-0"],"agentEndpoint":"https://a","topologyGen":1,"version":1,"auditHead":{"seq":1,"hash":"ab"}},"created":true,"agentKey":"a2V5"}`,
			`{"node":{"nodeId":"node-1","ownerOrgId":"org-o","unitIds":["gpu-0"],"agentEndpoint":"https://a","topologyGen":1,"version":1,"auditHead":{"seq":1,"hash":"ab"},"agentKeyGen":0},"created":true,"agentKey":"a2V5"}`},
		{"get node", func(c *client.Client) (any, *client.Meta, error) { return c.GetNode(ctx, "node-1") },
			"GET", "/dev/v1/nodes/node-1", "", nil, "",
			`{"node":{"nodeId":"node-1","ownerOrgId":"o","unitIds":[],"agentEndpoint":"","topologyGen":2,"version":3,"auditHead":{"seq":0,"hash":""}}}`,
			`{"node":{"nodeId":"node-1","ownerOrgId":"o","unitIds":[],"agentEndpoint":"","topologyGen":2,"version":3,"auditHead":{"seq":0,"hash":""},"agentKeyGen":0}}`},
		{"set topology", func(c *client.Client) (any, *client.Meta, error) {
			return c.SetTopology(ctx, "node-1", client.TopologyRequest{UnitIDs: []string{"gpu-1"}, Reason: "rma", ExpectedTopologyGen: 1}, opt)
		}, "PUT", "/dev/v1/nodes/node-1/topology", "", map[string]any{"unitIds": []any{"gpu-1"}, "reason": "rma", "expectedTopologyGen": float64(1)}, "k-1",
			`{"node":{"nodeId":"node-1","ownerOrgId":"o","unitIds":["gpu-1"],"agentEndpoint":"","topologyGen":2,"version":3,"auditHead":{"seq":2,"hash":"x"}},"changed":true,"addedUnitIds":["gpu-1"],"removedUnitIds":["gpu-0"],"needsReview":["res-1"],"vmsOnRemovedUnits":[]}`,
			`{"node":{"nodeId":"node-1","ownerOrgId":"o","unitIds":["gpu-1"],"agentEndpoint":"","topologyGen":2,"version":3,"auditHead":{"seq":2,"hash":"x"},"agentKeyGen":0},"changed":true,"addedUnitIds":["gpu-1"],"removedUnitIds":["gpu-0"],"needsReview":["res-1"],"vmsOnRemovedUnits":[]}`},
		{"create reservation leaves out what is not set", func(c *client.Client) (any, *client.Meta, error) {
			return c.CreateReservation(ctx, "node-1", client.ReservationRequest{StartsAt: "2026-01-01T00:00:00Z", AllowedOrgIDs: []string{"a"}, ManagingOrgIDs: []string{}, ReservedUnitIDs: []string{"gpu-0"}}, client.Options{})
		}, "POST", "/dev/v1/nodes/node-1/reservations", "",
			map[string]any{"startsAt": "2026-01-01T00:00:00Z", "allowedOrgIds": []any{"a"}, "managingOrgIds": []any{}, "reservedUnitIds": []any{"gpu-0"}}, "",
			`{"reservation":{"id":"res-x","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-0"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":1}}`,
			`{"reservation":{"id":"res-x","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-0"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":1}}`},
		{"list reservations with a page", func(c *client.Client) (any, *client.Meta, error) {
			return c.ListReservations(ctx, "node-1", client.Page{Limit: 10, Cursor: "abc"})
		}, "GET", "/dev/v1/nodes/node-1/reservations", "cursor=abc&limit=10", nil, "",
			`{"reservations":[],"nextCursor":"def"}`, `{"reservations":[],"nextCursor":"def"}`},
		{"cancel with an empty reason sends {}", func(c *client.Client) (any, *client.Meta, error) {
			return c.CancelReservation(ctx, "node-1", "res-1", "", opt)
		}, "POST", "/dev/v1/nodes/node-1/reservations/res-1/cancel", "", map[string]any{}, "k-1",
			`{"reservation":{"id":"res-1","nodeId":"node-1","allowedOrgIds":[],"reservedUnitIds":[],"startsAt":"","status":"cancelled","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":1},"vmsOnUnits":[]}`,
			`{"reservation":{"id":"res-1","nodeId":"node-1","allowedOrgIds":[],"reservedUnitIds":[],"startsAt":"","status":"cancelled","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":1},"vmsOnUnits":[]}`},
		{"reaffirm", func(c *client.Client) (any, *client.Meta, error) {
			return c.ReaffirmReservation(ctx, "node-1", "res-1", "checked", client.Options{})
		}, "POST", "/dev/v1/nodes/node-1/reservations/res-1/reaffirm", "", map[string]any{"reason": "checked"}, "",
			`{"reservation":{"id":"res-1","nodeId":"node-1","allowedOrgIds":[],"reservedUnitIds":[],"startsAt":"","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":2}}`,
			`{"reservation":{"id":"res-1","nodeId":"node-1","allowedOrgIds":[],"reservedUnitIds":[],"startsAt":"","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":2}}`},
		{"node audit", func(c *client.Client) (any, *client.Meta, error) {
			return c.ListNodeAudit(ctx, "node-1", "", client.Page{Limit: 100})
		},
			"GET", "/dev/v1/nodes/node-1/audit", "limit=100", nil, "",
			`{"head":{"seq":1,"hash":"h"},"records":[]}`, `{"head":{"seq":1,"hash":"h"},"records":[]}`},
		{"reservation audit", func(c *client.Client) (any, *client.Meta, error) {
			return c.ListReservationAudit(ctx, "node-1", "res-1", "", client.Page{})
		}, "GET", "/dev/v1/nodes/node-1/reservations/res-1/audit", "", nil, "", `{"records":[]}`, `{"records":[]}`},
		{"key audit", func(c *client.Client) (any, *client.Meta, error) { return c.ListKeyAudit(ctx, client.Page{}) },
			"GET", "/dev/v1/keys/audit", "", nil, "", `{"head":{"seq":0,"hash":""},"records":[]}`, `{"head":{"seq":0,"hash":""},"records":[]}`},
		{"create key", func(c *client.Client) (any, *client.Meta, error) {
			return c.CreateKey(ctx, client.KeyRequest{OrgID: "org-a", Permissions: []string{"reservation.read"}}, opt)
		}, "POST", "/dev/v1/keys", "", map[string]any{"orgId": "org-a", "permissions": []any{"reservation.read"}}, "k-1",
			`{"key":{"keyId":"key-1","orgId":"org-a","permissions":["reservation.read"],"operator":false,"createdAt":"2026-01-01T00:00:00Z","revoked":false},"secret":"ocap_x"}`,
			`{"key":{"keyId":"key-1","orgId":"org-a","permissions":["reservation.read"],"operator":false,"createdAt":"2026-01-01T00:00:00Z","revoked":false},"secret":"ocap_x"}`},
		{"list keys", func(c *client.Client) (any, *client.Meta, error) { return c.ListKeys(ctx, client.Page{}) },
			"GET", "/dev/v1/keys", "", nil, "", `{"keys":[]}`, `{"keys":[]}`},
		{"revoke key escapes the id", func(c *client.Client) (any, *client.Meta, error) {
			return c.RevokeKey(ctx, "key/1", "", client.Options{})
		},
			"POST", "/dev/v1/keys/key%2F1/revoke", "", map[string]any{}, "",
			`{"key":{"keyId":"key/1","orgId":"o","permissions":[],"operator":false,"revoked":true}}`,
			`{"key":{"keyId":"key/1","orgId":"o","permissions":[],"operator":false,"revoked":true}}`},
		{"revoke key with a reason", func(c *client.Client) (any, *client.Meta, error) {
			return c.RevokeKey(ctx, "key-1", "leaked", client.Options{})
		},
			"POST", "/dev/v1/keys/key-1/revoke", "", map[string]any{"reason": "leaked"}, "",
			`{"key":{"keyId":"key-1","orgId":"o","permissions":[],"operator":false,"revoked":true}}`,
			`{"key":{"keyId":"key-1","orgId":"o","permissions":[],"operator":false,"revoked":true}}`},
		{"get reclaim operation", func(c *client.Client) (any, *client.Meta, error) { return c.GetReclaim(ctx, "node-1", "res-1", "op-1") },
			"GET", "/dev/v1/nodes/node-1/reservations/res-1/reclaims/op-1", "", nil, "",
			`{"id":"op-1","nodeId":"node-1","reservationId":"res-1","state":"completed","unitIds":["gpu-2"],"vms":[{"vmId":"vm-1","outcome":"terminated"}],"createdAt":"t"}`,
			`{"id":"op-1","nodeId":"node-1","reservationId":"res-1","state":"completed","unitIds":["gpu-2"],"vms":[{"vmId":"vm-1","outcome":"terminated"}],"createdAt":"t"}`},
		{"release", func(c *client.Client) (any, *client.Meta, error) {
			return c.Release(ctx, "node-1", "res-1", client.ReleaseRequest{UnitIDs: []string{"gpu-1"}}, client.Options{})
		}, "POST", "/dev/v1/nodes/node-1/reservations/res-1/release", "", map[string]any{"unitIds": []any{"gpu-1"}}, "",
			`{"id":"res-1","nodeId":"node-1","allowedOrgIds":[],"reservedUnitIds":["gpu-1"],"startsAt":"","status":"active","managingOrgIds":[],"releasedUnitIds":["gpu-1"],"topologyGen":1,"terminated":[],"skipped":[]}`,
			`{"id":"res-1","nodeId":"node-1","allowedOrgIds":[],"reservedUnitIds":["gpu-1"],"startsAt":"","status":"active","managingOrgIds":[],"releasedUnitIds":["gpu-1"],"topologyGen":1,"terminated":[],"skipped":[]}`},
		{"place VM", func(c *client.Client) (any, *client.Meta, error) {
			return c.PlaceVM(ctx, "node-1", client.PlaceRequest{VMID: "vm-1", OrgID: "b", Tier: "spot", UnitIDs: []string{"gpu-2"}}, opt)
		}, "POST", "/dev/v1/nodes/node-1/vms", "", map[string]any{"vmId": "vm-1", "orgId": "b", "tier": "spot", "unitIds": []any{"gpu-2"}}, "k-1",
			`{"id":"vm-1","nodeId":"node-1","orgId":"b","tier":"spot","unitIds":["gpu-2"],"state":"running","createdAt":"t"}`,
			`{"id":"vm-1","nodeId":"node-1","orgId":"b","tier":"spot","unitIds":["gpu-2"],"state":"running","createdAt":"t"}`},
		{"schedule a reclaim", func(c *client.Client) (any, *client.Meta, error) {
			return c.ScheduleReclaim(ctx, "node-1", "res-1", client.ScheduleRequest{UnitIDs: []string{"gpu-2"}, At: "2026-12-24T02:00:00Z", GraceSeconds: 30}, opt)
		}, "POST", "/dev/v1/nodes/node-1/reservations/res-1/reclaim", "",
			map[string]any{"unitIds": []any{"gpu-2"}, "at": "2026-12-24T02:00:00Z", "graceSeconds": float64(30)}, "k-1", scheduledAnswer, scheduledAnswer},
		{"get a scheduled reclaim", func(c *client.Client) (any, *client.Meta, error) {
			return c.GetScheduledReclaim(ctx, "node-1", "res-1", "srcl_1")
		}, "GET", "/dev/v1/nodes/node-1/reservations/res-1/scheduled-reclaims/srcl_1", "", nil, "", scheduledAnswer, scheduledAnswer},
		{"cancel a scheduled reclaim escapes the id", func(c *client.Client) (any, *client.Meta, error) {
			return c.CancelScheduledReclaim(ctx, "node-1", "res-1", "srcl/1")
		}, "DELETE", "/dev/v1/nodes/node-1/reservations/res-1/scheduled-reclaims/srcl%2F1", "", nil, "", scheduledAnswer, scheduledAnswer},
		{"retry a reclaim", func(c *client.Client) (any, *client.Meta, error) {
			return c.RetryReclaim(ctx, "node-1", "res-1", "op-1", opt)
		}, "POST", "/dev/v1/nodes/node-1/reservations/res-1/reclaims/op-1/retry", "", nil, "k-1", operationAnswer, operationAnswer},
		{"force-end a VM", func(c *client.Client) (any, *client.Meta, error) {
			return c.ForceEndVM(ctx, "node-1", "res-1", "op-1", "vm-1", "node wiped", opt)
		}, "POST", "/dev/v1/nodes/node-1/reservations/res-1/reclaims/op-1/vms/vm-1/force-end", "", map[string]any{"reason": "node wiped"}, "k-1", operationAnswer, operationAnswer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, got := server(t, http.StatusOK, map[string]string{"X-Request-Id": "req-1"}, tt.answer)
			out, meta, err := tt.call(c)
			if err != nil {
				t.Fatal(err)
			}
			if got.Method != tt.method || got.Path != tt.path || got.Query != tt.query {
				t.Errorf("sent %s %s?%s, want %s %s?%s", got.Method, got.Path, got.Query, tt.method, tt.path, tt.query)
			}
			if !reflect.DeepEqual(got.Body, tt.body) {
				t.Errorf("body %v, want %v", got.Body, tt.body)
			}
			if got.Header.Get("Authorization") != "Bearer ocap_test" || got.Header.Get("Idempotency-Key") != tt.idemKey {
				t.Errorf("headers %v", got.Header)
			}
			if (tt.body != nil) != (got.Header.Get("Content-Type") == "application/json") {
				t.Errorf("Content-Type %q with body %v", got.Header.Get("Content-Type"), tt.body)
			}
			enc, _ := json.Marshal(out)
			if string(enc) != tt.wantJSON {
				t.Errorf("decoded answer\n %s\nwant\n %s", enc, tt.wantJSON)
			}
			if string(meta.Body) != tt.answer || meta.RequestID != "req-1" || meta.Status != 200 {
				t.Errorf("meta %+v", meta)
			}
		})
	}
}

const (
	scheduledAnswer = `{"id":"srcl_1","nodeId":"node-1","reservationId":"res-1","unitIds":["gpu-2"],"reason":"","graceSeconds":30,"at":"2026-12-24T02:00:00Z","state":"scheduled","createdAt":"t","createdByOrgId":"o"}`
	operationAnswer = `{"id":"op-1","nodeId":"node-1","reservationId":"res-1","state":"pending-start","unitIds":["gpu-2"],"vms":[{"vmId":"vm-1","outcome":"pending"}],"attempt":2,"createdAt":"t"}`
)

func TestReclaimHeaders(t *testing.T) {
	c, got := server(t, http.StatusOK, map[string]string{"ETag": `"abc"`, "Idempotent-Replayed": "true"},
		`{"id":"res-1","nodeId":"n","allowedOrgIds":[],"reservedUnitIds":[],"startsAt":"","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":1,"wouldTerminate":["vm-1"],"wouldSkip":[],"planEtag":"abc"}`)
	out, meta, err := c.Reclaim(context.Background(), "n", "res-1", client.ReclaimRequest{UnitIDs: []string{"gpu-1"}, DryRun: true},
		client.Options{IfMatch: `"old"`, IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Header.Get("If-Match") != `"old"` || got.Header.Get("Idempotency-Key") != "k" {
		t.Errorf("headers %v", got.Header)
	}
	if !reflect.DeepEqual(got.Body, map[string]any{"unitIds": []any{"gpu-1"}, "dryRun": true}) {
		t.Errorf("body %v (an unset grace or reason must be left out)", got.Body)
	}
	if meta.ETag != `"abc"` || !meta.Replayed || out.PlanETag != "abc" || len(*out.WouldTerminate) != 1 {
		t.Errorf("answer %+v meta %+v", out, meta)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		header    map[string]string
		body      string
		want      client.Error
		wantPlan  string // the plan's ETag
		wantError string
	}{
		{"problem", 422, nil,
			`{"type":"x","title":"Unprocessable Entity","status":422,"detail":"units are not reserved","code":"units_not_reserved","unitIds":["gpu-7"]}`,
			client.Error{Status: 422, Code: "units_not_reserved", Detail: "units are not reserved", UnitIDs: []string{"gpu-7"}}, "",
			"422 units_not_reserved: units are not reserved (units gpu-7)"},
		{"plan changed carries the new plan", 412, map[string]string{"ETag": `"new"`},
			`{"status":412,"detail":"the plan changed","code":"plan_changed","plan":{"id":"res-1","nodeId":"n","allowedOrgIds":[],"reservedUnitIds":[],"startsAt":"","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":2,"wouldTerminate":[],"wouldSkip":[],"planEtag":"new"}}`,
			client.Error{Status: 412, Code: "plan_changed", Detail: "the plan changed", ETag: `"new"`}, "new",
			"412 plan_changed: the plan changed"},
		{"not a problem document", 502, nil, `Bad Gateway from somewhere`,
			client.Error{Status: 502, Detail: "Bad Gateway from somewhere"}, "", "502 Bad Gateway: Bad Gateway from somewhere"},
		{"empty body", 403, nil, ``, client.Error{Status: 403}, "", "403 Forbidden"},
		{"API Gateway: no such route", 403, nil, `{"message":"Missing Authentication Token"}`,
			client.Error{Status: 403, Detail: "Missing Authentication Token"}, "",
			"403 Forbidden: Missing Authentication Token (API Gateway has no such route: check the endpoint URL and its stage, e.g. https://<api>.execute-api.<region>.amazonaws.com/<stage>/)"},
		{"API Gateway: throttled", 429, nil, `{"message":"Too Many Requests"}`,
			client.Error{Status: 429, Detail: "Too Many Requests"}, "", "429 Too Many Requests: Too Many Requests"},
		{"API Gateway: timeout", 504, nil, `{"message": "Endpoint request timed out"}`,
			client.Error{Status: 504, Detail: "Endpoint request timed out"}, "", "504 Gateway Timeout: Endpoint request timed out"},
		{"JSON without code, detail or message", 500, nil, `{"error":"boom"}`,
			client.Error{Status: 500, Detail: `{"error":"boom"}`}, "", `500 Internal Server Error: {"error":"boom"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := server(t, tt.status, tt.header, tt.body)
			_, _, err := c.GetReservation(context.Background(), "n", "res-1")
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not a *client.Error", err)
			}
			if e.Status != tt.want.Status || e.Code != tt.want.Code || e.Detail != tt.want.Detail ||
				!reflect.DeepEqual(e.UnitIDs, tt.want.UnitIDs) || e.ETag != tt.want.ETag || string(e.Body) != tt.body {
				t.Errorf("error %+v, want %+v", e, tt.want)
			}
			if (e.Plan == nil) != (tt.wantPlan == "") || (e.Plan != nil && e.Plan.PlanETag != tt.wantPlan) {
				t.Errorf("plan %+v, want ETag %q", e.Plan, tt.wantPlan)
			}
			if e.Error() != tt.wantError {
				t.Errorf("message %q, want %q", e.Error(), tt.wantError)
			}
			if tt.want.Code != "" && !client.IsCode(err, tt.want.Code) {
				t.Error("IsCode is false")
			}
		})
	}
}

func TestTransportAndDecodeErrors(t *testing.T) {
	c, _ := server(t, 200, nil, `{"id":`)
	if _, _, err := c.GetReservation(context.Background(), "n", "r"); err == nil || !strings.Contains(err.Error(), "decode 200 answer") {
		t.Errorf("truncated answer: %v", err)
	}
	var pe *client.Error
	dead := client.New("http://127.0.0.1:1", "k", nil)
	if _, _, err := dead.GetReservation(context.Background(), "n", "r"); err == nil || errors.As(err, &pe) {
		t.Errorf("no server: %v", err)
	}
	if _, _, err := client.New("", "k", nil).GetNode(context.Background(), "n"); err == nil {
		t.Error("no endpoint: no error")
	}
}

func TestFromGateway(t *testing.T) {
	tests := []struct {
		status int
		code   string
		want   bool
	}{
		{429, "", true}, {502, "", true}, {503, "", true}, {504, "", true},
		{503, "throttled", false}, {500, "", false}, {403, "", false}, {409, "concurrent_modification", false},
	}
	for _, tt := range tests {
		if got := (&client.Error{Status: tt.status, Code: tt.code}).FromGateway(); got != tt.want {
			t.Errorf("%d %q: %v, want %v", tt.status, tt.code, got, tt.want)
		}
	}
}

// TestEndpointWithOrWithoutTrailingSlash: the local stack prints its API URL without the
// trailing slash, cdk deploy --outputs-file writes it with one; both reach the same route.
func TestEndpointWithOrWithoutTrailingSlash(t *testing.T) {
	for name, suffix := range map[string]string{"without": "", "with": "/"} {
		t.Run(name, func(t *testing.T) {
			c, got := server(t, http.StatusOK, nil, `{}`)
			c.Endpoint = strings.TrimSuffix(c.Endpoint, "/dev/") + "/local/_user_request_" + suffix
			if _, _, err := c.GetReservation(context.Background(), "node-a", "res-1"); err != nil {
				t.Fatal(err)
			}
			if got.Path != "/local/_user_request_/v1/nodes/node-a/reservations/res-1" {
				t.Errorf("path = %q", got.Path)
			}
		})
	}
}
