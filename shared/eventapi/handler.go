// Package eventapi is the event API, as shared/httpapi is the HTTP one: it applies the
// Capacity Reclaim Requested and Node Topology Changed events an SQS queue delivers (from the
// bus) through the same domain calls, checks and error codes as HTTP, and publishes each
// request's outcome.
package eventapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// Service is the domain the event API drives.
type Service interface {
	Reclaim(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error)
	FireScheduledReclaim(ctx context.Context, nodeID, reservationID, scheduledID string, meta capacity.RequestMeta) (*capacity.CapacityResult, error)
	SetTopology(ctx context.Context, p capacity.Principal, req capacity.TopologyRequest, meta capacity.RequestMeta) (*capacity.TopologyResult, error)
}

// Handler applies a batch of queued reclaim requests.
type Handler struct {
	Service   Service
	Publisher capacity.Publisher
	// Principals are the accepted sources and whom each acts as; an event from any other
	// source is refused (forbidden), and none is accepted when it is empty. Our own schedules
	// (capacity.SourceSchedule) act as the key that created the scheduled reclaim instead.
	Principals capacity.EventPrincipals
	// Origin is where a genuine request comes from; records from anywhere else do not act.
	Origin Origin
	// Receipts proves each record was received from the intake queue (nil: not checked, in
	// tests that build records by hand); a record it does not prove is refused, and
	// Refusals counts it (IntakeRecordsRefused).
	Receipts Receipts
	Refusals RefusalMetrics
	Logger   *slog.Logger
	// Now is replaceable for tests.
	Now func() time.Time
}

// Handle applies each record and reports the ones to deliver again: a transient failure
// (the queue retries, then moves the message to the dead-letter queue) or an outcome that
// could not be published (the retry replays the request under its idempotency key and
// publishes the same outcome, with the same eventId). A refusal is final: published and
// acknowledged.
func (h *Handler) Handle(ctx context.Context, batch events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	retry := func(rec events.SQSMessage) {
		resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
	}
	var ours []events.SQSMessage
	for _, rec := range batch.Records {
		if err := h.Origin.checkQueue(rec); err != nil {
			// Not our queue: nothing in it may act, and it is not ours to delete. It goes back
			// to its queue (and that queue's dead letters); the error log and the function's
			// error metric say something is mapped to this function that should not be.
			h.logger().ErrorContext(ctx, "record refused", "message_id", rec.MessageId, "err", err)
			retry(rec)
			continue
		}
		ours = append(ours, rec)
	}
	received, err := h.checkReceipts(ctx, ours)
	if err != nil { // nothing proven: every record waits for another delivery
		h.logger().ErrorContext(ctx, "receipts not checked; the batch will be retried", "err", err)
		for _, rec := range ours {
			retry(rec)
		}
		return resp, nil
	}
	for i, rec := range ours {
		if err := received[i]; err != nil {
			// A record the queue never handed out (a direct invoke) must not act, whatever
			// its fields claim; a genuine one the queue no longer holds comes again.
			if errors.Is(err, ErrNotReceived) {
				h.logger().ErrorContext(ctx, "record refused: not received from the intake queue", "message_id", rec.MessageId, "err", err)
				if h.Refusals != nil {
					h.Refusals.IntakeRecordRefused(ctx, rec.MessageId)
				}
			} else {
				h.logger().WarnContext(ctx, "receipt not checked; the record will be retried", "message_id", rec.MessageId, "err", err)
			}
			retry(rec)
			continue
		}
		if ctx.Err() != nil { // out of time: leave the rest to the queue
			retry(rec)
			continue
		}
		if err := h.record(ctx, rec); err != nil {
			h.logger().ErrorContext(ctx, "request will be retried", "message_id", rec.MessageId, "err", err)
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
		}
	}
	return resp, nil
}

// RefusalMetrics counts the records refused for not coming from the intake queue.
type RefusalMetrics interface {
	IntakeRecordRefused(ctx context.Context, messageID string)
}

