package eventapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/eventapi"
)

// call is one call the fake service received.
type call struct {
	method      string // "Reclaim", "FireScheduledReclaim" or "SetTopology"
	principal   capacity.Principal
	req         capacity.CapacityRequest
	topology    capacity.TopologyRequest
	scheduledID string
	meta        capacity.RequestMeta
}

// fakeService answers every call with res (topo for SetTopology) or err, and records it.
type fakeService struct {
	res   *capacity.CapacityResult
	topo  *capacity.TopologyResult
	err   error
	calls []call
}

func (f *fakeService) SetTopology(_ context.Context, p capacity.Principal, req capacity.TopologyRequest, meta capacity.RequestMeta) (*capacity.TopologyResult, error) {
	f.calls = append(f.calls, call{method: "SetTopology", principal: p, topology: req, meta: meta})
	if f.err != nil {
		return nil, f.err
	}
	return f.topo, nil
}

func (f *fakeService) Reclaim(_ context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error) {
	f.calls = append(f.calls, call{method: "Reclaim", principal: p, req: req, meta: meta})
	return f.res, f.err
}

func (f *fakeService) FireScheduledReclaim(_ context.Context, nodeID, reservationID, scheduledID string, meta capacity.RequestMeta) (*capacity.CapacityResult, error) {
	f.calls = append(f.calls, call{method: "FireScheduledReclaim", req: capacity.CapacityRequest{NodeID: nodeID, ReservationID: reservationID}, scheduledID: scheduledID, meta: meta})
	return f.res, f.err
}

var now = time.Date(2026, 12, 2, 15, 0, 1, 0, time.UTC)

func result() *capacity.CapacityResult {
	return &capacity.CapacityResult{
		Reservation: capacity.Reservation{
			ID: "res-1", NodeID: "node-a", AllowedOrgIDs: []string{"org-audience"}, ManagingOrgIDs: []string{"org-manager"},
			ReservedUnitIDs: []string{"gpu-0", "gpu-1", "gpu-2"}, StartsAt: now.Add(-time.Hour), Status: capacity.StatusActive,
			CreatedAt: now.Add(-time.Hour), UpdatedAt: now, TopologyGen: 1,
		},
		ReclaimID: "r-1", Terminated: []string{"vm-1"}, Reason: "training", TerminateAfter: now.Add(time.Minute),
	}
}

// envelope is an EventBridge event as the rule puts it on the queue.
func envelope(id, source string, detail string) string {
	return fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"Capacity Reclaim Requested","source":%q,`+
		`"account":"111111111111","time":"2026-12-02T15:00:00Z","region":"us-east-1","resources":[],"detail":%s}`, id, source, detail)
}

// intakeQueue is the queue the test handler accepts records from.
const intakeQueue = "arn:aws:sqs:us-east-1:111111111111:capacity-test-reclaim-requests"

func batch(bodies ...string) events.SQSEvent {
	var ev events.SQSEvent
	for i, b := range bodies {
		ev.Records = append(ev.Records, events.SQSMessage{MessageId: fmt.Sprintf("msg-%d", i+1), Body: b, EventSourceARN: intakeQueue})
	}
	return ev
}

const (
	tenant   = "example.tenant-automation"
	valid    = `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2"],"actingOrgId":"org-owner"}`
	schedule = `{"nodeId":"node-a","reservationId":"res-1","scheduledReclaimId":"sr-1"}`
)

