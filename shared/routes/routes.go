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
	// Permission is the operator permission the route needs: only an operator key that
	// holds it may use the route, and anyone else gets the route's 404 before its body or
	// query is read. "" on the routes open to tenants, where the service decides by the
	// caller's capacity permissions and role. The OpenAPI document (x-operator-permission)
	// and the route table of docs/api.md are checked against it.
	Permission string
}

// The operator permissions (capacity.OperatorPermissions; this package imports only the
// standard library, and a test ties the two lists).
const (
	KeyManage         = "key.manage"
	NodeManage        = "node.manage"
	ReservationManage = "reservation.manage"
	AuditRead         = "audit.read"
)

// All is every public route.
var All = []Route{
	{"GET", "/v1/openapi.json", "getOpenAPI", false, ""},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}", "getReservation", true, ""},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaim", "reclaim", true, ""},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaim-plan", "planReclaim", true, ""},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/release", "release", true, ""},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}", "getReclaimOperation", true, ""},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}/retry", "retryReclaimOperation", true, ""},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/scheduled-reclaims", "listScheduledReclaims", true, ""},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/scheduled-reclaims/{scheduledReclaimId}", "getScheduledReclaim", true, ""},
	{"DELETE", "/v1/nodes/{nodeId}/reservations/{id}/scheduled-reclaims/{scheduledReclaimId}", "cancelScheduledReclaim", true, ""},
	{"POST", "/v1/nodes/{nodeId}/vms", "placeVM", true, ""},
	{"GET", "/v1/nodes/{nodeId}", "getNode", true, ""},
	{"GET", "/v1/nodes/{nodeId}/reservations", "listReservations", true, ""},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/audit", "listReservationAudit", true, ""},
	// The node view: the nodes a caller may see, a node's units, a reservation's reclaims.
	{"GET", "/v1/nodes", "listNodes", true, ""},
	{"GET", "/v1/nodes/{nodeId}/units", "getNodeUnits", true, ""},
	{"GET", "/v1/nodes/{nodeId}/reservations/{id}/reclaims", "listReclaimOperations", true, ""},
	// Operator routes (nodes, reservations, topology, keys) and the audit chains.
	{"PUT", "/v1/nodes/{nodeId}", "putNode", true, NodeManage},
	{"PUT", "/v1/nodes/{nodeId}/topology", "setTopology", true, NodeManage},
	{"POST", "/v1/nodes/{nodeId}/agent-key/rotate", "rotateAgentKey", true, NodeManage},
	{"POST", "/v1/nodes/{nodeId}/agent-key/end-overlap", "endAgentKeyOverlap", true, NodeManage},
	{"GET", "/v1/nodes/{nodeId}/audit", "listNodeAudit", true, AuditRead},
	{"POST", "/v1/nodes/{nodeId}/reservations", "createReservation", true, ReservationManage},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/cancel", "cancelReservation", true, ReservationManage},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reaffirm", "reaffirmReservation", true, ReservationManage},
	{"POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}/vms/{vmId}/force-end", "forceEndVM", true, NodeManage},
	{"POST", "/v1/keys", "createKey", true, KeyManage},
	{"GET", "/v1/keys", "listKeys", true, KeyManage},
	{"GET", "/v1/keys/{keyId}", "getKey", true, KeyManage},
	{"POST", "/v1/keys/{keyId}/revoke", "revokeKey", true, KeyManage},
	{"GET", "/v1/keys/audit", "listKeyAudit", true, AuditRead},
	// The caller's own key, for any key: what it may do (the console offers only that).
	{"GET", "/v1/keys/self", "getSelfKey", true, ""},
}

// ConsolePath is where the web console is served (docs/console.md): its page at
// ConsolePath + "/", its files below. No key: the page asks for one and sends it to the API.
const ConsolePath = "/console"

// Console is the console's API Gateway resources, both proxied to the api function, which
// serves the files it embeds (package console): the bare path (redirected to the page) and
// every path below it, through one greedy resource rather than a resource per file, so that
// a new file needs no change of the stack.
var Console = []Route{
	{"GET", ConsolePath, "getConsole", false, ""},
	{"GET", ConsolePath + "/{proxy+}", "getConsoleFile", false, ""},
}

// Find returns the route with the operationId (false: none).
func Find(operationID string) (Route, bool) {
	for _, r := range All {
		if r.OperationID == operationID {
			return r, true
		}
	}
	return Route{}, false
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