// checkReceipts proves the records' receipt (all nil without Receipts).
func (h *Handler) checkReceipts(ctx context.Context, recs []events.SQSMessage) ([]error, error) {
	if h.Receipts == nil || len(recs) == 0 {
		return make([]error, len(recs)), nil
	}
	return h.Receipts.Check(ctx, recs)
}

// request is one decoded record.
type request struct {
	envelope    events.CloudWatchEvent
	body        string // the record's raw event
	key         string // the request key the outcome's eventId derives from
	scheduledID string
	nodeID      string
	reservation string
}

// record applies one record; an error means it must be delivered again.
func (h *Handler) record(ctx context.Context, rec events.SQSMessage) error {
	var env events.CloudWatchEvent
	if err := json.Unmarshal([]byte(rec.Body), &env); err != nil || env.ID == "" || env.Source == "" {
		// Not an EventBridge event: nothing to answer to. The dead-letter queue keeps it
		// for a look, and its alarm says something is misrouted.
		return fmt.Errorf("message %s is not an EventBridge event", rec.MessageId)
	}
	if env.DetailType == capacity.DetailTopologyChanged {
		return h.topologyRecord(ctx, rec, env)
	}
	req := request{envelope: env, body: rec.Body, key: env.ID}
	meta := capacity.RequestMeta{RequestID: rec.MessageId, Via: capacity.ViaEvent, EventID: env.ID}
	start := time.Now()
	res, err := h.apply(ctx, &req, &meta)
	attrs := []any{"event_id", env.ID, "source", env.Source, "via", meta.Via, "node_id", req.nodeID,
		"reservation_id", req.reservation, "scheduled_reclaim_id", req.scheduledID,
		"duration_ms", time.Since(start).Milliseconds()}
	if err != nil {
		attrs = append(attrs, "code", capacity.ErrorCode(err))
		if transient(err) {
			return fmt.Errorf("reclaim request %s from %s: %w", env.ID, env.Source, err)
		}
	}
	if perr := h.publish(ctx, req, res, err); perr != nil {
		return fmt.Errorf("publish the outcome of reclaim request %s: %w", env.ID, perr)
	}
	if err != nil {
		h.logger().InfoContext(ctx, "reclaim request refused", attrs...)
	} else {
		attrs = append(attrs, "reclaim_id", res.ReclaimID, "dry_run", res.DryRun, "replayed", res.Replayed)
		h.logger().InfoContext(ctx, "reclaim request applied", attrs...)
	}
	return nil
}

// apply checks the event and runs it through the domain.
func (h *Handler) apply(ctx context.Context, req *request, meta *capacity.RequestMeta) (*capacity.CapacityResult, error) {
	env := req.envelope
	// The ids the outcome names, read loosely so that a refused event names them too.
	ids := looseIDs(env.Detail)
	req.nodeID, req.reservation = ids["nodeId"], ids["reservationId"]
	if err := h.Origin.checkEvent(env, req.body); err != nil {
		return nil, err
	}
	if env.Source == capacity.SourceSchedule {
		meta.Via = capacity.ViaSchedule
		if sid := ids["scheduledReclaimId"]; sid != "" {
			// Scheduler may put one firing twice under different event ids: one outcome.
			req.key, req.scheduledID = "scheduled/"+sid, sid
		}
		var d ScheduleDetail
		if err := decodeDetail(env.Detail, &d, scheduleRequired); err != nil {
			return nil, err
		}
		if err := checkType(env); err != nil {
			return nil, err
		}
		return h.Service.FireScheduledReclaim(ctx, d.NodeID, d.ReservationID, d.ScheduledReclaimID, *meta)
	}
	principal, ok := h.Principals.Lookup(env.Source)
	if !ok || !principal.CanReclaim() {
		return nil, capacity.Errorf(capacity.CodeForbidden, "source %q may not request reclaims", env.Source)
	}
	var d RequestDetail
	if err := decodeDetail(env.Detail, &d, requestRequired); err != nil {
		return nil, err
	}
	if err := checkType(env); err != nil {
		return nil, err
	}
	if !capacity.ValidID(d.ActingOrgID) {
		return nil, capacity.Errorf(capacity.CodeInvalidRequest, "actingOrgId must be an org id: letters, digits, '.', '_', ':' or '-', at most %d", capacity.MaxIDLen)
	}
	// The source is the principal: actingOrgId only confirms whom the sender means to act for.
	if d.ActingOrgID != principal.OrgID {
		return nil, capacity.Errorf(capacity.CodeForbidden, "source %q may act only for its own org, not %q", env.Source, d.ActingOrgID)
	}
	key := d.IdempotencyKey
	if key == "" {
		key = "event:" + env.ID // a redelivered event replays, never evicts twice
	}
	return h.Service.Reclaim(ctx, principal.Principal(), capacity.CapacityRequest{
		NodeID: d.NodeID, ReservationID: d.ReservationID, UnitIDs: d.UnitIDs, DryRun: d.DryRun,
		Reason: d.Reason, IdempotencyKey: key, GraceSeconds: d.GraceSeconds,
	}, *meta)
}

