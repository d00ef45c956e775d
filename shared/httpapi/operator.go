package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/wire"
)

// Bodies of the operator routes. Optional members are pointers only where absent and zero
// differ; every body is decoded strictly (DecodeJSON).

// NodeBody is the body of PUT /v1/nodes/{nodeId}.
type NodeBody struct {
	OwnerOrgID    string   `json:"ownerOrgId"`
	UnitIDs       []string `json:"unitIds"`
	AgentEndpoint string   `json:"agentEndpoint"`
	Reason        string   `json:"reason"`
}

// TopologyBody is the body of PUT /v1/nodes/{nodeId}/topology.
type TopologyBody struct {
	UnitIDs []string `json:"unitIds"`
	Reason  string   `json:"reason"`
	// ExpectedTopologyGen, when given, is the generation the change was made against; the
	// service refuses it (topology_changed) if the node has moved on.
	ExpectedTopologyGen *int64 `json:"expectedTopologyGen"`
}

// ReservationBody is the body of POST /v1/nodes/{nodeId}/reservations. Times are RFC 3339.
type ReservationBody struct {
	ID              string   `json:"id"`
	Status          string   `json:"status"`
	StartsAt        string   `json:"startsAt"`
	EndsAt          *string  `json:"endsAt"`
	AllowedOrgIDs   []string `json:"allowedOrgIds"`
	ManagingOrgIDs  []string `json:"managingOrgIds"`
	ReservedUnitIDs []string `json:"reservedUnitIds"`
	ContractRef     string   `json:"contractRef"`
	Reason          string   `json:"reason"`
}

// ReasonBody is the optional body of a reservation cancel or reaffirm and of a key revoke.
type ReasonBody struct {
	Reason string `json:"reason"`
}

// ForceEndBody is the body of POST .../reclaims/{reclaimId}/vms/{vmId}/force-end; the reason
// is required.
type ForceEndBody struct {
	Reason string `json:"reason"`
}

// KeyBody is the body of POST /v1/keys.
type KeyBody struct {
	OrgID       string   `json:"orgId"`
	Permissions []string `json:"permissions"`
	Operator    bool     `json:"operator"`
	ExpiresAt   *string  `json:"expiresAt"`
	Description string   `json:"description"`
	// RateLimit is the key's own rate limit (absent: the environment's).
	RateLimit *wire.RateLimitJSON `json:"rateLimit"`
}

// admitOperator refuses, before the body is read, a caller who is not an operator holding
// the operator permission the route table (shared/routes) names for the operation, or a
// path id that names nothing: the route's one 404, so neither the body nor its content type
// tells such a caller anything, not even that the route exists for others. The operator
// lists call it before reading their query, for the same reason. what "" is the service's
// own "not found" of a route that names no object.
func admitOperator(p capacity.Principal, operationID, what string, ids ...string) error {
	detail := "not found"
	if what != "" {
		detail = what + " " + detail
	}
	if !p.CanOperate(operatorPermission(operationID)) {
		return capacity.Errorf(capacity.CodeNotFound, "%s", detail)
	}
	for _, id := range ids {
		if !capacity.ValidID(id) {
			return capacity.Errorf(capacity.CodeNotFound, "%s", detail)
		}
	}
	return nil
}

// operatorPermission is the route table's permission of an operator route. A route without
// one here is a programming error, caught by TestOperatorRoutePermissions: it would
// otherwise be open to every operator key.
func operatorPermission(operationID string) string {
	rt, ok := routes.Find(operationID)
	if !ok || rt.Permission == "" {
		panic(fmt.Sprintf("httpapi: operation %q has no operator permission in shared/routes", operationID))
	}
	return rt.Permission
}

// decodeOptional is DecodeJSON for a body that may be left out: an empty body (any content
// type) is the zero value.
func decodeOptional(r *http.Request, v any) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return capacity.Errorf(CodeMalformedRequest, "the body could not be read")
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	return DecodeJSON(r.Header.Get("Content-Type"), bytes.NewReader(data), v)
}

// parseTime reads an RFC 3339 member.
func parseTime(member, s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, capacity.Errorf(capacity.CodeInvalidRequest, "%s must be an RFC 3339 time, such as 2027-01-02T15:04:05Z", member)
	}
	return t, nil
}

