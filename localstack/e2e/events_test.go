package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/capacity"
)

// The event path end to end: requests put on the environment's bus reach reclaim-events
// through the rule, the queue and the event source mapping (which the local runner polls), and
// the tests watch the bus through rules of their own, to queues they read, as a tenant would.

func ebClient() *eventbridge.Client { return eventbridge.NewFromConfig(stack.AWSConfig(endpoint)) }
func sqsClient() *sqs.Client        { return sqs.NewFromConfig(stack.AWSConfig(endpoint)) }

// busEvent is an event a watch received, and when.
type busEvent struct {
	events.CloudWatchEvent
	detail   map[string]any
	received time.Time
	body     string // the SQS message body: the event as EventBridge delivered it
}

// busWatch is a rule on the service's bus that sends the events matching its pattern to a
// queue of the test's own.
type busWatch struct {
	t        testing.TB
	queueURL string
	seen     []busEvent
}

var watchSeq atomic.Int64

// watchBus makes the rule and its queue, removed when the test ends.
func watchBus(t testing.TB, pattern map[string]any) *busWatch {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("e2e-watch-%d-%d", time.Now().UnixNano()%1e9, watchSeq.Add(1))
	q := sqsClient()
	created, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatalf("create watch queue: %v", err)
	}
	attrs, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: created.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatalf("watch queue ARN: %v", err)
	}
	raw, err := json.Marshal(pattern)
	if err != nil {
		t.Fatal(err)
	}
	eb := ebClient()
	bus := aws.String(outputs["EventBusName"])
	if _, err := eb.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String(name), EventBusName: bus, EventPattern: aws.String(string(raw))}); err != nil {
		t.Fatalf("put watch rule: %v", err)
	}
	out, err := eb.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String(name), EventBusName: bus, Targets: []ebtypes.Target{{
		Id: aws.String("watch"), Arn: aws.String(attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
	}}})
	if err != nil || out.FailedEntryCount > 0 {
		t.Fatalf("put watch target: %v %+v", err, out)
	}
	t.Cleanup(func() {
		_, _ = eb.RemoveTargets(ctx, &eventbridge.RemoveTargetsInput{Rule: aws.String(name), EventBusName: bus, Ids: []string{"watch"}})
		_, _ = eb.DeleteRule(ctx, &eventbridge.DeleteRuleInput{Name: aws.String(name), EventBusName: bus})
		_, _ = q.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: created.QueueUrl})
	})
	return &busWatch{t: t, queueURL: aws.ToString(created.QueueUrl)}
}

// receive reads what has arrived (waiting up to a second) into w.seen.
func (w *busWatch) receive() {
	w.t.Helper()
	ctx := context.Background()
	q := sqsClient()
	out, err := q.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(w.queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
	if err != nil {
		w.t.Fatalf("read watch queue: %v", err)
	}
	now := time.Now()
	for _, m := range out.Messages {
		ev := busEvent{received: now, body: aws.ToString(m.Body)}
		if err := json.Unmarshal([]byte(ev.body), &ev.CloudWatchEvent); err != nil {
			w.t.Fatalf("watch queue message is not an event: %v: %s", err, ev.body)
		}
		if err := json.Unmarshal(ev.Detail, &ev.detail); err != nil {
			w.t.Fatalf("event detail is not an object: %v: %s", err, ev.Detail)
		}
		w.seen = append(w.seen, ev)
		if _, err := q.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(w.queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
			w.t.Fatalf("delete from watch queue: %v", err)
		}
	}
}

// await returns the events matching match once there are n of them, failing at the deadline.
func (w *busWatch) await(what string, n int, within time.Duration, match func(busEvent) bool) []busEvent {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var got []busEvent
		for _, ev := range w.seen {
			if match(ev) {
				got = append(got, ev)
			}
		}
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, ev := range w.seen {
				seen = append(seen, ev.DetailType+" "+string(ev.Detail))
			}
			w.t.Fatalf("%s: %d of %d within %s; the watch saw %v", what, len(got), n, within, seen)
		}
		w.receive()
	}
}

// putRequest puts a Capacity Reclaim Requested on the bus and returns its event id.
func putRequest(t testing.TB, source string, detail any) string {
	t.Helper()
	return putEvent(t, source, capacity.DetailReclaimRequested, detail)
}

