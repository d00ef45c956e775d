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

// serveOpenAPI needs no key: the contract is public.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request, _ capacity.Principal, _ string) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(OpenAPI)
	return nil
}