// pageOf reads a list's query: limit (1..100; absent: the service's default) and cursor (the
// nextCursor of the previous page, passed on as is: the store refuses one it did not issue).
// Any other parameter (but the route's own, extra), or one given twice, is refused, as an
// unknown body member is.
func pageOf(q url.Values, extra ...string) (capacity.PageRequest, error) {
	var page capacity.PageRequest
	known := append([]string{"limit", "cursor"}, extra...)
	for name, vals := range q {
		if !slices.Contains(known, name) {
			return page, capacity.Errorf(CodeMalformedRequest, "unknown query parameter %q; known: %s", name, strings.Join(known, ", "))
		}
		if len(vals) != 1 {
			return page, capacity.Errorf(CodeMalformedRequest, "query parameter %q appears more than once", name)
		}
	}
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > capacity.MaxPageLimit {
			return page, capacity.Errorf(capacity.CodeInvalidRequest, "limit must be an integer from 1 to %d", capacity.MaxPageLimit)
		}
		page.Limit = n
	}
	if v, ok := q["cursor"]; ok {
		if v[0] == "" {
			return page, capacity.Errorf(capacity.CodeInvalidRequest, "cursor must not be empty; leave it out for the first page")
		}
		page.Cursor = v[0]
	}
	return page, nil
}

func meta(reqID string) capacity.RequestMeta { return capacity.RequestMeta{RequestID: reqID} }

// putNode registers a node (201, Location, and the agent's key once) or updates its owner org
// and agent endpoint (200).
func (h *Handler) putNode(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	nodeID := r.PathValue("nodeId")
	if err := admitOperator(p, "putNode", "node", nodeID); err != nil {
		return err
	}
	var body NodeBody
	if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
		return err
	}
	req := capacity.NodeRequest{
		NodeID: nodeID, OwnerOrgID: body.OwnerOrgID, AgentEndpoint: body.AgentEndpoint, Reason: body.Reason,
		UnitIDs: body.UnitIDs, IdempotencyKey: r.Header.Get("Idempotency-Key"),
	}
	res, err := h.Service.PutNode(r.Context(), p, req, meta(reqID))
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	status := http.StatusOK
	if res.Created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/nodes/"+res.Node.ID)
	}
	writeJSON(w, status, wire.NodeAnswer(res))
	return nil
}

// rotateAgentKey gives the node's agent a new key, answered once; the body ({reason}) may be
// left out.
func (h *Handler) rotateAgentKey(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	return h.agentKeyCall(w, r, p, reqID, "rotateAgentKey", h.Service.RotateAgentKey)
}

// endAgentKeyOverlap ends the overlap of the node's current agent key now (the previous key
// is never used again); the body ({reason}) may be left out.
func (h *Handler) endAgentKeyOverlap(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	return h.agentKeyCall(w, r, p, reqID, "endAgentKeyOverlap", h.Service.EndAgentKeyOverlap)
}

// agentKeyCall runs an operator call on a node's agent key whose body is an optional reason.
func (h *Handler) agentKeyCall(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID, operation string,
	call func(context.Context, capacity.Principal, capacity.AgentKeyRotation, capacity.RequestMeta) (*capacity.AgentKeyResult, error)) error {
	nodeID := r.PathValue("nodeId")
	if err := admitOperator(p, operation, "node", nodeID); err != nil {
		return err
	}
	var body ReasonBody
	if err := decodeOptional(r, &body); err != nil {
		return err
	}
	req := capacity.AgentKeyRotation{NodeID: nodeID, Reason: body.Reason, IdempotencyKey: r.Header.Get("Idempotency-Key")}
	res, err := call(r.Context(), p, req, meta(reqID))
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	writeJSON(w, http.StatusOK, wire.AgentKeyAnswer(res))
	return nil
}

// getNode is for operators and the node's owner org; the service decides.
func (h *Handler) getNode(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	n, err := h.Service.GetNode(r.Context(), p, r.PathValue("nodeId"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.NodeGetJSON{Node: wire.Node(*n)})
	return nil
}

func (h *Handler) setTopology(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	nodeID := r.PathValue("nodeId")
	if err := admitOperator(p, "setTopology", "node", nodeID); err != nil {
		return err
	}
	var body TopologyBody
	if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
		return err
	}
	req := capacity.TopologyRequest{NodeID: nodeID, UnitIDs: body.UnitIDs, Reason: body.Reason, IdempotencyKey: r.Header.Get("Idempotency-Key"),
		ExpectedTopologyGen: body.ExpectedTopologyGen}
	res, err := h.Service.SetTopology(r.Context(), p, req, meta(reqID))
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	writeJSON(w, http.StatusOK, wire.Topology(res))
	return nil
}

