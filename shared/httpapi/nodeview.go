package httpapi

import (
	"net/http"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// listNodes answers a page of the nodes the caller may see. A caller who may see none gets
// the list's 404 before the query is read.
func (h *Handler) listNodes(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := capacity.AdmitNodeList(p); err != nil {
		return err
	}
	page, err := pageOf(r.URL.Query())
	if err != nil {
		return err
	}
	res, err := h.Service.ListNodes(r.Context(), p, page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.NodePage(res))
	return nil
}

// getNodeUnits answers the node's unit view as the caller may see it.
func (h *Handler) getNodeUnits(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	res, err := h.Service.GetNodeUnits(r.Context(), p, r.PathValue("nodeId"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.NodeUnits(res))
	return nil
}

// listReclaimOperations answers a page of the reservation's reclaim operations, newest first,
// optionally filtered by state; as GET of one of them, the service's first gate comes before
// the query is read.
func (h *Handler) listReclaimOperations(w http.ResponseWriter, r *http.Request, p capacity.Principal, _ string) error {
	if err := capacity.AdmitReservationRead(p, r.PathValue("nodeId"), r.PathValue("id")); err != nil {
		return err
	}
	q := r.URL.Query()
	page, err := pageOf(q, "state")
	if err != nil {
		return err
	}
	res, err := h.Service.ListReclaimOperations(r.Context(), p, r.PathValue("nodeId"), r.PathValue("id"), q.Get("state"), page)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.ReclaimPage(res))
	return nil
}
