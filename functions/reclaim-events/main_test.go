package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/emf"
)

// sqsBatch wraps a sample event as the queue delivers it.
func sqsBatch(t *testing.T, file string) events.SQSEvent {
	t.Helper()
	raw, err := os.ReadFile("../../events/" + file)
	if err != nil {
		t.Fatal(err)
	}
	return events.SQSEvent{Records: []events.SQSMessage{{MessageId: "msg-1", Body: string(raw)}}}
}

type outcome struct {
	EventID, Code string
	Result        struct {
		ReclaimID      string   `json:"reclaimId"`
		Terminated     []string `json:"terminated"`
		WouldTerminate []string `json:"wouldTerminate"`
		TerminateAfter string   `json:"terminateAfter"`
	}
}

func decode(t *testing.T, e capacity.Event) outcome {
	t.Helper()
	b, err := json.Marshal(e.Detail)
	if err != nil {
		t.Fatal(err)
	}
	var o outcome
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestSampleRequests runs the sample requests of events/ through the wired function (event
// API, domain, store on the emulator, demo data) as the queue delivers them.
func TestSampleRequests(t *testing.T) {
	env := dynamotest.New(t)
	ctx := context.Background()
	if err := env.Store.Put(ctx, demo.Seed(time.Now())); err != nil {
		t.Fatal(err)
	}
	bus := &capacitytest.Publisher{}
	// The principals an environment's cdk.json would configure for the samples' sources.
	principals, err := capacity.ParseEventPrincipals(`[
		{"source":"openrelay.scheduler","orgId":"org-platform","operator":true,"permissions":["reservation.capacity"]},
		{"source":"example.tenant-automation","orgId":"org-owner","permissions":["reservation.capacity"]},
		{"source":"openrelay.fleet","orgId":"platform","operator":true,"permissions":["node.topology"]}]`)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandler(env.Store, nil, emf.New(io.Discard, "local"), bus, principals, slog.New(slog.NewJSONHandler(io.Discard, nil)))

	// The platform scheduler's request, delivered twice: applied once, the same outcome twice.
	for range 2 {
		resp, err := h.Handle(ctx, sqsBatch(t, "bus-capacity-reclaim-requested-operator.json"))
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("Handle = %+v, %v", resp, err)
		}
	}
	published := bus.Take()
	if len(published) != 2 || published[0].DetailType != capacity.DetailReclaimCompleted {
		t.Fatalf("published %+v, want two Completed", published)
	}
	first, second := decode(t, published[0]), decode(t, published[1])
	if first.Result.ReclaimID == "" || len(first.Result.Terminated) != 2 || first.Result.TerminateAfter == "" ||
		second.EventID != first.EventID || second.Result.ReclaimID != first.Result.ReclaimID {
		t.Fatalf("outcomes %+v and %+v, want one reclaim evicting both spot VMs, replayed", first, second)
	}

	// Its audit record says it came by event and names the event.
	var audited bool
	for _, item := range env.Items(t, env.Store.AuditTable) {
		var rec struct{ Via, EventID, Action, Outcome string }
		if err := attributevalue.UnmarshalMap(item, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Action == capacity.ActionReclaim && rec.Via == capacity.ViaEvent && rec.EventID == "7f3c2a1e-5b6d-4c8e-9f0a-1b2c3d4e5f60" {
			audited = true
		}
	}
	if !audited {
		t.Fatal("no audit record of the reclaim with via event and the event's id")
	}

	// The tenant's dry run answers the plan (the units are now exclusive: nothing to evict).
	if resp, err := h.Handle(ctx, sqsBatch(t, "bus-capacity-reclaim-requested-tenant.json")); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("Handle = %+v, %v", resp, err)
	}
	published = bus.Take()
	if len(published) != 1 || published[0].DetailType != capacity.DetailReclaimCompleted || decode(t, published[0]).Result.WouldTerminate == nil {
		t.Fatalf("published %+v, want a dry run's Completed", published)
	}

	// A schedule firing for a scheduled reclaim that does not exist is refused, for good.
	if resp, err := h.Handle(ctx, sqsBatch(t, "bus-capacity-reclaim-requested-schedule.json")); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("Handle = %+v, %v", resp, err)
	}
	published = bus.Take()
	if len(published) != 1 || published[0].DetailType != capacity.DetailReclaimRefused || decode(t, published[0]).Code != "not_found" {
		t.Fatalf("published %+v, want a not_found refusal", published)
	}

	// The fleet's topology change (gpu-7 removed), delivered twice: applied once, as an
	// operator, moving the active reservation to review; the same outcome twice.
	for range 2 {
		if resp, err := h.Handle(ctx, sqsBatch(t, "bus-node-topology-changed.json")); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("Handle = %+v, %v", resp, err)
		}
	}
	published = bus.Take()
	if len(published) != 2 || published[0].DetailType != capacity.DetailTopologyApplied || published[0].ID != published[1].ID {
		t.Fatalf("published %+v, want the same Node Topology Applied twice", published)
	}
	var applied struct {
		Result struct {
			Node struct {
				TopologyGen int64 `json:"topologyGen"`
			} `json:"node"`
			Changed        bool     `json:"changed"`
			RemovedUnitIDs []string `json:"removedUnitIds"`
			NeedsReview    []string `json:"needsReview"`
		} `json:"result"`
	}
	for _, e := range published {
		b, _ := json.Marshal(e.Detail)
		if err := json.Unmarshal(b, &applied); err != nil {
			t.Fatal(err)
		}
		r := applied.Result
		if !r.Changed || r.Node.TopologyGen != 2 || !slices.Equal(r.RemovedUnitIDs, []string{"gpu-7"}) || !slices.Contains(r.NeedsReview, demo.ReservationID) {
			t.Fatalf("outcome %s, want gpu-7 removed at generation 2 and %s in review", b, demo.ReservationID)
		}
	}
	st, err := env.Store.LoadNode(ctx, demo.NodeID, "")
	if err != nil {
		t.Fatal(err)
	}
	if r := st.Reservation(demo.ReservationID); st.Node.TopologyGen != 2 || r == nil || r.Status != capacity.StatusNeedsReview {
		t.Fatalf("after the change: node generation %d, reservation %+v", st.Node.TopologyGen, r)
	}
}

// TestReadSettings: the function reads exactly the variables envvar.ReclaimEvents declares: an
// undeclared read, or a declared one left unread, would fail it at start.
func TestReadSettings(t *testing.T) {
	e := envvar.New(envvar.ReclaimEvents, []string{"APP_ENV=dev", "LOG_LEVEL=info", "STATE_TABLE=s", "AUDIT_TABLE=a", "KEYS_TABLE=k", "STATE_MACHINE_ARN=arn:sm", "EVENT_BUS_NAME=b", "EVENT_PRINCIPALS=[]", "INTAKE_QUEUE_ARN=arn:q", "INTAKE_QUEUE_URL=https://q", "EVENT_ACCOUNT=1", "HISTORY_RETENTION=2160h", "AWS_REGION=r"})
	if s := readSettings(e); e.Err() != nil || s.origin.Region != "r" || s.origin.Bus != "b" || s.queueURL != "https://q" || s.principals == nil {
		t.Fatalf("settings %+v, error %v", s, e.Err())
	}
}
