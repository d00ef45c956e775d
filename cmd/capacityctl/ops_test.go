package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/wire"
)

// answer is what the fake API answers a route.
type answer struct {
	status int
	body   string
	header map[string]string
}

// sent is one request as the fake API got it.
type sent struct {
	route          string // METHOD path?query
	body           map[string]any
	idem, ifMatch  string
	hasContentType bool
}

// routes is a fake API answering "METHOD path" (path under /dev) from a table, recording what
// it was sent; a route it does not know is a 404 and fails the test.
type routes struct {
	t       *testing.T
	mu      sync.Mutex
	answers map[string]answer
	got     []sent
}

func (f *routes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := sent{route: r.Method + " " + strings.TrimPrefix(r.URL.RequestURI(), "/dev"), idem: r.Header.Get("Idempotency-Key"),
		ifMatch: r.Header.Get("If-Match"), hasContentType: r.Header.Get("Content-Type") != ""}
	raw, _ := io.ReadAll(r.Body)
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &s.body)
	}
	f.got = append(f.got, s)
	a, ok := f.answers[r.Method+" "+strings.TrimPrefix(r.URL.Path, "/dev")]
	if !ok {
		f.t.Errorf("unexpected request %s", s.route)
		w.WriteHeader(404)
		return
	}
	for k, v := range a.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(orDefaultInt(a.status, 200))
	_, _ = io.WriteString(w, a.body)
}

func orDefaultInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

const (
	resPath       = "/v1/nodes/node-1/reservations/res-1"
	planAnswer    = `{"id":"res-1","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-2","gpu-3"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":["gpu-2"],"topologyGen":1,"wouldTerminate":["vm-1"],"wouldSkip":[],"planEtag":"e1"}`
	pendingSched  = `{"id":"srcl_1","nodeId":"node-1","reservationId":"res-1","unitIds":["gpu-2"],"reason":"night batch","graceSeconds":30,"at":"2026-12-24T02:00:00Z","state":"scheduled","createdAt":"2026-12-03T20:00:00Z","createdByOrgId":"org-owner"}`
	firedSched    = `{"id":"srcl_1","nodeId":"node-1","reservationId":"res-1","unitIds":["gpu-2"],"reason":"","graceSeconds":0,"at":"2026-12-24T02:00:00Z","state":"completed","createdAt":"2026-12-03T20:00:00Z","createdByOrgId":"org-owner","reclaimId":"op-9","firedAt":"2026-12-24T02:00:01Z"}`
	cancelledSch  = `{"id":"srcl_1","nodeId":"node-1","reservationId":"res-1","unitIds":["gpu-2"],"reason":"","graceSeconds":0,"at":"2026-12-24T02:00:00Z","state":"cancelled","createdAt":"2026-12-03T20:00:00Z","createdByOrgId":"org-owner","cancelledAt":"2026-12-03T21:00:00Z"}`
	failedOp      = `{"id":"op-1","nodeId":"node-1","reservationId":"res-1","state":"failed","unitIds":["gpu-2","gpu-3"],"vms":[{"vmId":"vm-1","outcome":"terminated","at":"2026-12-03T20:00:31Z","notice":{"state":"delivered","at":"2026-12-03T20:00:01Z","terminateAfter":"2026-12-03T20:00:30Z"}},{"vmId":"vm-2","outcome":"failed","error":"agent unreachable"}],"attempt":1,"createdAt":"2026-12-03T20:00:00Z"}`
	retriedOp     = `{"id":"op-1","nodeId":"node-1","reservationId":"res-1","state":"pending-start","unitIds":["gpu-2","gpu-3"],"vms":[{"vmId":"vm-1","outcome":"terminated","at":"2026-12-03T20:00:31Z"},{"vmId":"vm-2","outcome":"pending"}],"attempt":2,"createdAt":"2026-12-03T20:00:00Z"}`
	forceEndedOp  = `{"id":"op-1","nodeId":"node-1","reservationId":"res-1","state":"completed","unitIds":["gpu-2","gpu-3"],"vms":[{"vmId":"vm-1","outcome":"terminated","at":"2026-12-03T20:00:31Z"},{"vmId":"vm-2","outcome":"force-ended","at":"2026-12-03T22:00:00Z","reason":"node wiped"}],"attempt":1,"createdAt":"2026-12-03T20:00:00Z"}`
	releaseAnswer = `{"id":"res-1","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-1","gpu-2"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":["gpu-1","gpu-2"],"topologyGen":1,"terminated":[],"skipped":[]}`
)