func (h *Handler) createReservation(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	nodeID := r.PathValue("nodeId")
	if err := admitOperator(p, "createReservation", "node", nodeID); err != nil {
		return err
	}
	var body ReservationBody
	if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
		return err
	}
	if body.StartsAt == "" {
		return capacity.Errorf(capacity.CodeInvalidRequest, "startsAt is required")
	}
	startsAt, err := parseTime("startsAt", body.StartsAt)
	if err != nil {
		return err
	}
	req := capacity.ReservationRequest{
		NodeID: nodeID, ID: body.ID, Status: capacity.Status(body.Status), StartsAt: startsAt,
		AllowedOrgIDs: body.AllowedOrgIDs, ManagingOrgIDs: body.ManagingOrgIDs, ReservedUnitIDs: body.ReservedUnitIDs,
		ContractRef: body.ContractRef, Reason: body.Reason, IdempotencyKey: r.Header.Get("Idempotency-Key"),
	}
	if body.EndsAt != nil {
		endsAt, err := parseTime("endsAt", *body.EndsAt)
		if err != nil {
			return err
		}
		req.EndsAt = &endsAt
	}
	res, err := h.Service.CreateReservation(r.Context(), p, req, meta(reqID))
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	w.Header().Set("Location", "/v1/nodes/"+res.Reservation.NodeID+"/reservations/"+res.Reservation.ID)
	writeJSON(w, http.StatusCreated, wire.ReservationAnswer(res, false))
	return nil
}

// changeReservation serves cancel and reaffirm; the body ({reason}) may be left out. A cancel
// answers the VMs still on the reservation's units: it terminates nothing.
func (h *Handler) changeReservation(action, operationID string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
		nodeID, resID := r.PathValue("nodeId"), r.PathValue("id")
		if err := admitOperator(p, operationID, "reservation", nodeID, resID); err != nil {
			return err
		}
		var body ReasonBody
		if err := decodeOptional(r, &body); err != nil {
			return err
		}
		req := capacity.ReservationChange{NodeID: nodeID, ReservationID: resID, Reason: body.Reason, IdempotencyKey: r.Header.Get("Idempotency-Key")}
		call := h.Service.ReaffirmReservation
		if action == capacity.ActionReservationCancel {
			call = h.Service.CancelReservation
		}
		res, err := call(r.Context(), p, req, meta(reqID))
		if err != nil {
			return err
		}
		markReplayed(w, res.Replayed)
		writeJSON(w, http.StatusOK, wire.ReservationAnswer(res, action == capacity.ActionReservationCancel))
		return nil
	}
}

// listReservations is scoped by the service to what the caller may see. The service's first
// gate runs before the query is read, so a caller who may not list learns nothing from it.
func (h *Handler) listReservations(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := capacity.AdmitReservationList(p, r.PathValue("nodeId")); err != nil {
		return err
	}
	page, err := pageOf(r.URL.Query())
	if err != nil {
		return err
	}
	res, err := h.Service.ListReservations(r.Context(), p, r.PathValue("nodeId"), page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.ReservationPage(res))
	return nil
}

// listReservationAudit: as listReservations, the service's first gate before the query (an
// operator needs reservation.read or reservation.capacity too); the finer checks (owner,
// managing org or operator) stay in the service.
func (h *Handler) listReservationAudit(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := capacity.AdmitReservationRead(p, r.PathValue("nodeId"), r.PathValue("id")); err != nil {
		return err
	}
	// chain: changes (the default) or calls, those about the reservation that changed nothing.
	page, err := pageOf(r.URL.Query(), "chain")
	if err != nil {
		return err
	}
	res, err := h.Service.ListReservationAudit(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"), capacity.NodeChain(r.URL.Query().Get("chain")), page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.AuditPage(res))
	return nil
}

func (h *Handler) listNodeAudit(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := admitOperator(p, "listNodeAudit", "node", r.PathValue("nodeId")); err != nil {
		return err
	}
	// chain: changes (the default) or calls, the node's chain of calls that changed nothing.
	page, err := pageOf(r.URL.Query(), "chain")
	if err != nil {
		return err
	}
	res, err := h.Service.ListNodeAudit(r.Context(), p, r.PathValue("nodeId"), capacity.NodeChain(r.URL.Query().Get("chain")), page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.AuditChainPage(res))
	return nil
}

func (h *Handler) listKeyAudit(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := admitOperator(p, "listKeyAudit", ""); err != nil {
		return err
	}
	page, err := pageOf(r.URL.Query())
	if err != nil {
		return err
	}
	res, err := h.Service.ListKeyAudit(r.Context(), p, page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.AuditChainPage(res))
	return nil
}

// createKey answers 201 with the key and, only in this answer, its secret.
func (h *Handler) createKey(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	if err := admitOperator(p, "createKey", "key"); err != nil {
		return err
	}
	var body KeyBody
	if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
		return err
	}
	req := capacity.KeyRequest{
		OrgID: body.OrgID, Permissions: body.Permissions, Operator: body.Operator, Description: body.Description,
		IdempotencyKey: r.Header.Get("Idempotency-Key"), RateLimit: body.RateLimit.Limit(),
	}
	if body.ExpiresAt != nil {
		at, err := parseTime("expiresAt", *body.ExpiresAt)
		if err != nil {
			return err
		}
		req.ExpiresAt = &at
	}
	res, err := h.Service.CreateKey(r.Context(), p, req, meta(reqID))
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	w.Header().Set("Location", "/v1/keys/"+res.Key.KeyID)
	writeJSON(w, http.StatusCreated, wire.KeyAnswer(res))
	return nil
}

