package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/wire"
)

func TestParseExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		in, want string // want "" = none; "error" = an error
	}{
		{"", ""}, {"720h", "2026-01-31T00:00:00Z"}, {"2027-01-01T00:00:00+01:00", "2026-12-31T23:00:00Z"},
		{"-1h", "error"}, {"soon", "error"},
	}
	for _, tt := range tests {
		got, err := parseExpiry(tt.in, now)
		switch {
		case tt.want == "error":
			if err == nil {
				t.Errorf("%q: no error", tt.in)
			}
		case tt.want == "":
			if got != nil || err != nil {
				t.Errorf("%q: %v %v", tt.in, got, err)
			}
		case err != nil || got.Format(time.RFC3339) != tt.want:
			t.Errorf("%q: %v %v, want %s", tt.in, got, err, tt.want)
		}
	}
}

// TestTopologySetExpectedGen: --expected-gen reaches the body as expectedTopologyGen; without
// it the member is left out (any generation), and a refusal prints its code.
func TestTopologySetExpectedGen(t *testing.T) {
	var bodies []map[string]any
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || r.Method != http.MethodPut || r.URL.Path != "/dev/v1/nodes/node-1/topology" {
			t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
		}
		bodies = append(bodies, b)
		if b["expectedTopologyGen"] == float64(2) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"status":409,"code":"topology_changed","detail":"node node-1 is at topology generation 3"}`)
			return
		}
		_, _ = io.WriteString(w, `{"node":{"nodeId":"node-1","ownerOrgId":"o","unitIds":["gpu-0"],"agentEndpoint":"https://a","topologyGen":4,"version":5,"auditHead":{"seq":1,"hash":"h"}},"changed":true,"addedUnitIds":[],"removedUnitIds":["gpu-1"],"needsReview":[],"vmsOnRemovedUnits":[]}`)
	}))
	defer api.Close()
	for _, tt := range []struct {
		name string
		args []string
		code int
		want any // the body's expectedTopologyGen; nil: left out
		err  string
	}{
		{"given", []string{"--expected-gen", "3"}, 0, float64(3), ""},
		{"left out", nil, 0, nil, ""},
		{"stale", []string{"--expected-gen", "2"}, 1, float64(2), "409 topology_changed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bodies = nil
			got := runCLI(t, api, "", nil, append([]string{"topology", "set", "--node", "node-1", "--units", "gpu-0"}, tt.args...)...)
			if got.code != tt.code || !strings.Contains(got.err, tt.err) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", got.code, got.err, tt.code, tt.err)
			}
			if len(bodies) != 1 {
				t.Fatalf("bodies %v", bodies)
			}
			if v, ok := bodies[0]["expectedTopologyGen"]; v != tt.want || ok != (tt.want != nil) {
				t.Errorf("expectedTopologyGen %v (present %v), want %v", v, ok, tt.want)
			}
		})
	}
}

// TestScheduledList: scheduled list asks for the reservation's scheduled reclaims with the
// page flags and prints each with its state and how it ended.
func TestScheduledList(t *testing.T) {
	var asked string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = r.Method + " " + r.URL.RequestURI()
		_ = json.NewEncoder(w).Encode(wire.ScheduledPageJSON{ScheduledReclaims: []wire.ScheduledReclaimJSON{
			{ID: "srcl_1", At: "2026-01-01T00:00:00Z", State: "refused", UnitIDs: []string{"gpu-2"}, CreatedByOrgID: "org-owner",
				FiredAt: "2026-01-01T00:00:01Z", Code: "creator_key_invalid", Detail: "the API key key-1 that scheduled this reclaim was revoked"},
			{ID: "srcl_2", At: "2026-01-02T00:00:00Z", State: "scheduled", UnitIDs: []string{"gpu-2", "gpu-3"}, GraceSeconds: 30, CreatedByOrgID: "org-owner"},
		}, NextCursor: "c2"})
	}))
	defer api.Close()
	got := runCLI(t, api, "", nil, "scheduled", "list", "--node", "node-1", "--reservation", "res-1", "--limit", "2", "--cursor", "c1")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.err)
	}
	if want := "GET /dev/v1/nodes/node-1/reservations/res-1/scheduled-reclaims?cursor=c1&limit=2"; asked != want {
		t.Errorf("asked %s, want %s", asked, want)
	}
	for _, want := range []string{
		"srcl_1  2026-01-01T00:00:00Z  refused    gpu-2        0      org-owner   2026-01-01T00:00:01Z  creator_key_invalid: the API key key-1 that scheduled this reclaim was revoked",
		"srcl_2  2026-01-02T00:00:00Z  scheduled  gpu-2,gpu-3  30     org-owner   -",
		"c2",
	} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("stdout\n%s\nwant a line with\n%s", got.stdout, want)
		}
	}
}

// TestNodesEndOverlap: end-overlap posts the reason to the node's end-overlap route with an
// Idempotency-Key and prints until when the previous key was used.
func TestNodesEndOverlap(t *testing.T) {
	var got []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || r.Method != http.MethodPost || r.URL.Path != "/dev/v1/nodes/node-1/agent-key/end-overlap" {
			t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
		}
		reason, _ := b["reason"].(string)
		got = append(got, reason+" "+r.Header.Get("Idempotency-Key"))
		_, _ = io.WriteString(w, `{"nodeId":"node-1","agentKeyGen":3,"previousValidUntil":"2026-11-01T00:02:00Z"}`)
	}))
	defer api.Close()
	res := runCLI(t, api, "", nil, "nodes", "end-overlap", "--node", "node-1", "--reason", "old key leaked", "--idempotency-key", "e1")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.err)
	}
	for _, w := range []string{"agent key gen       3", "previous key until  2026-11-01T00:02:00Z"} {
		if !strings.Contains(res.stdout, w) {
			t.Errorf("output lacks %q:\n%s", w, res.stdout)
		}
	}
	if !slices.Equal(got, []string{"old key leaked e1"}) {
		t.Errorf("requests %q, want the reason and the Idempotency-Key", got)
	}
}

// TestNodesRotateKey: rotate-key posts the reason to the node's rotate route with an
// Idempotency-Key and prints the new key once; a replay prints that it was shown.
func TestNodesRotateKey(t *testing.T) {
	var got []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || r.Method != http.MethodPost || r.URL.Path != "/dev/v1/nodes/node-1/agent-key/rotate" {
			t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
		}
		reason, _ := b["reason"].(string) // left out when empty
		got = append(got, reason+" "+r.Header.Get("Idempotency-Key"))
		if r.Header.Get("Idempotency-Key") == "again" {
			_, _ = io.WriteString(w, `{"nodeId":"node-1","agentKeyGen":3,"secretShown":true,"previousValidUntil":"2026-11-01T00:10:00Z"}`)
			return
		}
		_, _ = io.WriteString(w, `{"nodeId":"node-1","agentKeyGen":3,"agentKey":"a2V5","previousValidUntil":"2026-11-01T00:10:00Z"}`)
	}))
	defer api.Close()
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"new key", []string{"--reason", "laptop lost", "--idempotency-key", "first"},
			[]string{"agent key gen       3", "previous key until  2026-11-01T00:10:00Z", "agent key (base64, shown once; install it on the node's agent now):  a2V5"}},
		{"replay", []string{"--idempotency-key", "again"}, []string{"the agent key was shown by the first call with this Idempotency-Key"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := runCLI(t, api, "", nil, append([]string{"nodes", "rotate-key", "--node", "node-1"}, tt.args...)...)
			if res.code != 0 {
				t.Fatalf("exit %d: %s", res.code, res.err)
			}
			for _, w := range tt.want {
				if !strings.Contains(res.stdout, w) {
					t.Errorf("output lacks %q:\n%s", w, res.stdout)
				}
			}
			if strings.Contains(res.stdout, "a2V5") != (tt.name == "new key") {
				t.Errorf("key shown: %v\n%s", strings.Contains(res.stdout, "a2V5"), res.stdout)
			}
		})
	}
	if want := []string{"laptop lost first", " again"}; !slices.Equal(got, want) {
		t.Errorf("requests %q, want %q", got, want)
	}
}

// keys create --rate-limit sends the key's own limit in the creation's body; without it the
// body has none (the environment's).
func TestKeysCreateRateLimit(t *testing.T) {
	for _, tt := range []struct {
		flag []string
		want any
	}{
		{[]string{"--rate-limit", "2.5/10"}, map[string]any{"perSecond": 2.5, "burst": float64(10)}},
		{nil, nil},
	} {
		var body map[string]any
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewDecoder(r.Body).Decode(&body)
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"key":{"keyId":"key-1","orgId":"o","permissions":["reservation.read"],"operator":false,"createdAt":"2026-01-01T00:00:00Z","revoked":false},"secret":"s"}`)
		}))
		args := append([]string{"keys", "create", "--org", "o", "--permissions", "reservation.read"}, tt.flag...)
		if got := runCLI(t, api, "", nil, args...); got.code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, got.code, got.err)
		}
		api.Close()
		if !reflect.DeepEqual(body["rateLimit"], tt.want) {
			t.Errorf("%v: body rateLimit %v, want %v", tt.flag, body["rateLimit"], tt.want)
		}
	}
}
