package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

func TestDryRunThenReclaim(t *testing.T) {
	node := newNode(t, nil)
	body := map[string]any{"unitIds": []string{"gpu-2", "gpu-3", "gpu-0"}, "reason": "training run", "dryRun": true}

	before := partition(t, node)
	dry := call(t, http.MethodPost, reclaimPath(node), keyOwner, body)
	if dry.Status != http.StatusOK {
		t.Fatalf("dry run: %d %s", dry.Status, dry.Body)
	}
	d := dry.json(t)
	if !slices.Equal(strs(d["wouldTerminate"]), []string{"vm-spot-1", "vm-spot-2"}) || !slices.Equal(strs(d["wouldSkip"]), []string{"vm-res-1"}) {
		t.Fatalf("dry run answer: %s", dry.Body)
	}
	if _, ok := d["terminated"]; ok {
		t.Error("a dry run must not report terminated")
	}
	assertUnchanged(t, node, before)

	body["dryRun"] = false
	real := call(t, http.MethodPost, reclaimPath(node), keyManager, body)
	if real.Status != http.StatusOK {
		t.Fatalf("reclaim: %d %s", real.Status, real.Body)
	}
	r := real.json(t)
	if !slices.Equal(strs(r["terminated"]), strs(d["wouldTerminate"])) || !slices.Equal(strs(r["skipped"]), strs(d["wouldSkip"])) {
		t.Fatalf("reclaim answered differently from its dry run: %s vs %s", real.Body, dry.Body)
	}
	if !slices.Equal(strs(r["releasedUnitIds"]), []string{"gpu-4", "gpu-5"}) || r["reclaimId"] == "" || r["id"] != "res-1" || r["status"] != "active" {
		t.Fatalf("reclaim answer: %s", real.Body)
	}

	st := loadNode(t, node)
	if got := st.Reservation("res-1").ReleasedUnitIDs; !slices.Equal(got, []string{"gpu-4", "gpu-5"}) {
		t.Errorf("stored releasedUnitIds = %v", got)
	}
	for _, vm := range st.VMs {
		want := capacity.VMRunning
		if vm.ID == "vm-spot-1" || vm.ID == "vm-spot-2" {
			want = capacity.VMTerminating
		}
		if vm.State != want || (want == capacity.VMTerminating && vm.ReclaimID != r["reclaimId"]) {
			t.Errorf("VM %s is %s for %q, want %s", vm.ID, vm.State, vm.ReclaimID, want)
		}
	}
	for _, v := range capacity.Violations(st, st.Reservation("res-1").UpdatedAt) {
		t.Error(v)
	}
	if n := len(auditOf(t, node)); n != 2 {
		t.Errorf("audit records = %d, want 2 (dry run and reclaim)", n)
	}

	// Retrying the same reclaim succeeds and evicts nothing new.
	again := call(t, http.MethodPost, reclaimPath(node), keyOwner, body)
	if again.Status != http.StatusOK || len(strs(again.json(t)["terminated"])) != 0 {
		t.Fatalf("retry: %d %s", again.Status, again.Body)
	}
}