func newHandler(svc *fakeService, pub *capacitytest.Publisher) *eventapi.Handler {
	return &eventapi.Handler{
		Service: svc, Publisher: pub, Now: func() time.Time { return now },
		Principals: capacity.EventPrincipals{
			tenant: {Source: tenant, OrgID: "org-owner", Permissions: []string{capacity.PermCapacity}},
			capacity.SourcePlatformScheduler: {Source: capacity.SourcePlatformScheduler, OrgID: "org-platform", Operator: true,
				Permissions: []string{capacity.PermCapacity}},
			capacity.SourceFleet: {Source: capacity.SourceFleet, OrgID: "platform", Operator: true, Permissions: []string{capacity.PermTopology}},
		},
		Origin: eventapi.Origin{QueueARN: intakeQueue, Account: "111111111111", Region: "us-east-1", Bus: "capacity-test"},
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
}

func TestHandle(t *testing.T) {
	conflict := capacity.Errorf(capacity.CodeConcurrentModification, "concurrent writes kept winning")
	tests := []struct {
		name    string
		body    string
		svcErr  error
		pubFail int
		// want
		failed   bool   // a batch item failure
		calls    string // the service method called, "" for none
		outcome  string // the detail type published, "" for none
		code     string // of a refusal
		eventID  string
		check    func(t *testing.T, c call)
		inDetail string // a substring of the published detail
	}{
		{
			name: "valid tenant request", body: envelope("ev-1", tenant, valid),
			calls: "Reclaim", outcome: capacity.DetailReclaimCompleted, eventID: "ev-1/completed",
			inDetail: `"terminateAfter":"2026-12-02T15:01:01Z"`,
			check: func(t *testing.T, c call) {
				want := capacity.Principal{KeyID: "event:" + tenant, OrgID: "org-owner", Permissions: []string{capacity.PermCapacity}}
				if fmt.Sprint(c.principal) != fmt.Sprint(want) {
					t.Errorf("principal %+v, want %+v", c.principal, want)
				}
				if c.req.IdempotencyKey != "event:ev-1" || c.meta.Via != capacity.ViaEvent || c.meta.EventID != "ev-1" || c.meta.RequestID != "msg-1" {
					t.Errorf("key %q, meta %+v", c.req.IdempotencyKey, c.meta)
				}
			},
		},
		{
			name: "every member", calls: "Reclaim", outcome: capacity.DetailReclaimCompleted, eventID: "ev-2/completed",
			body: envelope("ev-2", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2","gpu-3"],"actingOrgId":"org-owner",`+
				`"reason":"nightly","dryRun":true,"idempotencyKey":"nightly-1","graceSeconds":30}`),
			check: func(t *testing.T, c call) {
				r := c.req
				if r.Reason != "nightly" || !r.DryRun || r.IdempotencyKey != "nightly-1" || r.GraceSeconds != 30 || len(r.UnitIDs) != 2 {
					t.Errorf("request %+v", r)
				}
			},
		},
		{
			name: "platform scheduler acts as operator", body: envelope("ev-3", capacity.SourcePlatformScheduler, strings.Replace(valid, "org-owner", "org-platform", 1)),
			calls: "Reclaim", outcome: capacity.DetailReclaimCompleted, eventID: "ev-3/completed",
			check: func(t *testing.T, c call) {
				if !c.principal.Operator || c.principal.KeyID != "event:openrelay.scheduler" || c.principal.OrgID != "org-platform" {
					t.Errorf("principal %+v, want an operator of org-platform", c.principal)
				}
			},
		},
		{
			// The source is the principal: a detail cannot make the platform's scheduler act
			// for a tenant, nor a tenant's automation for another org.
			name: "actingOrgId of another org than the source's", body: envelope("ev-30", capacity.SourcePlatformScheduler, valid),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-30/refused",
		},
		{
			name: "a tenant acting for another org", body: envelope("ev-31", tenant, strings.Replace(valid, "org-owner", "org-platform", 1)),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-31/refused",
		},
		{
			name: "an event of another account", body: strings.Replace(envelope("ev-32", tenant, valid), "111111111111", "999999999999", 1),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-32/refused",
		},
		{
			name: "an event of another region", body: strings.Replace(envelope("ev-33", tenant, valid), "us-east-1", "eu-west-1", 1),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-33/refused",
		},
		{
			name: "an event of another bus", body: strings.Replace(envelope("ev-34", tenant, valid), `"version":"0",`, `"version":"0","event-bus-name":"default",`, 1),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-34/refused",
		},
		{
			name: "an event naming this bus", body: strings.Replace(envelope("ev-35", tenant, valid), `"version":"0",`, `"version":"0","event-bus-name":"capacity-test",`, 1),
			calls: "Reclaim", outcome: capacity.DetailReclaimCompleted, eventID: "ev-35/completed",
		},
		{
			// Its refusal is named by its own event id, not the scheduled reclaim's: a forged
			// firing must not take the outcome id (consumers deduplicate on it) of the real one.
			name: "a schedule firing of another account", body: strings.Replace(envelope("ev-36", capacity.SourceSchedule, schedule), "111111111111", "999999999999", 1),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-36/refused",
		},
		{
			name: "schedule firing", body: envelope("ev-4", capacity.SourceSchedule, schedule),
			calls: "FireScheduledReclaim", outcome: capacity.DetailReclaimCompleted, eventID: "scheduled/sr-1/completed",
			inDetail: `"scheduledReclaimId":"sr-1"`,
			check: func(t *testing.T, c call) {
				if c.scheduledID != "sr-1" || c.req.NodeID != "node-a" || c.req.ReservationID != "res-1" ||
					c.meta.Via != capacity.ViaSchedule || c.meta.EventID != "ev-4" {
					t.Errorf("call %+v", c)
				}
			},
		},
		{
			name: "unknown member", body: envelope("ev-5", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2"],"actingOrgId":"org-owner","dryrun":true}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-5/refused", inDetail: `"nodeId":"node-a"`,
		},
		{
			name: "member spelt in another case", body: envelope("ev-6", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2"],"actingOrgId":"org-owner","DryRun":true}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-6/refused",
		},
		{
			name: "null", body: envelope("ev-7", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2"],"actingOrgId":"org-owner","dryRun":null}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-7/refused",
		},
		{
			name: "null inside a value", body: envelope("ev-8", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2",null],"actingOrgId":"org-owner"}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-8/refused",
		},
		{
			name: "wrong type", body: envelope("ev-9", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2"],"actingOrgId":"org-owner","graceSeconds":"30"}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-9/refused", inDetail: `graceSeconds`,
		},
		{
			name: "missing actingOrgId", body: envelope("ev-10", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2"]}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-10/refused", inDetail: `actingOrgId`,
		},
		{
			name: "malformed actingOrgId", body: envelope("ev-11", tenant, `{"nodeId":"node-a","reservationId":"res-1","unitIds":["gpu-2"],"actingOrgId":"../x"}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-11/refused",
		},
		{
			name: "detail not an object", body: envelope("ev-12", tenant, `["node-a"]`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-12/refused",
		},
		{
			name: "schedule event with extra members", body: envelope("ev-13", capacity.SourceSchedule, `{"nodeId":"node-a","reservationId":"res-1","scheduledReclaimId":"sr-1","unitIds":["gpu-2"]}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "scheduled/sr-1/refused",
		},
		{
			name: "schedule event without its id", body: envelope("ev-14", capacity.SourceSchedule, `{"nodeId":"node-a","reservationId":"res-1"}`),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-14/refused",
		},
		{
			name: "source not allowed", body: envelope("ev-15", "someone.else", valid),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-15/refused",
		},
		{
			name: "wrong detail type", body: strings.Replace(envelope("ev-16", tenant, valid), "Capacity Reclaim Requested", "Capacity Reclaim Completed", 1),
			outcome: capacity.DetailReclaimRefused, code: "invalid_request", eventID: "ev-16/refused",
		},
		{
			name: "a refusal is final", body: envelope("ev-17", tenant, valid),
			svcErr: capacity.Errorf(capacity.CodeUnitsInUse, "units gpu-2 are in use"),
			calls:  "Reclaim", outcome: capacity.DetailReclaimRefused, code: "units_in_use", eventID: "ev-17/refused",
			inDetail: `"detail":"units gpu-2 are in use"`,
		},
		{
			name: "a refused schedule firing", body: envelope("ev-18", capacity.SourceSchedule, schedule),
			svcErr: capacity.Errorf(capacity.CodeReservationNotActive, "the reservation is cancelled"),
			calls:  "FireScheduledReclaim", outcome: capacity.DetailReclaimRefused, code: "reservation_not_active", eventID: "scheduled/sr-1/refused",
		},
		{
			name: "a schedule firing before its time", body: envelope("ev-38", capacity.SourceSchedule, schedule),
			svcErr: capacity.Errorf(capacity.CodeScheduledReclaimNotDue, "scheduled reclaim sr-1 is due at …"),
			calls:  "FireScheduledReclaim", outcome: capacity.DetailReclaimRefused, code: "scheduled_reclaim_not_due", eventID: "ev-38/refused",
		},
		{name: "conflict rounds used up are retried", body: envelope("ev-19", tenant, valid), svcErr: conflict, calls: "Reclaim", failed: true},
		{name: "throttling is retried", body: envelope("ev-20", tenant, valid), svcErr: capacity.Errorf(capacity.CodeThrottled, "the database is throttling this node"), calls: "Reclaim", failed: true},
		{name: "internal is retried", body: envelope("ev-21", tenant, valid), svcErr: capacity.Errorf(capacity.CodeInternal, "x"), calls: "Reclaim", failed: true},
		{
			name: "a deployment without scheduling is retried", body: envelope("ev-25", capacity.SourceSchedule, schedule),
			svcErr: capacity.Errorf(capacity.CodeSchedulingUnavailable, "scheduled reclaims are not available"), calls: "FireScheduledReclaim", failed: true,
		},
		{name: "any other error is retried", body: envelope("ev-22", tenant, valid), svcErr: errors.New("connection reset"), calls: "Reclaim", failed: true},
		{name: "publish failure is retried", body: envelope("ev-23", tenant, valid), pubFail: 1, calls: "Reclaim", failed: true},
		{name: "publish failure of a refusal is retried", body: envelope("ev-24", tenant, `{}`), pubFail: 1, failed: true},
		{name: "not an EventBridge event", body: `{"hello":"world"}`, failed: true},
		{
			name: "a topology source may not request reclaims", body: envelope("ev-37", capacity.SourceFleet, strings.Replace(valid, "org-owner", "platform", 1)),
			outcome: capacity.DetailReclaimRefused, code: "forbidden", eventID: "ev-37/refused",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{res: result(), err: tt.svcErr}
			pub := &capacitytest.Publisher{FailFirst: tt.pubFail}
			resp, err := newHandler(svc, pub).Handle(context.Background(), batch(tt.body))
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			checkHandled(t, resp, svc, pub, handled{failed: tt.failed, calls: tt.calls, check: tt.check,
				outcome: tt.outcome, code: tt.code, eventID: tt.eventID, inDetail: tt.inDetail})
		})
	}
}

// handled is what a case expects of handling its one message (msg-1).
type handled struct {
	failed   bool   // a batch item failure
	calls    string // the one service method called, "" for none
	check    func(t *testing.T, c call)
	outcome  string // the detail type published, "" for none
	code     string // of a refusal
	eventID  string
	inDetail string // a substring of the published detail
}

// outcomeDetail is the part of a published outcome's detail the cases compare.
type outcomeDetail struct {
	EventID, RequestEventID, RequestSource, Code string
}

// checkHandled checks the batch answer, the service calls and the one published outcome
// against want; it returns that outcome's detail (zero when nothing was to be published) for
// checks of one kind of event.
func checkHandled(t *testing.T, resp events.SQSEventResponse, svc *fakeService, pub *capacitytest.Publisher, want handled) outcomeDetail {
	t.Helper()
	if failed := len(resp.BatchItemFailures) == 1 && resp.BatchItemFailures[0].ItemIdentifier == "msg-1"; failed != want.failed || len(resp.BatchItemFailures) > 1 {
		t.Fatalf("batch item failures %+v, want failed=%v", resp.BatchItemFailures, want.failed)
	}
	switch {
	case want.calls == "" && len(svc.calls) != 0:
		t.Fatalf("the service was called: %+v", svc.calls)
	case want.calls != "" && (len(svc.calls) != 1 || svc.calls[0].method != want.calls):
		t.Fatalf("calls %+v, want one %s", svc.calls, want.calls)
	case want.check != nil:
		want.check(t, svc.calls[0])
	}
	var d outcomeDetail
	if want.outcome == "" {
		if len(pub.Published()) != 0 {
			t.Fatalf("published %+v, want nothing", pub.Published())
		}
		return d
	}
	if len(pub.Published()) != 1 {
		t.Fatalf("published %d events, want one %s", len(pub.Published()), want.outcome)
	}
	e := pub.Published()[0]
	mustMatchSchema(t, e)
	b, _ := json.Marshal(e.Detail)
	_ = json.Unmarshal(b, &d)
	if e.DetailType != want.outcome || e.ID != want.eventID || d.EventID != want.eventID || d.Code != want.code || !e.Time.Equal(now) {
		t.Errorf("published %s %s (code %q) at %s, want %s %s (code %q): %s", e.DetailType, e.ID, d.Code, e.Time, want.outcome, want.eventID, want.code, b)
	}
	if !strings.Contains(string(b), want.inDetail) {
		t.Errorf("detail %s does not hold %s", b, want.inDetail)
	}
	return d
}

// TestRecordOfAnotherQueue: a record that did not come from the intake queue (another queue
// mapped to the function) does not act, publishes nothing, and goes back to its queue.
func TestRecordOfAnotherQueue(t *testing.T) {
	svc := &fakeService{res: result()}
	pub := &capacitytest.Publisher{}
	b := batch(envelope("ev-1", tenant, valid), envelope("ev-2", tenant, valid))
	b.Records[0].EventSourceARN = "arn:aws:sqs:us-east-1:111111111111:someone-elses-queue"
	resp, err := newHandler(svc, pub).Handle(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "msg-1" {
		t.Errorf("failures %+v, want msg-1 back to its queue", resp.BatchItemFailures)
	}
	if len(svc.calls) != 1 || svc.calls[0].meta.EventID != "ev-2" || len(pub.Published()) != 1 {
		t.Errorf("calls %+v, published %+v: want only ev-2 applied", svc.calls, pub.Published())
	}
}

// TestNoPrincipals: an intake configured with no event principal refuses every request
// (fail closed), while our own schedules still fire (they act as their creator's key).
func TestNoPrincipals(t *testing.T) {
	for _, principals := range []capacity.EventPrincipals{nil, {}} {
		svc := &fakeService{res: result()}
		pub := &capacitytest.Publisher{}
		h := newHandler(svc, pub)
		h.Principals = principals
		if _, err := h.Handle(context.Background(), batch(envelope("ev-1", capacity.SourcePlatformScheduler, valid), topologyEnvelope("ev-2", capacity.SourceFleet, topologyValid))); err != nil {
			t.Fatal(err)
		}
		if len(svc.calls) != 0 || len(pub.Published()) != 2 || pub.Published()[0].DetailType != capacity.DetailReclaimRefused ||
			pub.Published()[1].DetailType != capacity.DetailTopologyRefused {
			t.Errorf("principals %v: calls %+v, published %+v; want both refused", principals, svc.calls, pub.Published())
		}
		if _, err := h.Handle(context.Background(), batch(envelope("ev-3", capacity.SourceSchedule, schedule))); err != nil || len(svc.calls) != 1 {
			t.Errorf("principals %v: a schedule firing: calls %+v, %v", principals, svc.calls, err)
		}
	}
}

// TestDuplicateDelivery: the queue delivers the same event twice (a retry after a lost
// acknowledgement); both calls carry the same idempotency key, so the domain replays the
// first answer, and both outcomes carry the same eventId.
func TestDuplicateDelivery(t *testing.T) {
	svc := &fakeService{res: result()}
	pub := &capacitytest.Publisher{}
	h := newHandler(svc, pub)
	for range 2 {
		if resp, err := h.Handle(context.Background(), batch(envelope("ev-1", tenant, valid))); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("Handle = %+v, %v", resp, err)
		}
	}
	if len(svc.calls) != 2 || svc.calls[0].req.IdempotencyKey != svc.calls[1].req.IdempotencyKey {
		t.Fatalf("calls %+v, want two under one key", svc.calls)
	}
	if len(pub.Published()) != 2 || pub.Published()[0].ID != pub.Published()[1].ID {
		t.Fatalf("published %+v, want the same outcome twice", pub.Published())
	}
}

// TestBatch: each record is answered on its own; only the transient one is delivered again.
func TestBatch(t *testing.T) {
	svc := &fakeService{res: result()}
	pub := &capacitytest.Publisher{}
	h := newHandler(svc, pub)
	bodies := []string{envelope("ev-1", tenant, valid), envelope("ev-2", tenant, `{}`), "not json", envelope("ev-4", capacity.SourceSchedule, schedule)}
	resp, err := h.Handle(context.Background(), batch(bodies...))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "msg-3" {
		t.Fatalf("failures %+v, want msg-3 only", resp.BatchItemFailures)
	}
	var ids []string
	for _, e := range pub.Published() {
		ids = append(ids, e.ID)
	}
	if got := strings.Join(ids, ","); got != "ev-1/completed,ev-2/refused,scheduled/sr-1/completed" {
		t.Fatalf("published %s", got)
	}

	// Out of time: the rest of the batch is left to the queue, not applied.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	svc.calls = nil
	resp, _ = h.Handle(ctx, batch(bodies[0], bodies[3]))
	if len(resp.BatchItemFailures) != 2 || len(svc.calls) != 0 {
		t.Fatalf("failures %+v after %d calls, want both records back and no call", resp.BatchItemFailures, len(svc.calls))
	}
}

// TestInboundSamples: each sample request of events/ is applied through the handler.
func TestInboundSamples(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(sampleDir, "bus-capacity-reclaim-requested-*.json"))
	if len(files) != 3 {
		t.Fatalf("%d inbound samples, want 3 (operator, tenant, schedule)", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			svc := &fakeService{res: result()}
			pub := &capacitytest.Publisher{}
			resp, err := newHandler(svc, pub).Handle(context.Background(), batch(string(raw)))
			if err != nil || len(resp.BatchItemFailures) != 0 || len(svc.calls) != 1 || len(pub.Published()) != 1 ||
				pub.Published()[0].DetailType != capacity.DetailReclaimCompleted {
				t.Fatalf("Handle = %+v, %v; calls %+v; published %+v", resp, err, svc.calls, pub.Published())
			}
			mustMatchSchema(t, pub.Published()[0])
		})
	}
}

// TestDryRunPlanETag: a dry run's outcome carries the plan's ETag in result.planEtag, as
// the HTTP answer does, and matches the Completed schema.
func TestDryRunPlanETag(t *testing.T) {
	res := result()
	// A dry run's Terminated is what it would terminate.
	res.DryRun, res.ReclaimID, res.TerminateAfter = true, "", time.Time{}
	res.PlanETag = `"0123456789abcdef0123456789abcdef"`
	svc := &fakeService{res: res}
	pub := &capacitytest.Publisher{}
	if resp, err := newHandler(svc, pub).Handle(context.Background(), batch(envelope("ev-1", tenant, valid))); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("Handle = %+v, %v", resp, err)
	}
	if len(pub.Published()) != 1 {
		t.Fatalf("published %+v", pub.Published())
	}
	mustMatchSchema(t, pub.Published()[0])
	if b, _ := json.Marshal(pub.Published()[0].Detail); !strings.Contains(string(b), `"planEtag":"\"0123456789abcdef0123456789abcdef\""`) {
		t.Errorf("detail %s lacks the plan's ETag", b)
	}
}