func (h *Handler) listKeys(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := admitOperator(p, "listKeys", ""); err != nil {
		return err
	}
	page, err := pageOf(r.URL.Query())
	if err != nil {
		return err
	}
	res, err := h.Service.ListKeys(r.Context(), p, page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.KeyPage(res))
	return nil
}

// getKey answers one key (the Location of a created key).
func (h *Handler) getKey(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	keyID := r.PathValue("keyId")
	if err := admitOperator(p, "getKey", "key", keyID); err != nil {
		return err
	}
	k, err := h.Service.GetKey(r.Context(), p, keyID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.KeyGetJSON{Key: wire.Key(*k)})
	return nil
}

// getSelfKey answers the caller's own key, whatever it holds: what it may do, so that a
// client offers only that (docs/console.md). No permission is needed: a key learns only
// what it already holds.
func (h *Handler) getSelfKey(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	k, err := h.Service.SelfKey(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.SelfKey(*k))
	return nil
}

// revokeKey is repeat-safe: revoking a revoked key answers 200 with it. An Idempotency-Key
// is checked for form only, since a repeat changes nothing anyway.
func (h *Handler) revokeKey(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	keyID := r.PathValue("keyId")
	if err := admitOperator(p, "revokeKey", "key", keyID); err != nil {
		return err
	}
	var body ReasonBody
	if err := decodeOptional(r, &body); err != nil {
		return err
	}
	if err := capacity.ValidateClientIdempotencyKey(r.Header.Get("Idempotency-Key")); err != nil {
		return err
	}
	k, err := h.Service.RevokeKey(r.Context(), p, capacity.KeyRevocation{KeyID: keyID, Reason: body.Reason}, meta(reqID))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.KeyGetJSON{Key: wire.Key(*k)})
	return nil
}

// forceEnd ends a VM's termination that an operator confirmed out of band; it answers the
// operation after it. Its gate runs before the body is read.
func (h *Handler) forceEnd(w http.ResponseWriter, r *http.Request, p capacity.Principal, reqID string) error {
	req := capacity.ForceEndRequest{NodeID: r.PathValue("nodeId"), ReservationID: r.PathValue("id"),
		ReclaimID: r.PathValue("reclaimId"), VMID: r.PathValue("vmId"), IdempotencyKey: r.Header.Get("Idempotency-Key")}
	// The route table's permission, then the domain's own gate (the same 404).
	if err := admitOperator(p, "forceEndVM", "reclaim operation", req.NodeID, req.ReservationID, req.ReclaimID, req.VMID); err != nil {
		return err
	}
	if err := capacity.AdmitForceEnd(p, req.NodeID, req.ReservationID, req.ReclaimID, req.VMID); err != nil {
		return err
	}
	var body ForceEndBody
	if err := DecodeJSON(r.Header.Get("Content-Type"), r.Body, &body); err != nil {
		return err
	}
	req.Reason = body.Reason
	res, err := h.Service.ForceEnd(r.Context(), p, req, meta(reqID))
	if err != nil {
		return err
	}
	markReplayed(w, res.Replayed)
	writeJSON(w, http.StatusOK, wire.Operation(&capacity.OperationView{Operation: res.Operation}))
	return nil
}