func TestRefusalsChangeNothing(t *testing.T) {
	inactive := newNode(t, func(s *dynamo.Seed) { s.Reservations[0].Status = capacity.StatusNeedsReview })
	reclaimBody := map[string]any{"unitIds": []string{"gpu-2"}}
	tests := []struct {
		name        string
		node        string // "" = a fresh demo node
		method      string
		path        func(node string) string
		key         string
		body        any
		contentType string
		status      int
		code        string
	}{
		{"no key", "", "POST", reclaimPath, "", reclaimBody, "", 401, "unauthenticated"},
		{"unknown key", "", "POST", reclaimPath, "ocap_nope0000000000000000000000000000000000000002bmv86", reclaimBody, "", 401, "unauthenticated"},
		{"junk key", "", "POST", reclaimPath, "ocap_nope0000000000000000000000000000000000000002bmv8X", reclaimBody, "", 401, "unauthenticated"},
		{"retired ork_ key", "", "POST", reclaimPath, "ork_demo_owner", reclaimBody, "", 401, "unauthenticated"},
		{"key without reservation.capacity", "", "POST", reclaimPath, keyReadOnly, reclaimBody, "", 404, "not_found"},
		{"audience only", "", "POST", reclaimPath, keyAudience, reclaimBody, "", 403, "forbidden"},
		{"reservation needs review", inactive, "POST", reclaimPath, keyOwner, reclaimBody, "", 409, "reservation_not_active"},
		{"unit outside the reservation", "", "POST", reclaimPath, keyOwner, map[string]any{"unitIds": []string{"gpu-2", "gpu-7"}}, "", 422, "units_not_reserved"},
		{"typo in dryRun", "", "POST", reclaimPath, keyOwner, `{"unitIds":["gpu-2"],"dryrun":true}`, "", 400, "malformed_request"},
		{"wrong type", "", "POST", reclaimPath, keyOwner, `{"unitIds":"gpu-2"}`, "", 400, "malformed_request"},
		{"malformed JSON", "", "POST", reclaimPath, keyOwner, `{"unitIds":[`, "", 400, "malformed_request"},
		{"no unitIds", "", "POST", reclaimPath, keyOwner, `{"dryRun":false}`, "", 422, "invalid_request"},
		{"body over 64 KiB", "", "POST", reclaimPath, keyOwner, `{"reason":"` + strings.Repeat("x", 70<<10) + `"}`, "", 413, "body_too_large"},
		{"not JSON", "", "POST", reclaimPath, keyOwner, "unitIds=gpu-2", "text/plain", 415, "unsupported_media_type"},
		{"null dryRun", "", "POST", reclaimPath, keyOwner, `{"unitIds":["gpu-2"],"dryRun":null}`, "", 400, "malformed_request"},
		{"no reservation.capacity, body not JSON", "", "POST", reclaimPath, keyReadOnly, "unitIds=gpu-2", "text/plain", 404, "not_found"},
		{"2 KB reclaim id", "", "GET", func(node string) string {
			return "/v1/nodes/" + node + "/reservations/res-1/reclaims/" + strings.Repeat("x", 2048)
		}, keyOwner, nil, "", 404, "not_found"},
		{"wrong method", "", "GET", reclaimPath, keyOwner, nil, "", 405, "method_not_allowed"},
		{"release of a unit in use", "", "POST", releasePath, keyOwner, map[string]any{"unitIds": []string{"gpu-0"}}, "", 409, "units_in_use"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := tt.node
			if node == "" {
				node = newNode(t, nil)
			}
			before := partition(t, node)
			var header []string
			if tt.contentType != "" {
				header = []string{"Content-Type", tt.contentType}
			}
			resp := call(t, tt.method, tt.path(node), tt.key, tt.body, header...)
			if resp.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.Status, tt.status, resp.Body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q, want application/problem+json", ct)
			}
			p := resp.json(t)
			if p["code"] != tt.code || p["status"] != float64(tt.status) || p["title"] == "" || p["detail"] == "" || p["type"] == "" {
				t.Errorf("problem = %s, want code %s", resp.Body, tt.code)
			}
			if tt.status == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without WWW-Authenticate: Bearer")
			}
			if tt.status == 405 && resp.Header.Get("Allow") != "POST" {
				t.Errorf("405 with Allow %q", resp.Header.Get("Allow"))
			}
			assertUnchanged(t, node, before)
		})
	}
}

func TestNotFoundLeaksNothing(t *testing.T) {
	node := newNode(t, nil)
	body := map[string]any{"unitIds": []string{"gpu-2"}}
	noPermission := call(t, "POST", reclaimPath(node), keyReadOnly, body)
	noReservation := call(t, "POST", "/v1/nodes/"+node+"/reservations/res-404/reclaim", keyOwner, body)
	noNode := call(t, "POST", "/v1/nodes/node-404/reservations/res-1/reclaim", keyOwner, body)
	for _, r := range []response{noReservation, noNode} {
		if r.Status != 404 || string(r.Body) != string(noPermission.Body) {
			t.Errorf("404 bodies differ: %s vs %s", r.Body, noPermission.Body)
		}
		for _, h := range []string{"Content-Type", "Cache-Control", "Www-Authenticate", "Allow"} {
			if r.Header.Get(h) != noPermission.Header.Get(h) {
				t.Errorf("header %s differs: %q vs %q", h, r.Header.Get(h), noPermission.Header.Get(h))
			}
		}
	}
}

