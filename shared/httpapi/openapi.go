package httpapi

import (
	_ "embed"
	"net/http"

	"github.com/openrelay/capacity/shared/capacity"
)

// OpenAPI is the API's contract, an OpenAPI 3.1 document, served at GET /v1/openapi.json.
// Tests tie it to the route table (shared/routes) and to every problem code, and the end to
// end suite validates each request and response against it.
//
//go:embed openapi.json
var OpenAPI []byte

// The document is served as kept. Its one server URL is "..", a reference relative to the
// document's own URL, as OpenAPI resolves server URLs: the document is always at
// <base>/v1/openapi.json, so ".." is <base>/ whatever the base, which the function cannot
// always tell (the local stack's /restapis/<id>/<stage>/_user_request_ reaches it as the
// stage alone, and a path-absolute "/<stage>" would lose the rest).

// serveOpenAPI needs no key: the contract is public.
func (h *Handler) serveOpenAPI(w http.ResponseWriter, _ *http.Request, _ capacity.Principal, _ string) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(OpenAPI)
	return nil
}
