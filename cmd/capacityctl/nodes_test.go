package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/wire"
)

// notFound is the API's 404, as it answers a caller that may not see a node.
var notFound = answer{status: 404, header: map[string]string{"Content-Type": "application/problem+json"},
	body: `{"type":"https://docs.example/errors#not_found","title":"Not Found","status":404,"code":"not_found","detail":"no such node"}`}

const (
	// ownerUnits is a node of four units as its owner sees it: every state but terminating
	// and a VM on each of two units.
	ownerUnits = `{"nodeId":"node-1","topologyGen":3,"version":41,"units":[
		{"unitId":"gpu-0","state":"occupied","reservationId":"res-1","reservationMode":"exclusive","vm":{"vmId":"vm-res-1","orgId":"org-a","tier":"reserved","state":"running","since":"2026-12-03T17:55:00Z"}},
		{"unitId":"gpu-1","state":"exclusive","reservationId":"res-1","reservationMode":"exclusive"},
		{"unitId":"gpu-2","state":"spot","reservationId":"res-1","reservationMode":"released","vm":{"vmId":"vm-spot-1","orgId":"org-b","tier":"spot","state":"running","since":"2026-12-03T19:59:15Z"}},
		{"unitId":"gpu-3","state":"released","reservationId":"res-1","reservationMode":"released"},
		{"unitId":"gpu-4","state":"unreserved"}],
		"reservations":[{"id":"res-1","status":"active","access":"manage","reservedUnitIds":["gpu-0","gpu-1","gpu-2","gpu-3"],"releasedUnitIds":["gpu-2","gpu-3"]}]}`
	// audienceUnits is the same node as an audience org sees it: its reservation's units, the
	// spot VM of another org without its id, a VM being terminated.
	audienceUnits = `{"nodeId":"node-1","topologyGen":3,"version":42,"units":[
		{"unitId":"gpu-1","state":"exclusive","reservationId":"res-1","reservationMode":"exclusive"},
		{"unitId":"gpu-2","state":"terminating","reservationId":"res-1","reservationMode":"released","vm":{"tier":"spot","state":"terminating","since":"2026-12-01T16:00:00Z"}}],
		"reservations":[{"id":"res-1","status":"active","access":"view","reservedUnitIds":["gpu-1","gpu-2"],"releasedUnitIds":["gpu-2"]}]}`
	nodeAnswer = `{"node":{"nodeId":"node-1","ownerOrgId":"org-owner","unitIds":["gpu-0","gpu-1","gpu-2","gpu-3","gpu-4"],"agentEndpoint":"https://a","topologyGen":3,"version":41,"auditHead":{"seq":1,"hash":"h"},"agentKeyGen":1}}`
)

// runOK runs capacityctl against api, the clock at clock (zero: the real one), and fails the
// test unless it exits 0.
func runOK(t *testing.T, api *httptest.Server, clock time.Time, args ...string) result {
	t.Helper()
	got := runApp(context.Background(), t, api, strings.NewReader(""), nil, func(a *app) {
		if !clock.IsZero() {
			a.now = func() time.Time { return clock }
		}
	}, args...)
	if got.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", got.code, got.stdout, got.err)
	}
	return got
}

// assertAbsent fails the test if out holds any of absent.
func assertAbsent(t *testing.T, name, out string, absent []string) {
	t.Helper()
	for _, no := range absent {
		if strings.Contains(out, no) {
			t.Errorf("%s holds %q:\n%s", name, no, out)
		}
	}
}