// putEvent puts an event of the detail type on the bus and returns its event id.
func putEvent(t testing.TB, source, detailType string, detail any) string {
	t.Helper()
	raw, ok := detail.(string)
	if !ok {
		b, err := json.Marshal(detail)
		if err != nil {
			t.Fatal(err)
		}
		raw = string(b)
	}
	out, err := ebClient().PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		EventBusName: aws.String(outputs["EventBusName"]), Source: aws.String(source),
		DetailType: aws.String(detailType), Detail: aws.String(raw),
	}}})
	if err != nil || out.FailedEntryCount > 0 || len(out.Entries) != 1 {
		t.Fatalf("put %s: %v %+v", detailType, err, out)
	}
	return aws.ToString(out.Entries[0].EventId)
}

// outcomeWatch watches the outcomes of the requests about node.
func outcomeWatch(t testing.TB, node string) *busWatch {
	return watchBus(t, map[string]any{
		"source":      []string{capacity.SourceCapacity},
		"detail-type": []string{capacity.DetailReclaimCompleted, capacity.DetailReclaimRefused},
		"detail":      map[string]any{"nodeId": []string{node}},
	})
}

func requestDetail(node string) map[string]any {
	return map[string]any{
		"nodeId": node, "reservationId": demo.ReservationID, "unitIds": []string{"gpu-2", "gpu-3", "gpu-0"},
		"actingOrgId": demo.OrgPlatform, "reason": "platform rebalancing",
	}
}

func byRequest(id string) func(busEvent) bool {
	return func(ev busEvent) bool { return ev.detail["requestEventId"] == id }
}

// auditByEvent returns the node's audit records that name eventID, decoded.
func auditByEvent(t testing.TB, node, eventID string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, item := range auditOf(t, node) {
		var rec map[string]any
		if err := attributevalue.UnmarshalMap(item, &rec); err != nil {
			t.Fatal(err)
		}
		if rec["eventId"] == eventID {
			out = append(out, rec)
		}
	}
	return out
}

func TestEventReclaimIsAppliedAndItsOutcomePublished(t *testing.T) {
	node := newNode(t, nil)
	w := outcomeWatch(t, node)

	id := putRequest(t, capacity.SourcePlatformScheduler, requestDetail(node))
	ev := w.await("the request's outcome", 1, 30*time.Second, byRequest(id))[0]

	if ev.DetailType != capacity.DetailReclaimCompleted || ev.Source != capacity.SourceCapacity {
		t.Fatalf("outcome %s from %s: %s", ev.DetailType, ev.Source, ev.Detail)
	}
	d := ev.detail
	result, _ := d["result"].(map[string]any)
	if d["eventId"] != id+"/completed" || d["requestSource"] != capacity.SourcePlatformScheduler || d["reservationId"] != demo.ReservationID ||
		result == nil || !slices.Equal(strs(result["terminated"]), []string{"vm-spot-1", "vm-spot-2"}) ||
		!slices.Equal(strs(result["skipped"]), []string{"vm-res-1"}) || result["reclaimId"] == "" || result["id"] != demo.ReservationID {
		t.Fatalf("Completed detail: %s", ev.Detail)
	}

	st := loadNode(t, node)
	for _, vm := range st.VMs {
		if (vm.ID == "vm-spot-1" || vm.ID == "vm-spot-2") && vm.ReclaimID != result["reclaimId"] {
			t.Errorf("VM %s reclaimed by %q, want %v", vm.ID, vm.ReclaimID, result["reclaimId"])
		}
	}

	// The audit record says it came by event and names the event.
	recs := auditByEvent(t, node, id)
	if len(recs) != 1 || recs[0]["via"] != capacity.ViaEvent {
		t.Errorf("audit records naming event %s: %v", id, recs)
	}
}

