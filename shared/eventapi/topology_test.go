package eventapi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

func topologyResult() *capacity.TopologyResult {
	return &capacity.TopologyResult{
		Node: capacity.Node{
			ID: "node-a", OwnerOrgID: "org-owner", UnitIDs: []string{"gpu-0", "gpu-1"}, TopologyGen: 2, Version: 7,
			AgentEndpoint: "https://node-a.example.net", AuditHead: capacity.AuditHead{Seq: 3, Hash: strings.Repeat("ab", 32)},
		},
		Changed: true, RemovedUnitIDs: []string{"gpu-7"}, NeedsReview: []string{"res-1"},
		VMsOnRemovedUnits: []capacity.VM{{ID: "vm-7", NodeID: "node-a", OrgID: "org-buyer", Tier: capacity.TierSpot,
			UnitIDs: []string{"gpu-7"}, State: capacity.VMRunning, CreatedAt: now.Add(-time.Hour)}},
	}
}

// topologyEnvelope is a Node Topology Changed event as the topology rule puts it on the queue.
func topologyEnvelope(id, source, detail string) string {
	return fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"Node Topology Changed","source":%q,`+
		`"account":"111111111111","time":"2026-12-02T15:00:00Z","region":"us-east-1","resources":[],"detail":%s}`, id, source, detail)
}

const topologyValid = `{"nodeId":"node-a","unitIds":["gpu-0","gpu-1"]}`

func TestTopology(t *testing.T) {
	fleet := capacity.SourceFleet
	tests := []struct {
		name       string
		body       string
		principals capacity.EventPrincipals // the handler's; nil: newHandler's
		svcErr     error
		pubFail    int
		// want
		failed   bool
		called   bool
		outcome  string // the detail type published, "" for none
		code     string
		eventID  string
		check    func(t *testing.T, c call)
		inDetail string
	}{
		{
			name: "applied", body: topologyEnvelope("ev-1", fleet, topologyValid),
			called: true, outcome: capacity.DetailTopologyApplied, eventID: "ev-1/applied",
			inDetail: `"removedUnitIds":["gpu-7"]`,
			check: func(t *testing.T, c call) {
				want := capacity.Principal{OrgID: "platform", KeyID: "event:openrelay.fleet", Operator: true, Permissions: []string{capacity.PermTopology}}
				if fmt.Sprint(c.principal) != fmt.Sprint(want) {
					t.Errorf("principal %+v, want %+v", c.principal, want)
				}
				r := c.topology
				if r.NodeID != "node-a" || strings.Join(r.UnitIDs, ",") != "gpu-0,gpu-1" || r.Reason != "" || r.IdempotencyKey != "event:ev-1" ||
					r.ExpectedTopologyGen != nil {
					t.Errorf("request %+v", r)
				}
				if c.meta.Via != capacity.ViaEvent || c.meta.EventID != "ev-1" || c.meta.RequestID != "msg-1" {
					t.Errorf("meta %+v", c.meta)
				}
			},
		},
		{
			name: "every member", called: true, outcome: capacity.DetailTopologyApplied, eventID: "ev-2/applied",
			body: topologyEnvelope("ev-2", fleet, `{"nodeId":"node-a","unitIds":["gpu-0"],"reason":"gpu-1 failed","idempotencyKey":"fleet-42","expectedTopologyGen":4}`),
			check: func(t *testing.T, c call) {
				if r := c.topology; r.Reason != "gpu-1 failed" || r.IdempotencyKey != "fleet-42" || len(r.UnitIDs) != 1 ||
					r.ExpectedTopologyGen == nil || *r.ExpectedTopologyGen != 4 {
					t.Errorf("request %+v", r)
				}
			},
		},
		{
			name: "a configured source", body: topologyEnvelope("ev-3", "acme.fleet", topologyValid), principals: capacity.EventPrincipals{"acme.fleet": {Source: "acme.fleet", OrgID: "acme", Operator: true, Permissions: []string{capacity.PermTopology}}},
			called: true, outcome: capacity.DetailTopologyApplied, eventID: "ev-3/applied",
		},
		{
			name: "unknown source", body: topologyEnvelope("ev-4", "someone.else", topologyValid),
			outcome: capacity.DetailTopologyRefused, code: "forbidden", eventID: "ev-4/refused", inDetail: `"nodeId":"node-a"`,
		},
		{
			name: "the default source once others are configured", body: topologyEnvelope("ev-5", fleet, topologyValid), principals: capacity.EventPrincipals{"acme.fleet": {Source: "acme.fleet", OrgID: "acme", Operator: true, Permissions: []string{capacity.PermTopology}}},
			outcome: capacity.DetailTopologyRefused, code: "forbidden", eventID: "ev-5/refused",
		},
		{
			name: "no source configured", body: topologyEnvelope("ev-6", fleet, topologyValid), principals: capacity.EventPrincipals{},
			outcome: capacity.DetailTopologyRefused, code: "forbidden", eventID: "ev-6/refused",
		},
		{
			name: "an operator source without node.topology", body: topologyEnvelope("ev-8", "acme.fleet", topologyValid),
			principals: capacity.EventPrincipals{"acme.fleet": {Source: "acme.fleet", OrgID: "acme", Operator: true, Permissions: []string{capacity.PermCapacity}}},
			outcome:    capacity.DetailTopologyRefused, code: "forbidden", eventID: "ev-8/refused",
		},
		{
			name: "an event of another account", body: strings.Replace(topologyEnvelope("ev-9", fleet, topologyValid), "111111111111", "999999999999", 1),
			outcome: capacity.DetailTopologyRefused, code: "forbidden", eventID: "ev-9/refused",
		},
		{
			name: "a reclaim source may not change topology", body: topologyEnvelope("ev-7", capacity.SourcePlatformScheduler, topologyValid),
			outcome: capacity.DetailTopologyRefused, code: "forbidden", eventID: "ev-7/refused",
		},
		{
			name: "unknown member", body: topologyEnvelope("ev-8", fleet, `{"nodeId":"node-a","unitIds":["gpu-0"],"ifMatch":"*"}`),
			outcome: capacity.DetailTopologyRefused, code: "invalid_request", eventID: "ev-8/refused", inDetail: `ifMatch`,
		},
		{
			name: "member spelt in another case", body: topologyEnvelope("ev-9", fleet, `{"nodeId":"node-a","UnitIds":["gpu-0"]}`),
			outcome: capacity.DetailTopologyRefused, code: "invalid_request", eventID: "ev-9/refused",
		},
		{
			name: "null", body: topologyEnvelope("ev-10", fleet, `{"nodeId":"node-a","unitIds":["gpu-0"],"reason":null}`),
			outcome: capacity.DetailTopologyRefused, code: "invalid_request", eventID: "ev-10/refused",
		},
		{
			name: "missing unitIds", body: topologyEnvelope("ev-11", fleet, `{"nodeId":"node-a"}`),
			outcome: capacity.DetailTopologyRefused, code: "invalid_request", eventID: "ev-11/refused", inDetail: `unitIds`,
		},
		{
			name: "wrong type", body: topologyEnvelope("ev-12", fleet, `{"nodeId":"node-a","unitIds":"gpu-0"}`),
			outcome: capacity.DetailTopologyRefused, code: "invalid_request", eventID: "ev-12/refused", inDetail: `unitIds`,
		},
		{
			name: "detail not an object", body: topologyEnvelope("ev-13", fleet, `["node-a"]`),
			outcome: capacity.DetailTopologyRefused, code: "invalid_request", eventID: "ev-13/refused",
		},
		{
			name: "a domain refusal is final", body: topologyEnvelope("ev-14", fleet, topologyValid),
			svcErr: capacity.Errorf(capacity.CodeInvalidTransition, "more than 90 reservations would move to needs-review"),
			called: true, outcome: capacity.DetailTopologyRefused, code: "invalid_transition", eventID: "ev-14/refused",
			inDetail: `"detail":"more than 90 reservations would move to needs-review"`,
		},
		{
			name: "expectedTopologyGen not an integer", body: topologyEnvelope("ev-21", fleet, `{"nodeId":"node-a","unitIds":["gpu-0"],"expectedTopologyGen":"4"}`),
			outcome: capacity.DetailTopologyRefused, code: "invalid_request", eventID: "ev-21/refused", inDetail: `expectedTopologyGen`,
		},
		{
			name: "a stale change is refused, not retried", body: topologyEnvelope("ev-22", fleet, `{"nodeId":"node-a","unitIds":["gpu-0"],"expectedTopologyGen":1}`),
			svcErr: capacity.Errorf(capacity.CodeTopologyChanged, "node node-a is at topology generation 2; the change was made against generation 1"),
			called: true, outcome: capacity.DetailTopologyRefused, code: "topology_changed", eventID: "ev-22/refused", inDetail: `generation 1`,
		},
		{
			name: "an unknown node is refused", body: topologyEnvelope("ev-15", fleet, topologyValid),
			svcErr: capacity.Errorf(capacity.CodeNotFound, "node node-a not found"),
			called: true, outcome: capacity.DetailTopologyRefused, code: "not_found", eventID: "ev-15/refused",
		},
		{
			name: "conflict rounds used up are retried", body: topologyEnvelope("ev-16", fleet, topologyValid),
			svcErr: capacity.Errorf(capacity.CodeConcurrentModification, "concurrent writes kept winning"), called: true, failed: true,
		},
		{name: "throttling is retried", body: topologyEnvelope("ev-17", fleet, topologyValid), svcErr: capacity.Errorf(capacity.CodeThrottled, "the database is throttling this node"), called: true, failed: true},
		{name: "any other error is retried", body: topologyEnvelope("ev-18", fleet, topologyValid), svcErr: errors.New("connection reset"), called: true, failed: true},
		{name: "publish failure is retried", body: topologyEnvelope("ev-19", fleet, topologyValid), pubFail: 1, called: true, failed: true},
		{name: "publish failure of a refusal is retried", body: topologyEnvelope("ev-20", fleet, `{}`), pubFail: 1, failed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{topo: topologyResult(), err: tt.svcErr}
			pub := &capacitytest.Publisher{FailFirst: tt.pubFail}
			h := newHandler(svc, pub)
			if tt.principals != nil {
				h.Principals = tt.principals
			}
			resp, err := h.Handle(context.Background(), batch(tt.body))
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			calls := ""
			if tt.called {
				calls = "SetTopology"
			}
			d := checkHandled(t, resp, svc, pub, handled{failed: tt.failed, calls: calls, check: tt.check,
				outcome: tt.outcome, code: tt.code, eventID: tt.eventID, inDetail: tt.inDetail})
			if tt.outcome == "" {
				return
			}
			// An outcome names the request it answers.
			wantSource := strings.SplitN(strings.SplitN(tt.body, `"source":"`, 2)[1], `"`, 2)[0]
			if d.RequestEventID != strings.SplitN(tt.eventID, "/", 2)[0] || d.RequestSource != wantSource {
				t.Errorf("outcome answers event %s from %s, want %s from %s", d.RequestEventID, d.RequestSource, strings.SplitN(tt.eventID, "/", 2)[0], wantSource)
			}
		})
	}
}

// TestTopologyDuplicateDelivery: a redelivered topology change calls the domain under the
// same idempotency key (which replays the first answer instead of bumping the generation
// again) and publishes the same outcome id.
func TestTopologyDuplicateDelivery(t *testing.T) {
	for _, detail := range []string{topologyValid, `{"nodeId":"node-a","unitIds":["gpu-0"],"idempotencyKey":"fleet-42"}`} {
		svc := &fakeService{topo: topologyResult()}
		pub := &capacitytest.Publisher{}
		h := newHandler(svc, pub)
		for range 2 {
			if resp, err := h.Handle(context.Background(), batch(topologyEnvelope("ev-1", capacity.SourceFleet, detail))); err != nil || len(resp.BatchItemFailures) != 0 {
				t.Fatalf("Handle = %+v, %v", resp, err)
			}
		}
		if len(svc.calls) != 2 || svc.calls[0].topology.IdempotencyKey == "" || svc.calls[0].topology.IdempotencyKey != svc.calls[1].topology.IdempotencyKey {
			t.Fatalf("calls %+v, want two under one key", svc.calls)
		}
		if len(pub.Published()) != 2 || pub.Published()[0].ID != pub.Published()[1].ID || pub.Published()[0].ID != "ev-1/applied" {
			t.Fatalf("published %+v, want the same outcome twice", pub.Published())
		}
	}
}

// TestTopologySample: the sample topology change of events/ is applied through the handler,
// and its outcome matches the Applied schema.
func TestTopologySample(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(sampleDir, "bus-node-topology-changed.json"))
	if err != nil {
		t.Fatal(err)
	}
	svc := &fakeService{topo: topologyResult()}
	pub := &capacitytest.Publisher{}
	resp, err := newHandler(svc, pub).Handle(context.Background(), batch(string(raw)))
	if err != nil || len(resp.BatchItemFailures) != 0 || len(svc.calls) != 1 || len(pub.Published()) != 1 ||
		pub.Published()[0].DetailType != capacity.DetailTopologyApplied {
		t.Fatalf("Handle = %+v, %v; calls %+v; published %+v", resp, err, svc.calls, pub.Published())
	}
	if r := svc.calls[0].topology; r.NodeID != "node-a" || len(r.UnitIDs) != 7 || r.Reason == "" || r.ExpectedTopologyGen == nil || *r.ExpectedTopologyGen != 1 {
		t.Errorf("request %+v", r)
	}
	mustMatchSchema(t, pub.Published()[0])
}
