package httpapi

import (
	"net/http"
	"strings"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// Actions the capacity handler serves.
const (
	ActionReclaim = capacity.ActionReclaim
	ActionRelease = capacity.ActionRelease
)

func (h *Handler) capacity(action string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
		// Permission and path ids before the body: the same 404 whatever the body is.
		if err := capacity.AdmitCapacityCall(p, r.PathValue("nodeId"), r.PathValue("id")); err != nil {
			return err
		}
		var body CapacityBody
		if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
			return err
		}
		match, err := ifMatch(r)
		if err != nil {
			return err
		}
		req := capacity.CapacityRequest{
			NodeID: r.PathValue("nodeId"), ReservationID: r.PathValue("id"),
			UnitIDs: body.UnitIDs, DryRun: body.DryRun, Reason: body.Reason, GraceSeconds: body.GraceSeconds,
			IdempotencyKey: r.Header.Get("Idempotency-Key"), IfMatch: match,
		}
		// Only a reclaim has a plan to match; a precondition the call cannot honour is refused
		// rather than ignored.
		if req.IfMatch != "" && action == ActionRelease {
			return capacity.Errorf(capacity.CodeInvalidRequest, "If-Match is for reclaims only: a release has no plan")
		}
		if body.At != nil {
			return h.schedule(w, r, p, reqID, action, req, *body.At)
		}
		call := h.Service.Reclaim
		if action == ActionRelease {
			call = h.Service.Release
		}
		res, err := call(r.Context(), p, req, capacity.RequestMeta{RequestID: reqID})
		if err != nil {
			return err
		}
		markReplayed(w, res.Replayed)
		setPlanETag(w, res)
		if action == ActionRelease {
			out := wire.Reservation(res.Reservation)
			out.Reason = res.Reason
			writeJSON(w, http.StatusOK, out)
			return nil
		}
		writeJSON(w, http.StatusOK, wire.Reclaim(res))
		return nil
	}
}

// planReclaim answers which units a reclaim of a count should take, with that reclaim's dry
// run and its plan ETag (also in the ETag header, for the reclaim's If-Match).
func (h *Handler) planReclaim(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	// Permission and path ids before the body, as for the reclaim itself.
	if err := capacity.AdmitCapacityCall(p, r.PathValue("nodeId"), r.PathValue("id")); err != nil {
		return err
	}
	var body ReclaimPlanBody
	if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
		return err
	}
	req := capacity.ReclaimPlanRequest{
		NodeID: r.PathValue("nodeId"), ReservationID: r.PathValue("id"),
		Count: body.Count, Reason: body.Reason, GraceSeconds: body.GraceSeconds,
	}
	plan, err := h.Service.PlanReclaim(r.Context(), p, req, capacity.RequestMeta{RequestID: reqID})
	if err != nil {
		return err
	}
	setPlanETag(w, &plan.CapacityResult)
	writeJSON(w, http.StatusOK, wire.ReclaimPlan(plan))
	return nil
}

// schedule serves a reclaim with `at`: 202 with the scheduled reclaim and its Location. A dry
// run with `at` answers today's plan, the usual 200, and schedules nothing.
func (h *Handler) schedule(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID, action string, req capacity.CapacityRequest, atText string) error {
	if action != ActionReclaim {
		return capacity.Errorf(capacity.CodeInvalidRequest, "at is for reclaims only")
	}
	at, err := parseTime("at", atText)
	if err != nil {
		return err
	}
	if req.DryRun {
		res, err := h.Service.Reclaim(r.Context(), p, req, capacity.RequestMeta{RequestID: reqID})
		if err != nil {
			return err
		}
		setPlanETag(w, res)
		writeJSON(w, http.StatusOK, wire.Reclaim(res))
		return nil
	}
	// The plan is decided when the schedule fires, against the state then: a plan of now
	// cannot be its precondition.
	if req.IfMatch != "" {
		return capacity.Errorf(capacity.CodeInvalidRequest, "If-Match is for reclaims that run now, not with at")
	}
	res, err := h.Service.ScheduleReclaim(r.Context(), p, req, at, capacity.RequestMeta{RequestID: reqID})
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	sr := res.Scheduled
	w.Header().Set("Location", "/v1/nodes/"+sr.NodeID+"/reservations/"+sr.ReservationID+"/scheduled-reclaims/"+sr.ID)
	writeJSON(w, http.StatusAccepted, wire.ScheduledReclaim(sr))
	return nil
}