func TestDuplicateEventDeliveryEvictsOnce(t *testing.T) {
	tests := []struct {
		name string
		// deliver sends the request twice, in its way, and returns the two request event ids.
		deliver func(t *testing.T, node string) (string, string)
	}{
		{
			// PutEvents gives each put a new event id: an explicit key makes them one request.
			name: "put twice with one idempotency key",
			deliver: func(t *testing.T, node string) (string, string) {
				d := requestDetail(node)
				d["idempotencyKey"] = "dup-" + node
				return putRequest(t, capacity.SourcePlatformScheduler, d), putRequest(t, capacity.SourcePlatformScheduler, d)
			},
		},
		{
			// The queue delivers the same message again (at least once): the event id is the key.
			name: "the same event delivered twice",
			deliver: func(t *testing.T, node string) (string, string) {
				requests := watchBus(t, map[string]any{
					"source": []string{capacity.SourcePlatformScheduler}, "detail-type": []string{capacity.DetailReclaimRequested},
					"detail": map[string]any{"nodeId": []string{node}},
				})
				id := putRequest(t, capacity.SourcePlatformScheduler, requestDetail(node))
				ev := requests.await("the request as delivered", 1, 30*time.Second, func(ev busEvent) bool { return ev.ID == id })[0]
				if _, err := sqsClient().SendMessage(context.Background(), &sqs.SendMessageInput{
					QueueUrl: aws.String(outputs["ReclaimRequestsQueueUrl"]), MessageBody: aws.String(ev.body),
				}); err != nil {
					t.Fatalf("deliver again: %v", err)
				}
				return id, id
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := newNode(t, nil)
			w := outcomeWatch(t, node)

			id1, id2 := tt.deliver(t, node)
			var outcomes []busEvent
			if id1 == id2 {
				outcomes = w.await("both outcomes", 2, 30*time.Second, byRequest(id1))
			} else {
				outcomes = append(w.await("the first outcome", 1, 30*time.Second, byRequest(id1)),
					w.await("the second outcome", 1, 30*time.Second, byRequest(id2))...)
			}

			var reclaimIDs []string
			for _, ev := range outcomes {
				result, _ := ev.detail["result"].(map[string]any)
				if ev.DetailType != capacity.DetailReclaimCompleted || result == nil ||
					!slices.Equal(strs(result["terminated"]), []string{"vm-spot-1", "vm-spot-2"}) {
					t.Fatalf("outcome %s: %s", ev.DetailType, ev.Detail)
				}
				reclaimIDs = append(reclaimIDs, result["reclaimId"].(string))
			}
			if reclaimIDs[0] != reclaimIDs[1] {
				t.Fatalf("two reclaims %v: the duplicate evicted again", reclaimIDs)
			}
			if id1 == id2 && outcomes[0].detail["eventId"] != outcomes[1].detail["eventId"] {
				t.Errorf("the replayed outcome has another eventId: %v, %v", outcomes[0].detail["eventId"], outcomes[1].detail["eventId"])
			}

			// One operation: each VM is terminated once.
			if op := awaitOperation(t, node, reclaimIDs[0], 60*time.Second); op["state"] != "completed" {
				t.Fatalf("operation: %v", op)
			}
			for _, vm := range []string{"vm-spot-1", "vm-spot-2"} {
				if n := agents.Terminations(node, vm); n != 1 {
					t.Errorf("%s terminated %d times, want 1", vm, n)
				}
			}
		})
	}
}

// scheduleReclaim schedules, with key, a reclaim of gpu-2, gpu-3 and gpu-0 on node, ahead
// from now (to the second), fails the test unless it is accepted, and returns its id, its at
// and the Location of the answer.
func scheduleReclaim(t *testing.T, node, key string, ahead time.Duration) (id string, at time.Time, location string) {
	t.Helper()
	at = time.Now().UTC().Add(ahead).Truncate(time.Second)
	r := call(t, http.MethodPost, reclaimPath(node), key, map[string]any{
		"unitIds": []string{"gpu-2", "gpu-3", "gpu-0"}, "at": at.Format(time.RFC3339),
	})
	id, _ = r.json(t)["id"].(string)
	if r.Status != http.StatusAccepted || id == "" {
		t.Fatalf("schedule: %d %s", r.Status, r.Body)
	}
	return id, at, r.Header.Get("Location")
}