// TestNodesDescribe: describe reads the unit view (and the node, for its owner) and prints the
// unit map as a person reads it: the state as a word, the VM's age, what the caller may not
// see said so; -o json prints the unit view as the API answered it, and asks for nothing else.
func TestNodesDescribe(t *testing.T) {
	clock := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		args    []string
		answers map[string]answer
		asked   []string
		stdout  []string // in order
		absent  []string
	}{
		{"the owner", []string{"nodes", "describe", "--node", "node-1"},
			map[string]answer{"GET /v1/nodes/node-1/units": {body: ownerUnits}, "GET /v1/nodes/node-1": {body: nodeAnswer}},
			[]string{"GET /v1/nodes/node-1/units", "GET /v1/nodes/node-1"},
			[]string{
				"Node:          node-1",
				"Owner org:     org-owner",
				"Topology gen:  3",
				"Version:       41",
				"Unit states:   5 shown: 1 exclusive, 1 released, 1 spot, 1 occupied, 1 unreserved",
				"Reservations:",
				"  ID     STATUS  ACCESS  RESERVED                 RELEASED",
				"  res-1  active  manage  gpu-0,gpu-1,gpu-2,gpu-3  gpu-2,gpu-3",
				"Units:",
				"  UNIT   STATE       RESERVATION  MODE       VM         TIER      VM STATE  AGE",
				"  gpu-0  occupied    res-1        exclusive  vm-res-1   reserved  running   2h5m",
				"  gpu-1  exclusive   res-1        exclusive  -          -         -         -",
				"  gpu-2  spot        res-1        released   vm-spot-1  spot      running   45s",
				"  gpu-3  released    res-1        released   -          -         -         -",
				"  gpu-4  unreserved  -            -          -          -         -         -",
				"States:",
				"  exclusive   reserved, idle, the reservation's own",
				"  unreserved  in no reservation, idle",
				"to see what reclaiming res-1's released units would evict: capacityctl reclaim --dry-run --node node-1 --reservation res-1 --units gpu-2,gpu-3",
			}, []string{"terminating "}},
		{"an audience: what it may not see is said so", []string{"nodes", "describe", "--node", "node-1"},
			map[string]answer{"GET /v1/nodes/node-1/units": {body: audienceUnits}, "GET /v1/nodes/node-1": notFound},
			[]string{"GET /v1/nodes/node-1/units", "GET /v1/nodes/node-1"},
			[]string{
				"Owner org:     (not shown)",
				"Unit states:   2 shown: 1 exclusive, 1 terminating",
				"  res-1  active  view    gpu-1,gpu-2  gpu-2",
				"  gpu-2  terminating  res-1        released   (not shown)  spot  terminating  2d4h",
				"  terminating  under a VM being terminated (a reclaim's victim)",
			}, []string{"to see what reclaiming", "occupied"}},
		{"-o json: the unit view as answered", []string{"-o", "json", "nodes", "describe", "--node", "node-1"},
			map[string]answer{"GET /v1/nodes/node-1/units": {body: audienceUnits}},
			[]string{"GET /v1/nodes/node-1/units"},
			[]string{`"nodeId": "node-1"`, `"state": "terminating"`}, []string{"Owner"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &routes{t: t, answers: tt.answers}
			api := httptest.NewServer(f)
			defer api.Close()
			got := runOK(t, api, clock, tt.args...)
			var asked []string
			for _, s := range f.got {
				asked = append(asked, s.route)
			}
			if !reflect.DeepEqual(asked, tt.asked) {
				t.Errorf("asked %q, want %q", asked, tt.asked)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
			assertAbsent(t, "stdout", got.stdout, tt.absent)
		})
	}
}

// TestNodesDescribeRefusals: a node the caller may not see is the API's 404, told with the
// command; a failure reading the node for its owner (other than its 404) is not hidden.
func TestNodesDescribeRefusals(t *testing.T) {
	for _, tt := range []struct {
		name    string
		answers map[string]answer
		stderr  string
	}{
		{"no such node", map[string]answer{"GET /v1/nodes/node-1/units": notFound}, "404 not_found"},
		{"the node unreadable", map[string]answer{"GET /v1/nodes/node-1/units": {body: ownerUnits}, "GET /v1/nodes/node-1": {status: 400, body: `{"code":"bad_request","status":400}`}}, "400"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := httptest.NewServer(&routes{t: t, answers: tt.answers})
			defer api.Close()
			got := runCLI(t, api, "", nil, "nodes", "describe", "--node", "node-1")
			if got.code != exitFailed || !strings.Contains(got.err, tt.stderr) {
				t.Errorf("exit %d, stderr\n%s\nwant exit 1 and %q", got.code, got.err, tt.stderr)
			}
		})
	}
	if got := runCLI(t, nil, "", nil, "nodes", "describe"); got.code != exitUsage || !strings.Contains(got.err, "--node is required") {
		t.Errorf("no --node: exit %d, %s", got.code, got.err)
	}
}