// TestJobCommands: each job's command sends its route with its body and headers, and prints
// the answer and the command to run next.
func TestJobCommands(t *testing.T) {
	clock := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		args    []string
		answers map[string]answer
		want    []sent   // the requests, in order (body nil: none)
		stdout  []string // in order
		stderr  []string
	}{
		{"release", []string{"release", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-1,gpu-2", "--reason", "idle", "--idempotency-key", "k1"},
			map[string]answer{"POST " + resPath + "/release": {body: releaseAnswer}},
			[]sent{{route: "POST " + resPath + "/release", body: map[string]any{"unitIds": []any{"gpu-1", "gpu-2"}, "reason": "idle"}, idem: "k1", hasContentType: true}},
			[]string{"res-1  active  gpu-1,gpu-2  gpu-1,gpu-2", "released to the spot market  gpu-1,gpu-2"}, nil},
		{"vms place", []string{"vms", "place", "--node", "node-1", "--vm", "vm-1", "--org", "org-b", "--tier", "spot", "--units", "gpu-1"},
			map[string]answer{"POST /v1/nodes/node-1/vms": {status: 201, body: `{"id":"vm-1","nodeId":"node-1","orgId":"org-b","tier":"spot","unitIds":["gpu-1"],"state":"running","createdAt":"t"}`}},
			[]sent{{route: "POST /v1/nodes/node-1/vms", body: map[string]any{"vmId": "vm-1", "orgId": "org-b", "tier": "spot", "unitIds": []any{"gpu-1"}}, hasContentType: true}},
			[]string{"placed:", "VM    ORG    TIER  UNITS  STATE", "vm-1  org-b  spot  gpu-1  running"}, nil},
		{"reclaim --dry-run changes nothing", []string{"reclaim", "--dry-run", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2", "--reason", "training run", "--grace", "30"},
			map[string]answer{"POST " + resPath + "/reclaim": {body: planAnswer, header: map[string]string{"ETag": `"e1"`}}},
			[]sent{{route: "POST " + resPath + "/reclaim", body: map[string]any{"unitIds": []any{"gpu-2"}, "dryRun": true, "reason": "training run", "graceSeconds": float64(30)}, hasContentType: true}},
			[]string{"would terminate  vm-1", "plan ETag        e1",
				"dry run: nothing changed. To reclaim: capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2 --reason 'training run' --grace 30 --endpoint "}, nil},
		{"reclaim --dry-run --count plans with the service", []string{"reclaim", "--dry-run", "--node", "node-1", "--reservation", "res-1", "--count", "1"},
			map[string]answer{"POST " + resPath + "/reclaim-plan": {body: `{"count":1,"unitIds":["gpu-2"],` + planAnswer[1:], header: map[string]string{"ETag": `"e1"`}}},
			[]sent{{route: "POST " + resPath + "/reclaim-plan", body: map[string]any{"count": float64(1)}, hasContentType: true}},
			[]string{"chose 1 units, least disruption first: gpu-2", "would terminate  vm-1", "To reclaim: capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2 "}, nil},
		{"reclaim --at a time schedules it", []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2", "--at", "2026-12-24T03:00:00+01:00", "--reason", "night batch", "--grace", "30", "--idempotency-key", "k2"},
			map[string]answer{"POST " + resPath + "/reclaim": {status: 202, body: pendingSched}},
			[]sent{{route: "POST " + resPath + "/reclaim", body: map[string]any{"unitIds": []any{"gpu-2"}, "at": "2026-12-24T02:00:00Z", "reason": "night batch", "graceSeconds": float64(30)}, idem: "k2", hasContentType: true}},
			[]string{"scheduled reclaim  srcl_1 (reservation res-1 on node-1)", "at                 2026-12-24T02:00:00Z", "state              scheduled", "grace              30s",
				"cancel it before 2026-12-24T02:00:00Z with: capacityctl scheduled cancel --node node-1 --reservation res-1 --id srcl_1 --endpoint "}, []string{"Idempotency-Key k2"}},
		{"reclaim --at a duration is from now", []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2", "--at", "6h"},
			map[string]answer{"POST " + resPath + "/reclaim": {status: 202, body: pendingSched}},
			[]sent{{route: "POST " + resPath + "/reclaim", body: map[string]any{"unitIds": []any{"gpu-2"}, "at": "2026-12-04T02:00:00Z"}, hasContentType: true}},
			[]string{"state              scheduled"}, []string{"Idempotency-Key capacityctl-", "(if no answer comes, run: capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2 --at 2026-12-04T02:00:00Z --idempotency-key capacityctl-"}},
		{"scheduled get of a fired one names its reclaim", []string{"scheduled", "get", "--node", "node-1", "--reservation", "res-1", "--id", "srcl_1"},
			map[string]answer{"GET " + resPath + "/scheduled-reclaims/srcl_1": {body: firedSched}},
			[]sent{{route: "GET " + resPath + "/scheduled-reclaims/srcl_1"}},
			[]string{"state              completed", "fired              2026-12-24T02:00:01Z", "reclaim id         op-9",
				"its reclaim: capacityctl reclaims get --node node-1 --reservation res-1 --reclaim op-9"}, nil},
		{"scheduled cancel", []string{"scheduled", "cancel", "--node", "node-1", "--reservation", "res-1", "--id", "srcl_1"},
			map[string]answer{"DELETE " + resPath + "/scheduled-reclaims/srcl_1": {body: cancelledSch}},
			[]sent{{route: "DELETE " + resPath + "/scheduled-reclaims/srcl_1"}},
			[]string{"state              cancelled", "cancelled          2026-12-03T21:00:00Z"}, nil},
		{"reclaims get", []string{"reclaims", "get", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1"},
			map[string]answer{"GET " + resPath + "/reclaims/op-1": {body: failedOp}},
			[]sent{{route: "GET " + resPath + "/reclaims/op-1"}},
			[]string{"state     failed", "progress  2/2 VMs done: 1 terminated, 0 already-gone, 1 failed",
				"VM    OUTCOME     AT                    NOTICE                             TERMINATE AFTER       ERROR OR REASON",
				"vm-1  terminated  2026-12-03T20:00:31Z  delivered at 2026-12-03T20:00:01Z  2026-12-03T20:00:30Z  -",
				"vm-2  failed      -                     -                                  -                     agent unreachable"}, nil},
		{"reclaims retry, not followed", []string{"reclaims", "retry", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1", "--idempotency-key", "k3"},
			map[string]answer{"POST " + resPath + "/reclaims/op-1/retry": {status: 202, body: retriedOp}},
			[]sent{{route: "POST " + resPath + "/reclaims/op-1/retry", idem: "k3"}},
			[]string{"state     pending-start (attempt 2)", "vm-2  pending",
				"not following it (--wait 0); follow it with: capacityctl reclaims wait --node node-1 --reservation res-1 --reclaim op-1 --endpoint "}, nil},
		{"reclaims retry with nothing to retry", []string{"reclaims", "retry", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1"},
			map[string]answer{"POST " + resPath + "/reclaims/op-1/retry": {body: forceEndedOp}},
			[]sent{{route: "POST " + resPath + "/reclaims/op-1/retry"}},
			[]string{"nothing to retry: every VM is terminated or gone", "state     completed"}, nil},
		{"reclaims force-end", []string{"reclaims", "force-end", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1", "--vm", "vm-2", "--reason", "node wiped", "--idempotency-key", "k4"},
			map[string]answer{"POST " + resPath + "/reclaims/op-1/vms/vm-2/force-end": {body: forceEndedOp}},
			[]sent{{route: "POST " + resPath + "/reclaims/op-1/vms/vm-2/force-end", body: map[string]any{"reason": "node wiped"}, idem: "k4", hasContentType: true}},
			[]string{"state     completed", "vm-2  force-ended  2026-12-03T22:00:00Z  -", "node wiped"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &routes{t: t, answers: tt.answers}
			api := httptest.NewServer(f)
			defer api.Close()
			got := runOK(t, api, clock, tt.args...)
			for i := range f.got {
				if i < len(tt.want) && tt.want[i].idem == "" && strings.HasPrefix(f.got[i].idem, "capacityctl-") {
					f.got[i].idem = "" // a generated key: stderr names it
				}
			}
			if !reflect.DeepEqual(f.got, tt.want) {
				t.Errorf("sent\n %+v\nwant\n %+v", f.got, tt.want)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
			assertInOrder(t, "stderr", got.err, tt.stderr)
		})
	}
}

// operationScript answers GET .../reclaims/op-1 with ops in turn (the last one for good), the
// clock moved on by 5 s before each answer.
func operationScript(t *testing.T, clock *capacitytest.Clock, ops ...wire.OperationJSON) http.Handler {
	var mu sync.Mutex
	n := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "GET" || r.URL.Path != "/dev"+resPath+"/reclaims/op-1" {
			t.Errorf("unexpected request %s %s", r.Method, r.URL)
			w.WriteHeader(404)
			return
		}
		mu.Lock()
		op := ops[min(n, len(ops)-1)]
		n++
		mu.Unlock()
		clock.Advance(5 * time.Second)
		_ = json.NewEncoder(w).Encode(op)
	})
}

// TestFollow: following an operation prints each notice as it is delivered, a countdown
// through the grace (a line per step, deterministic on the app's clock), each VM's outcome
// and the count; it exits 4 with the re-drive command when a VM failed, and 5 with the
// command that follows again when --wait runs out.
func TestFollow(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	ts := func(s int) string { return t0.Add(time.Duration(s) * time.Second).Format(time.RFC3339) }
	notice := func(state string) *wire.VMNoticeJSON {
		return &wire.VMNoticeJSON{State: state, At: ts(1), TerminateAfter: ts(25)}
	}
	op := func(state string, vms ...wire.VMOutcomeJSON) wire.OperationJSON {
		return wire.OperationJSON{ID: "op-1", NodeID: "node-1", ReservationID: "res-1", State: state, UnitIDs: []string{"gpu-2", "gpu-3"}, VMs: vms, CreatedAt: ts(0)}
	}
	vm := func(id, outcome string, n *wire.VMNoticeJSON, at int) wire.VMOutcomeJSON {
		v := wire.VMOutcomeJSON{VMID: id, Outcome: outcome, Notice: n}
		if at > 0 {
			v.At = ts(at)
		}
		if outcome == "failed" {
			v.Error = "agent unreachable"
		}
		return v
	}
	graceful := []wire.OperationJSON{
		op("terminating", vm("vm-1", "pending", notice("delivered"), 0), vm("vm-2", "pending", nil, 0)),                   // t0+5
		op("terminating", vm("vm-1", "pending", notice("delivered"), 0), vm("vm-2", "pending", notice("unsupported"), 0)), // +10
		op("terminating", vm("vm-1", "pending", notice("delivered"), 0), vm("vm-2", "pending", notice("unsupported"), 0)), // +15
		op("terminating", vm("vm-1", "pending", notice("delivered"), 0), vm("vm-2", "pending", notice("unsupported"), 0)), // +20
		op("terminating", vm("vm-1", "pending", notice("delivered"), 0), vm("vm-2", "pending", notice("unsupported"), 0)), // +25
		op("terminating", vm("vm-1", "terminated", notice("delivered"), 27), vm("vm-2", "pending", notice("unsupported"), 0)),
	}
	wait := []string{"reclaims", "wait", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1"}
	tests := []struct {
		name   string
		ops    []wire.OperationJSON
		extra  []string
		code   int
		stdout []string // in order
		stderr []string
	}{
		{"through the grace to the end", append(graceful, op("completed", vm("vm-1", "terminated", notice("delivered"), 27), vm("vm-2", "already-gone", notice("unsupported"), 31))), nil, 0,
			[]string{
				"notice delivered to vm-1 at " + ts(1) + " (terminated from " + ts(25) + ")",
				"0/2 VMs done: 0 terminated, 0 already-gone, 0 failed",
				"grace: 20s left before termination (at " + ts(25) + ")",
				"notice to vm-2 not delivered: its agent predates eviction notices (terminated from " + ts(25) + " all the same)",
				"grace: 10s left before termination",
				"grace: 5s left before termination",
				"grace over: terminating",
				"vm-1 terminated at " + ts(27),
				"1/2 VMs done: 1 terminated, 0 already-gone, 0 failed",
				"vm-2 already-gone at " + ts(31),
				"2/2 VMs done: 1 terminated, 1 already-gone, 0 failed",
			}, nil},
		{"a VM failed: re-drive it", append(graceful, op("failed", vm("vm-1", "terminated", notice("delivered"), 27), vm("vm-2", "failed", notice("unsupported"), 0))), nil, exitVMsFailed,
			[]string{"vm-2 failed: agent unreachable", "2/2 VMs done: 1 terminated, 0 already-gone, 1 failed"},
			[]string{"vm-2: agent unreachable", "reclaim op-1 is failed with 1 VMs failed",
				"next: capacityctl reclaims retry --node node-1 --reservation res-1 --reclaim op-1 --endpoint "}},
		{"--wait runs out: exit 5 and the command that follows again", graceful, []string{"--wait", "12s"}, exitWaitExpired,
			[]string{"0/2 VMs done", "grace: 20s left"},
			[]string{"reclaim op-1 still running after 12s; its termination goes on",
				"next: capacityctl reclaims wait --node node-1 --reservation res-1 --reclaim op-1 --endpoint "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := capacitytest.NewClock(t0)
			api := httptest.NewServer(operationScript(t, clock, tt.ops...))
			defer api.Close()
			got := runApp(context.Background(), t, api, strings.NewReader(""), nil, func(a *app) { a.now = clock.Now }, append(wait, tt.extra...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
			assertInOrder(t, "stderr", got.err, tt.stderr)
			if strings.Count(got.stdout, "grace: 20s") != 1 || strings.Count(got.stdout, "notice delivered to vm-1") != 1 {
				t.Errorf("a step or a notice told twice:\n%s", got.stdout)
			}
		})
	}
}

// TestFollowOnATerminal: on a terminal the countdown is one line redrawn every poll (erased
// before any other line is printed, and at the end), not a line per step.
func TestFollowOnATerminal(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	ts := func(s int) string { return t0.Add(time.Duration(s) * time.Second).Format(time.RFC3339) }
	pending := wire.VMOutcomeJSON{VMID: "vm-1", Outcome: "pending", Notice: &wire.VMNoticeJSON{State: "delivered", At: ts(1), TerminateAfter: ts(17)}}
	done := pending
	done.Outcome, done.At = "terminated", ts(18)
	op := func(state string, v wire.VMOutcomeJSON) wire.OperationJSON {
		return wire.OperationJSON{ID: "op-1", NodeID: "node-1", ReservationID: "res-1", State: state, UnitIDs: []string{"gpu-2"}, VMs: []wire.VMOutcomeJSON{v}, CreatedAt: ts(0)}
	}
	clock := capacitytest.NewClock(t0)
	api := httptest.NewServer(operationScript(t, clock, op("terminating", pending), op("terminating", pending), op("terminating", pending), op("completed", done)))
	defer api.Close()
	got := runApp(context.Background(), t, api, strings.NewReader(""), nil, func(a *app) { a.now, a.liveOut = clock.Now, a.io.out },
		"reclaims", "wait", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1")
	if got.code != 0 {
		t.Fatalf("exit %d\n%s", got.code, got.err)
	}
	want := "notice delivered to vm-1 at " + ts(1) + " (terminated from " + ts(17) + ")\n" +
		"0/1 VMs done: 0 terminated, 0 already-gone, 0 failed\n" +
		eraseLine + "grace: 12s left before termination (at " + ts(17) + ")" +
		eraseLine + eraseLine + "grace: 7s left before termination (at " + ts(17) + ")" +
		eraseLine + eraseLine + "grace: 2s left before termination (at " + ts(17) + ")" +
		eraseLine + "vm-1 terminated at " + ts(18) + "\n" +
		"1/1 VMs done: 1 terminated, 0 already-gone, 0 failed\n"
	if got.stdout != want {
		t.Errorf("stdout\n%q\nwant\n%q", got.stdout, want)
	}
}

// TestErrorsUnderJSON: under -o json a failure prints its problem document on stdout (the
// API's as it sent it, else capacityctl's own), the exit code unchanged; stderr says what
// failed and, where one is known, the command to run next, never a raw route.
func TestErrorsUnderJSON(t *testing.T) {
	problem := func(status int, code, detail string) answer {
		return answer{status: status, header: map[string]string{"Content-Type": "application/problem+json"},
			body: fmt.Sprintf(`{"type":"https://docs.example/errors#%s","title":"x","status":%d,"code":%q,"detail":%q}`, code, status, code, detail)}
	}
	tests := []struct {
		name    string
		args    []string
		answers map[string]answer
		code    int
		json    string   // stdout under -o json: the problem's members that must be there
		next    string   // stderr's next command ("": none)
		stderr  []string // also on stderr
	}{
		{"a refusal: the API's problem as sent", []string{"scheduled", "cancel", "--node", "node-1", "--reservation", "res-1", "--id", "srcl_1"},
			map[string]answer{"DELETE " + resPath + "/scheduled-reclaims/srcl_1": problem(409, "scheduled_reclaim_fired", "it fired at 02:00")}, 1,
			`{"type":"https://docs.example/errors#scheduled_reclaim_fired","status":409,"code":"scheduled_reclaim_fired"}`,
			"capacityctl scheduled get --node node-1 --reservation res-1 --id srcl_1", []string{"409 scheduled_reclaim_fired: it fired at 02:00"}},
		{"a re-drive while it runs: wait for it", []string{"reclaims", "retry", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1"},
			map[string]answer{"POST " + resPath + "/reclaims/op-1/retry": problem(409, "operation_running", "running")}, 1,
			`{"code":"operation_running"}`, "capacityctl reclaims wait --node node-1 --reservation res-1 --reclaim op-1", nil},
		{"a stale topology", []string{"topology", "set", "--node", "node-1", "--units", "gpu-0", "--expected-gen", "1"},
			map[string]answer{"PUT /v1/nodes/node-1/topology": problem(409, "topology_changed", "at 3")}, 1,
			`{"code":"topology_changed"}`, "capacityctl nodes get --node node-1 (then run it again with --expected-gen set to its topology gen)", nil},
		{"a release of units in use", []string{"release", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-1"},
			map[string]answer{"POST " + resPath + "/release": problem(409, "units_in_use", "gpu-1 runs a VM")}, 1,
			`{"code":"units_in_use"}`, "capacityctl nodes describe --node node-1 (each unit's state, reservation and VM)", nil},
		{"a reclaim of a count larger than the spot market: the unit map", []string{"reclaim", "--dry-run", "--node", "node-1", "--reservation", "res-1", "--count", "9"},
			map[string]answer{"POST " + resPath + "/reclaim-plan": problem(409, "insufficient_units", "2 units on the spot market")}, 1,
			`{"code":"insufficient_units"}`, "capacityctl nodes describe --node node-1 (each unit's state, reservation and VM)", nil},
		{"no such reclaim: the reservation's list", []string{"reclaims", "get", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-x"},
			map[string]answer{"GET " + resPath + "/reclaims/op-x": problem(404, "not_found", "not found")}, 1,
			`{"code":"not_found","status":404}`, "capacityctl reclaims list --node node-1 --reservation res-1 (its reclaim operations, newest first)", nil},
		{"a reservation not active: the reservation", []string{"release", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-1"},
			map[string]answer{"POST " + resPath + "/release": problem(409, "reservation_not_active", "cancelled")}, 1,
			`{"code":"reservation_not_active"}`, "capacityctl reservations get --node node-1 --reservation res-1", nil},
		{"no key", []string{"nodes", "get", "--node", "node-1"},
			map[string]answer{"GET /v1/nodes/node-1": problem(401, "unauthenticated", "unknown key")}, 1,
			`{"code":"unauthenticated"}`, "capacityctl --key <API key> nodes get ... (or export CAPACITY_API_KEY=<API key>)", nil},
		{"API Gateway's own answer: capacityctl's problem with its status", []string{"reclaims", "get", "--node", "node-1", "--reservation", "res-1", "--reclaim", "op-1"},
			map[string]answer{"GET " + resPath + "/reclaims/op-1": {status: 502, body: "<html>Bad Gateway</html>", header: map[string]string{"Content-Type": "text/html"}}}, 1,
			`{"type":"about:blank","title":"capacityctl: http_502","status":502,"code":"http_502","exitCode":1}`, "", []string{"502 Bad Gateway"}},
		{"a schedule never answered: the command that finds it", []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2", "--at", "2026-12-24T03:00:00+01:00", "--idempotency-key", "k9"},
			map[string]answer{"POST " + resPath + "/reclaim": {status: 504, body: `{"message":"Endpoint request timed out"}`}}, 1,
			`{"type":"about:blank","status":504,"code":"no_answer","exitCode":1}`,
			"capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2 --at 2026-12-24T02:00:00Z --idempotency-key k9 --endpoint ", []string{"schedule: no answer after 6 attempts"}},
		{"a usage error", []string{"reclaims", "wait", "--node", "node-1"}, nil, exitUsage,
			`{"type":"about:blank","title":"capacityctl: usage","code":"usage","detail":"--reservation is required","exitCode":2}`, "", []string{"usage: capacityctl reclaims wait"}},
	}
	for _, tt := range tests {
		for _, output := range []string{"json", "table"} {
			t.Run(tt.name+" "+output, func(t *testing.T) {
				api := httptest.NewServer(&routes{t: t, answers: tt.answers})
				defer api.Close()
				got := runCLI(t, api, "", nil, append([]string{"-o", output}, tt.args...)...)
				if got.code != tt.code {
					t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", got.code, tt.code, got.stdout, got.err)
				}
				if output == "table" {
					if got.stdout != "" {
						t.Errorf("a failure printed %q on stdout", got.stdout)
					}
				} else {
					assertHolds(t, got.stdout, tt.json)
				}
				want := append([]string{"capacityctl: "}, tt.stderr...)
				if tt.next != "" {
					want = append(want, "  next: "+tt.next)
				}
				assertInOrder(t, "stderr", got.err, want)
				if tt.next == "" && strings.Contains(got.err, "next:") || strings.Contains(got.err, "/v1/") {
					t.Errorf("stderr names a next command or a route it should not:\n%s", got.err)
				}
			})
		}
	}
}

// assertHolds checks that doc is one JSON object holding every member of want, equal.
func assertHolds(t *testing.T, doc, want string) {
	t.Helper()
	var got, w map[string]any
	dec := json.NewDecoder(strings.NewReader(doc))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("stdout is not one JSON document (%v):\n%s", err, doc)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	for k, v := range w {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("%s: %v, want %v\n%s", k, got[k], v, doc)
		}
	}
}

// A plan that changed under -o json: the dry run's plan, then the problem with the new plan
// (exit 3), and the dry run to run again.
func TestPlanChangedUnderJSON(t *testing.T) {
	f := &fakeAPI{t: t, etag: "e1", newPlan: true}
	api := httptest.NewServer(f)
	defer api.Close()
	got := runCLI(t, api, "", nil, "-o", "json", "reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2,gpu-3", "--yes")
	if got.code != exitPlanChanged {
		t.Fatalf("exit %d\n%s\n%s", got.code, got.stdout, got.err)
	}
	docs := jsonDocs(t, got.stdout)
	if len(docs) != 2 || docs[0]["planEtag"] != "e1" || docs[1]["code"] != "plan_changed" || docs[1]["plan"].(map[string]any)["planEtag"] != "e2" {
		t.Errorf("documents %v, want the plan and the problem with the new plan", docs)
	}
	assertInOrder(t, "stderr", got.err, []string{"plan changed", "next: capacityctl reclaim --dry-run --node node-1 --reservation res-1 --units gpu-2,gpu-3"})
}

func TestVersion(t *testing.T) {
	saved := readBuildInfo
	defer func() { readBuildInfo = saved }()
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/openrelay/capacity", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-12-03T20:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Errorf("version made a request: %s", r.URL) }))
	defer api.Close()
	tests := []struct {
		name   string
		srv    *httptest.Server
		args   []string
		stdout []string
	}{
		{"table", api, []string{"version"}, []string{"capacityctl             github.com/openrelay/capacity (devel)", "revision                abc123 (with uncommitted changes)",
			"built from a commit of  2026-12-03T20:00:00Z", "go                      go1.99", "api                     " + api.URL + "/dev/"}},
		{"json", api, []string{"-o", "json", "version"}, []string{`"revision": "abc123"`, `"modified": true`, `"api": "` + api.URL + `/dev/"`}},
		{"no API named", nil, []string{"version"}, []string{"api                     none (no API endpoint: pass --endpoint"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Chdir(t.TempDir()) // no .local/outputs.json
			got := runCLI(t, tt.srv, "", nil, tt.args...)
			if got.code != 0 {
				t.Fatalf("exit %d: %s", got.code, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
}

// TestCompletion: each script completes groups, verbs and flags; each is valid for its shell
// where the shell is on this machine, and the bash one completes as it should.
func TestCompletion(t *testing.T) {
	for _, tt := range []struct {
		shell string
		check []string // the syntax check
	}{
		{"bash", []string{"bash", "-n"}},
		{"zsh", []string{"zsh", "-n"}},
		{"fish", []string{"fish", "--no-execute"}},
	} {
		t.Run(tt.shell, func(t *testing.T) {
			got := runCLI(t, nil, "", nil, "completion", tt.shell)
			if got.code != 0 {
				t.Fatalf("exit %d: %s", got.code, got.err)
			}
			for _, w := range []string{"reclaims", "force-end", "scheduled", "cancel", "completion", "dry-run", "idempotency-key", "reclaim"} {
				if !strings.Contains(got.stdout, w) {
					t.Errorf("the %s script lacks %q", tt.shell, w)
				}
			}
			path, err := exec.LookPath(tt.check[0])
			if err != nil {
				t.Skipf("%s is not on this machine: the script's syntax is not checked", tt.check[0])
			}
			file := filepath.Join(t.TempDir(), "capacityctl."+tt.shell)
			writeFile(t, file, got.stdout)
			if out, err := exec.Command(path, append(tt.check[1:], file)...).CombinedOutput(); err != nil {
				t.Errorf("%s %s: %v\n%s", tt.check[0], strings.Join(tt.check[1:], " "), err, out)
			}
		})
	}
}

// TestShellsComplete runs each script's completion on command lines, in each shell on this
// machine: bash's function with COMP_WORDS, zsh's with words and a compadd that prints (zsh
// matches the word itself: the test keeps those that start with it), fish's complete -C.
func TestShellsComplete(t *testing.T) {
	tests := []struct {
		line string // the words typed; the last one is being completed
		want string
	}{
		{"capacityctl rec", "reclaim reclaims"},
		{"capacityctl reclaims ", "force-end get list retry wait"},
		{"capacityctl reclaims list --node n --st", "--stack --state"},
		{"capacityctl nodes d", "describe"},
		{"capacityctl nodes list --", "--all --cursor --endpoint --key --limit --output --outputs --stack --states --timeout"},
		{"capacityctl reclaims wait --rec", "--reclaim"},
		{"capacityctl --endpoint http://x/ scheduled c", "cancel"},
		{"capacityctl reclaim --node node-1 --d", "--dry-run"},
		{"capacityctl reclaim --node node-1 ", ""},
		{"capacityctl completion ", "bash fish zsh"},
		{"capacityctl -", "--endpoint --key --output --outputs --stack --timeout -o"},
	}
	shells := []struct {
		name string
		run  func(file string, words []string) string // the shell's command
	}{
		{"bash", func(file string, words []string) string {
			return fmt.Sprintf(`source %s; COMP_WORDS=(%s); COMP_CWORD=%d; _capacityctl; printf '%%s\n' "${COMPREPLY[@]}"`, file, quoteAll(words), len(words)-1)
		}},
		{"zsh", func(file string, words []string) string {
			return fmt.Sprintf(`compadd() { [[ $1 == -- ]] && shift; printf '%%s\n' "$@"; }; compdef() { :; }; source %s; words=(%s); CURRENT=%d; _capacityctl`, file, quoteAll(words), len(words))
		}},
		{"fish", func(file string, words []string) string {
			return fmt.Sprintf(`source %s; complete -C %s`, file, shellQuote(strings.Join(words, " ")))
		}},
	}
	for _, sh := range shells {
		t.Run(sh.name, func(t *testing.T) {
			path, err := exec.LookPath(sh.name)
			if err != nil {
				t.Skipf("%s is not on this machine", sh.name)
			}
			file := filepath.Join(t.TempDir(), "capacityctl."+sh.name)
			writeFile(t, file, runCLI(t, nil, "", nil, "completion", sh.name).stdout)
			for _, tt := range tests {
				words := strings.Split(tt.line, " ")
				out, err := exec.Command(path, "-c", sh.run(file, words)).CombinedOutput()
				var got []string
				for _, w := range strings.Fields(string(out)) {
					if strings.HasPrefix(w, words[len(words)-1]) {
						got = append(got, w)
					}
				}
				slices.Sort(got)
				if err != nil || strings.Join(got, " ") != tt.want {
					t.Errorf("%q: %q (%v), want %q\n%s", tt.line, got, err, tt.want, out)
				}
			}
		})
	}
}

func quoteAll(words []string) string {
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = shellQuote(w)
	}
	return strings.Join(quoted, " ")
}