func TestScheduledReclaimFires(t *testing.T) {
	node := newNode(t, nil)
	w := outcomeWatch(t, node)

	// A few seconds ahead: the local runner fires due schedules twice a second.
	at := time.Now().UTC().Add(3 * time.Second).Truncate(time.Second)
	r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{
		"unitIds": []string{"gpu-2", "gpu-3", "gpu-0"}, "reason": "nightly training", "at": at.Format(time.RFC3339),
	})
	if r.Status != http.StatusAccepted {
		t.Fatalf("schedule: %d %s", r.Status, r.Body)
	}
	sr := r.json(t)
	sid, _ := sr["id"].(string)
	location := r.Header.Get("Location")
	if sid == "" || sr["state"] != "scheduled" || location != "/v1/nodes/"+node+"/reservations/"+demo.ReservationID+"/scheduled-reclaims/"+sid {
		t.Fatalf("scheduled reclaim %s, Location %q", r.Body, location)
	}

	ev := w.await("the scheduled reclaim's outcome", 1, 30*time.Second, func(ev busEvent) bool { return ev.detail["scheduledReclaimId"] == sid })[0]
	result, _ := ev.detail["result"].(map[string]any)
	if ev.DetailType != capacity.DetailReclaimCompleted || ev.detail["eventId"] != "scheduled/"+sid+"/completed" ||
		ev.detail["requestSource"] != capacity.SourceSchedule || result == nil ||
		!slices.Equal(strs(result["terminated"]), []string{"vm-spot-1", "vm-spot-2"}) {
		t.Fatalf("outcome %s: %s", ev.DetailType, ev.Detail)
	}
	if ev.received.Before(at) {
		t.Errorf("fired before its time: outcome at %s, at %s", ev.received, at)
	}

	got := call(t, http.MethodGet, location, keyOwner, nil)
	g := got.json(t)
	if got.Status != http.StatusOK || g["state"] != "completed" || g["reclaimId"] != result["reclaimId"] || g["firedAt"] == nil {
		t.Fatalf("GET after firing: %d %s", got.Status, got.Body)
	}
}

// TestScheduledReclaimOfARevokedKeyIsRefused: a key schedules a reclaim and is revoked
// before it fires; the firing reads the key (reclaim-events' GetItem on the keys table), is
// refused with creator_key_invalid, and the scheduled reclaim ends refused, as its GET and the
// reservation's list of scheduled reclaims show; no VM is touched.
func TestScheduledReclaimOfARevokedKeyIsRefused(t *testing.T) {
	node := newNode(t, nil)
	w := outcomeWatch(t, node)

	created := call(t, http.MethodPost, "/v1/keys", keyOperator, map[string]any{
		"orgId": demo.OrgOwner, "permissions": []string{capacity.PermCapacity}, "description": "e2e: revoked before its scheduled reclaim fires",
	})
	var k struct {
		Key    struct{ KeyID string }
		Secret string
	}
	if created.Status != http.StatusCreated || json.Unmarshal(created.Body, &k) != nil || k.Secret == "" {
		t.Fatalf("create key: %d %s", created.Status, created.Body)
	}
	sid, _, location := scheduleReclaim(t, node, k.Secret, 4*time.Second)
	if rv := call(t, http.MethodPost, "/v1/keys/"+k.Key.KeyID+"/revoke", keyOperator, map[string]any{"reason": "e2e"}); rv.Status != http.StatusOK {
		t.Fatalf("revoke: %d %s", rv.Status, rv.Body)
	}

	ev := w.await("the scheduled reclaim's outcome", 1, 30*time.Second, func(ev busEvent) bool { return ev.detail["scheduledReclaimId"] == sid })[0]
	if ev.DetailType != capacity.DetailReclaimRefused || ev.detail["code"] != string(capacity.CodeCreatorKeyInvalid) {
		t.Fatalf("outcome %s: %s", ev.DetailType, ev.Detail)
	}
	got := call(t, http.MethodGet, location, keyOwner, nil)
	g := got.json(t)
	if got.Status != http.StatusOK || g["state"] != "refused" || g["code"] != string(capacity.CodeCreatorKeyInvalid) || g["firedAt"] == nil {
		t.Fatalf("GET after the firing: %d %s", got.Status, got.Body)
	}
	// The reservation's list (API Gateway, the api function, the byState index) shows it
	// too, to the owner; the audience gets the reservation's 404.
	listPath := "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/scheduled-reclaims"
	list := call(t, http.MethodGet, listPath+"?limit=10", keyOwner, nil)
	var page struct {
		ScheduledReclaims []map[string]any `json:"scheduledReclaims"`
	}
	if list.Status != http.StatusOK || json.Unmarshal(list.Body, &page) != nil || len(page.ScheduledReclaims) != 1 ||
		page.ScheduledReclaims[0]["id"] != sid || page.ScheduledReclaims[0]["state"] != "refused" {
		t.Fatalf("list: %d %s", list.Status, list.Body)
	}
	if a := call(t, http.MethodGet, listPath, keyAudience, nil); a.Status != http.StatusNotFound {
		t.Errorf("audience list: %d %s", a.Status, a.Body)
	}
	for _, vm := range []string{"vm-spot-1", "vm-spot-2"} {
		if n := agents.TerminateCalls(node, vm); n != 0 {
			t.Errorf("%s got %d terminate calls", vm, n)
		}
	}
}