func TestIdempotencyKeyThroughTheAPI(t *testing.T) {
	node := newNode(t, nil)
	body := map[string]any{"unitIds": []string{"gpu-2"}}
	first := call(t, "POST", reclaimPath(node), keyOwner, body, "Idempotency-Key", "e2e-key-1")
	if first.Status != 200 {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	awaitOperation(t, node, first.json(t)["reclaimId"].(string), 30*time.Second) // its workflow writes too
	state := partition(t, node)
	second := call(t, "POST", reclaimPath(node), keyOwner, body, "Idempotency-Key", "e2e-key-1")
	if second.Status != 200 || string(second.Body) != string(first.Body) || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %q %s, want the first answer %s", second.Status, second.Header.Get("Idempotent-Replayed"), second.Body, first.Body)
	}
	assertUnchanged(t, node, state)
	reused := call(t, "POST", reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-3"}}, "Idempotency-Key", "e2e-key-1")
	if reused.Status != 422 || reused.json(t)["code"] != "idempotency_key_reused" {
		t.Fatalf("reuse: %d %s", reused.Status, reused.Body)
	}
	assertUnchanged(t, node, state)
}

func TestGetReservationVisibility(t *testing.T) {
	node := newNode(t, nil)
	path := "/v1/nodes/" + node + "/reservations/res-1"
	for key, want := range map[string]int{keyOperator: 200, keyOwner: 200, keyManager: 200, keyAudience: 200, keyReadOnly: 200} {
		if r := call(t, "GET", path, key, nil); r.Status != want {
			t.Errorf("%s: %d %s", key, r.Status, r.Body)
		} else if r.json(t)["id"] != "res-1" {
			t.Errorf("%s: %s", key, r.Body)
		}
	}
	other := newNode(t, func(s *dynamo.Seed) {
		s.Nodes[0].OwnerOrgID = "org-else"
		s.Reservations[0].AllowedOrgIDs = []string{"org-else"}
		s.Reservations[0].ManagingOrgIDs = nil
	})
	if r := call(t, "GET", "/v1/nodes/"+other+"/reservations/res-1", keyAudience, nil); r.Status != 404 {
		t.Errorf("stranger: %d %s", r.Status, r.Body)
	}
}

func TestPlacementThroughTheAPI(t *testing.T) {
	node := newNode(t, nil)
	place := func(key, vm, tier string, units ...string) response {
		return call(t, "POST", "/v1/nodes/"+node+"/vms", key, map[string]any{"vmId": vm, "orgId": "org-buyer", "tier": tier, "unitIds": units})
	}
	if r := place(keyOperator, "vm-spot-9", "spot", "gpu-4"); r.Status != 201 || r.json(t)["state"] != "running" {
		t.Fatalf("spot on a released unit: %d %s", r.Status, r.Body)
	}
	before := partition(t, node)
	for _, tc := range []struct {
		name, key, vm, tier, unit string
		status                    int
	}{
		{"spot on exclusive capacity", keyOperator, "vm-x1", "spot", "gpu-1", 409},
		{"spot on a busy unit", keyOperator, "vm-x2", "spot", "gpu-4", 409},
		{"VM id taken", keyOperator, "vm-spot-9", "spot", "gpu-5", 409},
		{"unknown unit", keyOperator, "vm-x3", "spot", "gpu-99", 422},
		{"bad tier", keyOperator, "vm-x4", "preemptible", "gpu-5", 422},
		{"not the scheduler", keyOwner, "vm-x5", "spot", "gpu-5", 404},
	} {
		if r := place(tc.key, tc.vm, tc.tier, tc.unit); r.Status != tc.status {
			t.Errorf("%s: %d %s", tc.name, r.Status, r.Body)
		}
	}
	assertUnchanged(t, node, before)
}