func (h *Handler) getScheduledReclaim(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	sr, err := h.Service.GetScheduledReclaim(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"), r.PathValue("scheduledReclaimId"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.ScheduledReclaim(*sr))
	return nil
}

// listScheduledReclaims answers a page of the reservation's scheduled reclaims, in order of
// at. The service's first gate runs before the query is read.
func (h *Handler) listScheduledReclaims(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := capacity.AdmitScheduledRead(p, r.PathValue("nodeId"), r.PathValue("id")); err != nil {
		return err
	}
	page, err := pageOf(r.URL.Query())
	if err != nil {
		return err
	}
	res, err := h.Service.ListScheduledReclaims(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"), page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.ScheduledPage(res))
	return nil
}

// cancelScheduledReclaim answers 200 with the cancelled scheduled reclaim (also when it was
// cancelled before). The body is ignored.
func (h *Handler) cancelScheduledReclaim(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	sr, err := h.Service.CancelScheduledReclaim(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"), r.PathValue("scheduledReclaimId"), capacity.RequestMeta{RequestID: reqID})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.ScheduledReclaim(*sr))
	return nil
}

func (h *Handler) place(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	if err := capacity.AdmitPlacement(p, r.PathValue("nodeId")); err != nil {
		return err
	}
	var body PlacementBody
	if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
		return err
	}
	req := capacity.PlacementRequest{
		NodeID: r.PathValue("nodeId"), VMID: body.VMID, OrgID: body.OrgID, Tier: capacity.Tier(body.Tier),
		UnitIDs: body.UnitIDs, IdempotencyKey: r.Header.Get("Idempotency-Key"),
	}
	res, err := h.Service.Place(r.Context(), p, req, capacity.RequestMeta{RequestID: reqID})
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	writeJSON(w, http.StatusCreated, wire.VM(res.VM))
	return nil
}

func (h *Handler) getReservation(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	res, err := h.Service.GetReservation(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.Reservation(*res))
	return nil
}

func (h *Handler) getOperation(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	op, err := h.Service.GetOperation(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"), r.PathValue("reclaimId"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.Operation(op))
	return nil
}

// redrive answers 202 with the operation when a new attempt was started, 200 with it
// unchanged when every VM was already terminated or gone. The body is ignored.
func (h *Handler) redrive(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	res, err := h.Service.Redrive(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"), r.PathValue("reclaimId"), capacity.RequestMeta{RequestID: reqID})
	if err != nil {
		return err
	}
	status := http.StatusAccepted
	if len(res.Retried) == 0 {
		status = http.StatusOK
	}
	writeJSON(w, status, wire.Operation(&capacity.OperationView{Operation: res.Operation}))
	return nil
}

// ifMatch is the request's If-Match precondition as sent, its header lines joined into one
// list (RFC 9110 5.3); the domain compares it with the plan's ETag. "" when none was sent. A
// value that is not "*" or a list of quoted entity tags (an empty one included) is refused as
// malformed: it is a client's mistake, and neither a changed plan (412) nor no precondition.
func ifMatch(r *http.Request) (string, error) {
	lines, sent := r.Header[http.CanonicalHeaderKey("If-Match")]
	if !sent {
		return "", nil
	}
	v := strings.Join(lines, ", ")
	if _, _, ok := capacity.ParseIfMatch(v); !ok {
		return "", capacity.Errorf(CodeMalformedRequest, `If-Match must be "*" or a list of quoted entity tags, such as a dry run's planEtag`)
	}
	return v, nil
}

// setPlanETag names a dry run's plan in the ETag header, for the real call's If-Match.
func setPlanETag(w http.ResponseWriter, res *capacity.CapacityResult) {
	if res.DryRun && res.PlanETag != "" {
		w.Header().Set("ETag", res.PlanETag)
	}
}

// markReplayed tells the caller the answer is the stored one of an earlier identical call.
func markReplayed(w http.ResponseWriter, replayed bool) {
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
}