// TestEarlyScheduledFiringIsRefused: a firing event put on the bus long before the scheduled
// reclaim's at (the local stack does not enforce the bus policy that keeps other senders from
// the schedule's source) is refused with scheduled_reclaim_not_due under its own event id and
// audited; the scheduled reclaim stays scheduled and its real firing runs on time.
func TestEarlyScheduledFiringIsRefused(t *testing.T) {
	node := newNode(t, nil)
	w := outcomeWatch(t, node)
	sid, at, location := scheduleReclaim(t, node, keyOwner, 45*time.Second)

	id := putRequest(t, capacity.SourceSchedule, map[string]any{"nodeId": node, "reservationId": demo.ReservationID, "scheduledReclaimId": sid})
	ev := w.await("the early firing's refusal", 1, 30*time.Second, byRequest(id))[0]
	if ev.DetailType != capacity.DetailReclaimRefused || ev.detail["code"] != string(capacity.CodeScheduledReclaimNotDue) || ev.detail["eventId"] != id+"/refused" {
		t.Fatalf("outcome %s: %s", ev.DetailType, ev.Detail)
	}
	if recs := auditByEvent(t, node, id); len(recs) != 1 || recs[0]["Outcome"] != string(capacity.CodeScheduledReclaimNotDue) {
		t.Errorf("audit records of the early firing: %v", recs)
	}
	if got := call(t, http.MethodGet, location, keyOwner, nil).json(t); got["state"] != "scheduled" {
		t.Fatalf("after the early firing: %v", got)
	}
	for _, vm := range []string{"vm-spot-1", "vm-spot-2"} {
		if n := agents.TerminateCalls(node, vm); n != 0 {
			t.Errorf("%s got %d terminate calls before the reclaim's time", vm, n)
		}
	}

	real := w.await("the scheduled firing's outcome", 1, 90*time.Second, func(ev busEvent) bool {
		return ev.detail["eventId"] == "scheduled/"+sid+"/completed"
	})[0]
	if real.received.Before(at) {
		t.Errorf("completed at %s, before its at %s", real.received, at)
	}
}

func TestGraceNoticeReachesTheTenantBeforeTermination(t *testing.T) {
	node := newNode(t, nil)
	// The rule a tenant would write for its own notices.
	tenant := watchBus(t, map[string]any{
		"source": []string{capacity.SourceCapacity}, "detail-type": []string{capacity.DetailEvictionNotice},
		"detail": map[string]any{"orgId": []string{demo.OrgBuyer}},
	})

	answer, reclaimID, terminateAfter := reclaimVictimsWithGrace(t, node, 4)

	notices := tenant.await("both eviction notices", 2, 30*time.Second, func(ev busEvent) bool { return ev.detail["nodeId"] == node })
	noticed := map[string]time.Time{}
	for _, ev := range notices {
		d := ev.detail
		vm, _ := d["vmId"].(string)
		if d["reclaimId"] != reclaimID || d["orgId"] != demo.OrgBuyer || d["reasonCode"] != capacity.ReasonReclaimedByOwner ||
			d["terminateAfter"] != answer["terminateAfter"] || d["eventId"] != reclaimID+"/notice/"+vm {
			t.Errorf("notice: %s", ev.Detail)
		}
		noticed[vm] = ev.received
	}

	if op := awaitOperation(t, node, reclaimID, 60*time.Second); op["state"] != "completed" {
		t.Fatalf("operation: %v", op)
	}
	for _, vm := range []string{"vm-spot-1", "vm-spot-2"} {
		at := agents.TerminatedAt(node, vm)
		switch {
		case noticed[vm].IsZero():
			t.Errorf("%s: no notice", vm)
		case at.IsZero():
			t.Errorf("%s: never terminated", vm)
		case !noticed[vm].Before(at):
			t.Errorf("%s: notice received %s, not before its termination %s", vm, noticed[vm], at)
		case at.Before(terminateAfter):
			t.Errorf("%s: terminated %s, before terminateAfter %s", vm, at, terminateAfter)
		}
	}
}

