package client

import (
	"context"
	"net/http"

	"github.com/openrelay/capacity/shared/wire"
)

// Reclaims scheduled for later, and what can be done to a reclaim operation after it began:
// re-drive and force-end.

// ScheduleRequest is the body of a reclaim scheduled with at (RFC 3339). It has no dry run:
// the plan is decided when it fires, so If-Match is refused with it.
type ScheduleRequest struct {
	UnitIDs      []string `json:"unitIds"`
	At           string   `json:"at"`
	Reason       string   `json:"reason,omitempty"`
	GraceSeconds int      `json:"graceSeconds,omitempty"`
}

func scheduledPath(node, res, id string) string {
	return reservationPath(node, res) + "/scheduled-reclaims/" + esc(id)
}

// ScheduleReclaim schedules a reclaim (202, Meta.Location names it).
func (c *Client) ScheduleReclaim(ctx context.Context, node, res string, req ScheduleRequest, opt Options) (*wire.ScheduledReclaimJSON, *Meta, error) {
	return call[wire.ScheduledReclaimJSON](ctx, c, http.MethodPost, reservationPath(node, res)+"/reclaim", nil, req, opt)
}

// GetScheduledReclaim reads a scheduled reclaim.
func (c *Client) GetScheduledReclaim(ctx context.Context, node, res, id string) (*wire.ScheduledReclaimJSON, *Meta, error) {
	return call[wire.ScheduledReclaimJSON](ctx, c, http.MethodGet, scheduledPath(node, res, id), nil, nil, Options{})
}

// CancelScheduledReclaim cancels a pending scheduled reclaim (repeat-safe: a cancelled one is
// answered again); one that has fired is 409 scheduled_reclaim_fired.
func (c *Client) CancelScheduledReclaim(ctx context.Context, node, res, id string) (*wire.ScheduledReclaimJSON, *Meta, error) {
	return call[wire.ScheduledReclaimJSON](ctx, c, http.MethodDelete, scheduledPath(node, res, id), nil, nil, Options{})
}

func operationPath(node, res, reclaimID string) string {
	return reservationPath(node, res) + "/reclaims/" + esc(reclaimID)
}

// RetryReclaim re-drives an ended operation: 202 with it when a new attempt began, 200 with it
// unchanged when every VM was already terminated or gone; 409 operation_running while it runs.
func (c *Client) RetryReclaim(ctx context.Context, node, res, reclaimID string, opt Options) (*wire.OperationJSON, *Meta, error) {
	return call[wire.OperationJSON](ctx, c, http.MethodPost, operationPath(node, res, reclaimID)+"/retry", nil, nil, opt)
}

// ForceEndVM ends the termination of a VM of a failed operation once it is confirmed gone out
// of band (operator with node.manage); reason is required.
func (c *Client) ForceEndVM(ctx context.Context, node, res, reclaimID, vmID, reason string, opt Options) (*wire.OperationJSON, *Meta, error) {
	return call[wire.OperationJSON](ctx, c, http.MethodPost, operationPath(node, res, reclaimID)+"/vms/"+esc(vmID)+"/force-end", nil, reasonBody{reason}, opt)
}
