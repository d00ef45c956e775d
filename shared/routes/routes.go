// Package routes is the API's one route table. The HTTP mux (shared/httpapi), the API
// Gateway resources (infra) and the OpenAPI document are all checked against it, so a route
// cannot exist in one and be missing in another (on API Gateway that shows up as a 403
// "Missing Authentication Token"). It imports only the standard library so that the CDK
// module can import it too.
package routes

import "slices"

// Route is one method on one path. Path is in the form both Go 1.22 mux patterns and API
// Gateway resources use ("/v1/nodes/{nodeId}/vms").
type Route struct {
	Method      string
	Path        string
	OperationID string // the OpenAPI operationId; the mux binds its handler by it
	Auth        bool   // requires an API key
}

// All is every public route.
var All = []Route{
	{"GET", "/v1/openapi.json", "getOpenAPI", false},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}", "getReservation", true},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaim", "reclaim", true},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/release", "release", true},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}", "getReclaimOperation", true},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}/retry", "retryReclaimOperation", true},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/scheduled-reclaims", "listScheduledReclaims", true},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/scheduled-reclaims/{scheduledReclaimId}", "getScheduledReclaim", true},
	{"DELETE", "/v1/nodes/{nodeId}/reservations/{id}/scheduled-reclaims/{scheduledReclaimId}", "cancelScheduledReclaim", true},
	{"POST", "/v1/nodes/{nodeId}/vms", "placeVM", true},
	// Operator routes (nodes, reservations, topology, keys) and the audit trail.
	{"PUT", "/v1/nodes/{nodeId}", "putNode", true},
	{"GET", "/v1/nodes/{nodeId}", "getNode", true},
	{"PUT", "/v1/nodes/{nodeId}/topology", "setTopology", true},
	{"POST", "/v1/nodes/{nodeId}/agent-key/rotate", "rotateAgentKey", true},
	{"GET", "/v1/nodes/{nodeId}/audit", "listNodeAudit", true},
	{"GET", "/v1/nodes/{nodeId}/reservations", "listReservations", true},
	{"POST", "/v1/nodes/{nodeId}/reservations", "createReservation", true},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/cancel", "cancelReservation", true},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reaffirm", "reaffirmReservation", true},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/audit", "listReservationAudit", true},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}/vms/{vmId}/force-end", "forceEndVM", true},
	{"POST", "/v1/keys", "createKey", true},
	{"GET", "/v1/keys", "listKeys", true},
	{"GET", "/v1/keys/{keyId}", "getKey", true},
	{"POST", "/v1/keys/{keyId}/revoke", "revokeKey", true},
	{"GET", "/v1/keys/audit", "listKeyAudit", true},
}

// Paths returns the distinct paths of All, sorted.
func Paths() []string {
	var out []string
	for _, r := range All {
		out = append(out, r.Path)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