// nodePages answers GET /v1/nodes a page per cursor and GET .../units from units (a node
// missing there is a 404), recording what it was asked.
type nodePages struct {
	pages map[string]wire.NodePageJSON // by cursor ("" the first)
	units map[string]string            // by node: the unit view
	asked []string
}

func (p *nodePages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.asked = append(p.asked, r.Method+" "+strings.TrimPrefix(r.URL.RequestURI(), "/dev"))
	if node, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/dev/v1/nodes/"), "/units"); ok {
		body, ok := p.units[node]
		if !ok {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(404)
			body = notFound.body
		}
		_, _ = w.Write([]byte(body))
		return
	}
	_ = json.NewEncoder(w).Encode(p.pages[r.URL.Query().Get("cursor")])
}

func TestNodesList(t *testing.T) {
	pages := map[string]wire.NodePageJSON{
		"": {Nodes: []wire.NodeListingJSON{
			{NodeID: "node-1", OwnerOrgID: "org-owner", UnitIDs: []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"}, TopologyGen: 3},
			{NodeID: "node-2", UnitIDs: []string{"gpu-0"}, TopologyGen: 1}}, NextCursor: "c2"},
		"c2": {Nodes: []wire.NodeListingJSON{{NodeID: "node-3", UnitIDs: []string{}, TopologyGen: 1}}},
		"c3": {Nodes: []wire.NodeListingJSON{{NodeID: "node-4", UnitIDs: []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"}, TopologyGen: 3}}},
	}
	tests := []struct {
		name   string
		args   []string
		asked  []string
		stdout []string // in order
		absent []string
	}{
		{"a page and the command of the next", []string{"nodes", "list", "--limit", "2"},
			[]string{"GET /v1/nodes?limit=2"},
			[]string{"NODE    OWNER        UNITS             TOPOLOGY GEN",
				"node-1  org-owner    5 (gpu-0..gpu-4)  3",
				"node-2  (not shown)  1 (gpu-0)         1",
				"next page: capacityctl nodes list --cursor c2 --limit 2 --endpoint ",
				"a node's units and the VMs on them: capacityctl nodes describe --node node-1"}, []string{"node-3", "STATES"}},
		{"--all follows the cursor", []string{"nodes", "list", "--all", "--limit", "2"},
			[]string{"GET /v1/nodes?limit=2", "GET /v1/nodes?cursor=c2&limit=2"},
			[]string{"node-1", "node-2", "node-3  (not shown)  0                 1"}, []string{"next page"}},
		{"--states: a unit view per node, a letter per unit", []string{"nodes", "list", "--states"},
			[]string{"GET /v1/nodes", "GET /v1/nodes/node-1/units", "GET /v1/nodes/node-2/units"},
			[]string{"NODE    OWNER        UNITS             TOPOLOGY GEN  STATES",
				"node-1  org-owner    5 (gpu-0..gpu-4)  3             OESRU",
				"node-2  (not shown)  1 (gpu-0)         1             (unread: not_found)",
				"states, a letter per unit in the node's order: E exclusive, R released, S spot, T terminating, O occupied, U unreserved, . not shown to you",
				"next page: capacityctl nodes list --cursor c2 --states --endpoint "}, nil},
		{"--states on what an audience sees: a dot a unit not shown", []string{"nodes", "list", "--states", "--cursor", "c3"},
			[]string{"GET /v1/nodes?cursor=c3", "GET /v1/nodes/node-4/units"}, []string{"node-4  (not shown)  5 (gpu-0..gpu-4)  3             .ET.."}, nil},
		{"-o json --all: every page in one answer", []string{"-o", "json", "nodes", "list", "--all", "--states"},
			[]string{"GET /v1/nodes", "GET /v1/nodes?cursor=c2"},
			[]string{`"nodeId": "node-1"`, `"nodeId": "node-3"`}, []string{"nextCursor", "next page"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &nodePages{pages: pages, units: map[string]string{"node-1": ownerUnits, "node-4": audienceUnits}}
			api := httptest.NewServer(f)
			defer api.Close()
			got := runOK(t, api, time.Time{}, tt.args...)
			if !reflect.DeepEqual(f.asked, tt.asked) {
				t.Errorf("asked %q, want %q", f.asked, tt.asked)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
			assertAbsent(t, "stdout", got.stdout, tt.absent)
		})
	}
}

// TestReclaimsList: reclaims list asks for the reservation's operations with the state and
// page flags and prints a row each, newest first as answered, with its VMs counted (the
// audience's redacted view too); a state it does not know is refused before any request.
func TestReclaimsList(t *testing.T) {
	page := `{"reclaims":[` + failedOp + `,` +
		`{"id":"op-0","nodeId":"node-1","reservationId":"res-1","state":"completed","unitIds":["gpu-4"],"vmCounts":{"pending":0,"terminated":2,"alreadyGone":1,"failed":0},"createdAt":"2026-12-02T10:00:00Z"},` +
		`{"id":"op-z","nodeId":"node-1","reservationId":"res-1","state":"failed","unitIds":["gpu-5"],"vms":[],"reason":"workflow did not start","createdAt":"2026-12-01T10:00:00Z"}` +
		`],"nextCursor":"c9"}`
	tests := []struct {
		name   string
		args   []string
		answer string
		asked  string
		stdout []string
	}{
		{"every state, a page", []string{"reclaims", "list", "--node", "node-1", "--reservation", "res-1", "--limit", "3"}, page,
			"GET " + resPath + "/reclaims?limit=3",
			[]string{"ID    STATE      CREATED               UNITS        VMS (TERMINATED/FAILED/TOTAL)  REASON",
				"op-1  failed     2026-12-03T20:00:00Z  gpu-2,gpu-3  1/1/2                          -",
				"op-0  completed  2026-12-02T10:00:00Z  gpu-4        2/0/3                          -",
				"op-z  failed     2026-12-01T10:00:00Z  gpu-5        0/0/0                          workflow did not start",
				"next page: capacityctl reclaims list --node node-1 --reservation res-1 --cursor c9 --limit 3 --endpoint ",
				"one in full: capacityctl reclaims get --node node-1 --reservation res-1 --reclaim op-1 --endpoint "}},
		{"filtered, none", []string{"reclaims", "list", "--node", "node-1", "--reservation", "res-1", "--state", "in-flight"}, `{"reclaims":[]}`,
			"GET " + resPath + "/reclaims?state=in-flight",
			[]string{"ID  STATE  CREATED", "no in-flight reclaim operation"}},
		{"-o json: as answered", []string{"-o", "json", "reclaims", "list", "--node", "node-1", "--reservation", "res-1", "--state", "failed"}, page,
			"GET " + resPath + "/reclaims?state=failed",
			[]string{`"reclaims": [`, `"nextCursor": "c9"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &routes{t: t, answers: map[string]answer{"GET " + resPath + "/reclaims": {body: tt.answer}}}
			api := httptest.NewServer(f)
			defer api.Close()
			got := runOK(t, api, time.Time{}, tt.args...)
			if len(f.got) != 1 || f.got[0].route != tt.asked {
				t.Errorf("asked %+v, want %s", f.got, tt.asked)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
	got := runCLI(t, nil, "", nil, "reclaims", "list", "--node", "node-1", "--reservation", "res-1", "--state", "running")
	if got.code != exitUsage || !strings.Contains(got.err, `--state must be one of in-flight, failed, completed, not "running"`) {
		t.Errorf("--state running: exit %d\n%s", got.code, got.err)
	}
}