// looseIDs returns the well-formed string ids among the detail's nodeId, reservationId and
// scheduledReclaimId, whatever else the detail holds.
func looseIDs(detail []byte) map[string]string {
	var members map[string]json.RawMessage
	_ = json.Unmarshal(detail, &members) // a detail that is no object names nothing
	out := map[string]string{}
	for _, name := range []string{"nodeId", "reservationId", "scheduledReclaimId"} {
		var id string
		if json.Unmarshal(members[name], &id) == nil && capacity.ValidID(id) {
			out[name] = id
		}
	}
	return out
}

func checkType(env events.CloudWatchEvent) error {
	if env.DetailType != capacity.DetailReclaimRequested {
		return capacity.Errorf(capacity.CodeInvalidRequest, "detail-type must be %q", capacity.DetailReclaimRequested)
	}
	return nil
}

// publish puts the request's outcome on the bus: Completed with the HTTP answer's body, or
// Refused with the problem's code and detail.
func (h *Handler) publish(ctx context.Context, req request, res *capacity.CapacityResult, err error) error {
	now := h.now()
	if err != nil {
		key := req.key
		if capacity.ErrorCode(err) == capacity.CodeScheduledReclaimNotDue {
			// Not the scheduled reclaim's outcome (it stays scheduled): named by the refused
			// event, so that an early firing cannot take the id of the real firing's outcome.
			key = req.envelope.ID
		}
		d := capacity.ReclaimRefusedDetail{
			EventID: key + "/refused", RequestEventID: req.envelope.ID, RequestSource: req.envelope.Source,
			ScheduledReclaimID: req.scheduledID, NodeID: req.nodeID, ReservationID: req.reservation,
			Code: string(capacity.ErrorCode(err)), Detail: capacity.ErrorMessage(err),
		}
		return h.Publisher.Publish(ctx, []capacity.Event{{ID: d.EventID, DetailType: capacity.DetailReclaimRefused, Detail: d, Time: now}})
	}
	d := capacity.ReclaimCompletedDetail{
		EventID: req.key + "/completed", RequestEventID: req.envelope.ID, RequestSource: req.envelope.Source,
		ScheduledReclaimID: req.scheduledID, NodeID: req.nodeID, ReservationID: req.reservation,
		Result: wire.Reclaim(res),
	}
	return h.Publisher.Publish(ctx, []capacity.Event{{ID: d.EventID, DetailType: capacity.DetailReclaimCompleted, Detail: d, Time: now}})
}

// transient reports whether err may pass on a retry: the domain's internal, throttled and
// concurrent_modification, or anything that is not an application error. Every other code
// is a refusal the same request would meet again. scheduling_unavailable is a deployment
// missing its schedule store, not a refusal of the request: the firing waits in the queue,
// then in the dead-letter queue (alarmed), rather than being lost.
func transient(err error) bool {
	var e *capacity.Error
	if !errors.As(err, &e) {
		return true
	}
	switch e.Code {
	case capacity.CodeInternal, capacity.CodeThrottled, capacity.CodeConcurrentModification,
		capacity.CodeSchedulingUnavailable:
		return true
	}
	return false
}

func (h *Handler) now() time.Time {
	if h.Now != nil {
		return h.Now().UTC()
	}
	return time.Now().UTC()
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}
