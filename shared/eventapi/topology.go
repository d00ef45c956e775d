package eventapi

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// TopologyDetail is the detail of a Node Topology Changed event: the node's new unit list,
// as the body of PUT /v1/nodes/{nodeId}/topology.
type TopologyDetail struct {
	NodeID         string   `json:"nodeId"`
	UnitIDs        []string `json:"unitIds"`
	Reason         string   `json:"reason"`
	IdempotencyKey string   `json:"idempotencyKey"`
	// ExpectedTopologyGen is the node's generation the sender saw; a node at another one
	// refuses the change. Senders should set it: the queue delivers out of order, and a
	// redelivered old change would otherwise undo a newer one.
	ExpectedTopologyGen *int64 `json:"expectedTopologyGen"`
}

var topologyRequired = []string{"nodeId", "unitIds"}

// topologyRecord applies one Node Topology Changed record; an error means it must be
// delivered again. The rules are a reclaim request's: a refusal is published and
// acknowledged, a transient failure or a failed publish goes back to the queue, and a
// redelivery replays under the same idempotency key and publishes the same outcome.
func (h *Handler) topologyRecord(ctx context.Context, rec events.SQSMessage, env events.CloudWatchEvent) error {
	meta := capacity.RequestMeta{RequestID: rec.MessageId, Via: capacity.ViaEvent, EventID: env.ID}
	nodeID := looseIDs(env.Detail)["nodeId"] // named by a refusal too
	start := time.Now()
	res, err := h.setTopology(ctx, env, rec.Body, meta)
	attrs := []any{"event_id", env.ID, "source", env.Source, "via", meta.Via, "node_id", nodeID,
		"duration_ms", time.Since(start).Milliseconds()}
	if err != nil {
		attrs = append(attrs, "code", capacity.ErrorCode(err))
		if transient(err) {
			return fmt.Errorf("topology change %s from %s: %w", env.ID, env.Source, err)
		}
	}
	if perr := h.publishTopology(ctx, env, nodeID, res, err); perr != nil {
		return fmt.Errorf("publish the outcome of topology change %s: %w", env.ID, perr)
	}
	if err != nil {
		h.logger().InfoContext(ctx, "topology change refused", attrs...)
	} else {
		attrs = append(attrs, "changed", res.Changed, "topology_gen", res.Node.TopologyGen,
			"needs_review", len(res.NeedsReview), "replayed", res.Replayed)
		h.logger().InfoContext(ctx, "topology change applied", attrs...)
	}
	return nil
}

// setTopology checks the event and runs it through the domain as its source's principal,
// which must be an operator (the domain checks what the principal holds).
func (h *Handler) setTopology(ctx context.Context, env events.CloudWatchEvent, body string, meta capacity.RequestMeta) (*capacity.TopologyResult, error) {
	if err := h.Origin.checkEvent(env, body); err != nil {
		return nil, err
	}
	principal, ok := h.Principals.Lookup(env.Source)
	if !ok || !principal.CanChangeTopology() {
		return nil, capacity.Errorf(capacity.CodeForbidden, "source %q may not change node topology", env.Source)
	}
	var d TopologyDetail
	if err := decodeDetail(env.Detail, &d, topologyRequired); err != nil {
		return nil, err
	}
	key := d.IdempotencyKey
	if key == "" {
		key = "event:" + env.ID // a redelivered event replays, never bumps the generation twice
	}
	return h.Service.SetTopology(ctx, principal.Principal(), capacity.TopologyRequest{
		NodeID: d.NodeID, UnitIDs: d.UnitIDs, Reason: d.Reason, IdempotencyKey: key, ExpectedTopologyGen: d.ExpectedTopologyGen,
	}, meta)
}

// publishTopology puts the change's outcome on the bus: Applied with the HTTP answer's body,
// or Refused with the problem's code and detail. Their ids derive from the event's id.
func (h *Handler) publishTopology(ctx context.Context, env events.CloudWatchEvent, nodeID string, res *capacity.TopologyResult, err error) error {
	if err != nil {
		d := capacity.TopologyRefusedDetail{
			EventID: env.ID + "/refused", RequestEventID: env.ID, RequestSource: env.Source, NodeID: nodeID,
			Code: string(capacity.ErrorCode(err)), Detail: capacity.ErrorMessage(err),
		}
		return h.Publisher.Publish(ctx, []capacity.Event{{ID: d.EventID, DetailType: capacity.DetailTopologyRefused, Detail: d, Time: h.now()}})
	}
	d := capacity.TopologyAppliedDetail{
		EventID: env.ID + "/applied", RequestEventID: env.ID, RequestSource: env.Source, NodeID: res.Node.ID,
		Result: wire.Topology(res),
	}
	return h.Publisher.Publish(ctx, []capacity.Event{{ID: d.EventID, DetailType: capacity.DetailTopologyApplied, Detail: d, Time: h.now()}})
}