func TestInvalidEventIsRefusedAndChangesNothing(t *testing.T) {
	tests := []struct {
		name   string
		detail func(node string) any
		code   string
	}{
		{name: "unknown member", code: "invalid_request", detail: func(node string) any {
			d := requestDetail(node)
			d["force"] = true
			return d
		}},
		{name: "no acting org", code: "invalid_request", detail: func(node string) any {
			d := requestDetail(node)
			delete(d, "actingOrgId")
			return d
		}},
		// The platform's scheduler is the principal (cdk.json eventPrincipals): a detail naming
		// another org does not make it act for that org.
		{name: "acting for another org", code: "forbidden", detail: func(node string) any {
			d := requestDetail(node)
			d["actingOrgId"] = demo.OrgOwner
			return d
		}},
		{name: "null member", code: "invalid_request", detail: func(node string) any {
			d := requestDetail(node)
			d["reason"] = nil
			return d
		}},
		{name: "grace beyond 120 s", code: "invalid_request", detail: func(node string) any {
			d := requestDetail(node)
			d["graceSeconds"] = 121
			return d
		}},
		{name: "units not a list", code: "invalid_request", detail: func(node string) any {
			d := requestDetail(node)
			d["unitIds"] = "gpu-2"
			return d
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := newNode(t, nil)
			w := outcomeWatch(t, node)
			before, auditBefore := partition(t, node), len(auditOf(t, node))

			id := putRequest(t, capacity.SourcePlatformScheduler, tt.detail(node))
			ev := w.await("the refusal", 1, 30*time.Second, byRequest(id))[0]
			if ev.DetailType != capacity.DetailReclaimRefused || ev.detail["code"] != tt.code || ev.detail["eventId"] != id+"/refused" ||
				ev.detail["detail"] == "" || ev.detail["nodeId"] != node {
				t.Fatalf("outcome %s: %s", ev.DetailType, ev.Detail)
			}
			assertUnchanged(t, node, before)
			if n := len(auditOf(t, node)); n != auditBefore {
				t.Errorf("audit records %d, want %d", n, auditBefore)
			}
			if n := agents.TerminateCalls(node, "vm-spot-1"); n != 0 {
				t.Errorf("vm-spot-1 got %d terminate calls", n)
			}
		})
	}
}

// TestDirectInvokeOfTheIntakeChangesNothing: a lambda:InvokeFunction of reclaim-events with a
// record made up in full (the intake queue's ARN, an accepted source acting for its own org,
// the function's own account and region) changes nothing: the queue does not recognise the
// record's receipt handle, so the function refuses it before the domain sees it.
func TestDirectInvokeOfTheIntakeChangesNothing(t *testing.T) {
	node := newNode(t, nil)
	before, auditBefore := partition(t, node), len(auditOf(t, node))
	ctx := context.Background()
	cfg := stack.AWSConfig(endpoint)
	lc := lambda.NewFromConfig(cfg)
	fn, err := lc.GetFunctionConfiguration(ctx, &lambda.GetFunctionConfigurationInput{FunctionName: aws.String(outputs["ReclaimEventsFunctionName"])})
	if err != nil {
		t.Fatal(err)
	}
	vars := fn.Environment.Variables
	detail, err := json.Marshal(requestDetail(node))
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"version":"0","id":"forged-%s","detail-type":%q,"source":%q,"account":%q,"time":%q,"region":%q,"resources":[],"detail":%s}`,
		node, capacity.DetailReclaimRequested, capacity.SourcePlatformScheduler, vars["EVENT_ACCOUNT"], time.Now().UTC().Format(time.RFC3339), cfg.Region, detail)
	payload, err := json.Marshal(events.SQSEvent{Records: []events.SQSMessage{{
		MessageId: "forged-" + node, ReceiptHandle: "AQEBmadeup", Body: body, EventSource: "aws:sqs",
		EventSourceARN: vars["INTAKE_QUEUE_ARN"], AWSRegion: cfg.Region,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(outputs["ReclaimEventsFunctionName"]), Payload: payload})
	if err != nil || out.FunctionError != nil {
		t.Fatalf("invoke: %v %s", err, out.Payload)
	}
	var resp events.SQSEventResponse
	if err := json.Unmarshal(out.Payload, &resp); err != nil || len(resp.BatchItemFailures) != 1 {
		t.Errorf("answer %s, want the record reported failed", out.Payload)
	}
	assertUnchanged(t, node, before)
	if n := len(auditOf(t, node)); n != auditBefore {
		t.Errorf("audit records %d, want %d", n, auditBefore)
	}
	if n := agents.TerminateCalls(node, "vm-spot-1"); n != 0 {
		t.Errorf("vm-spot-1 got %d terminate calls", n)
	}
}
