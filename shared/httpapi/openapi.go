package httpapi

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/openrelay/capacity/shared/capacity"
)

// OpenAPI is the API's contract, an OpenAPI 3.1 document, served at GET /v1/openapi.json.
// Tests tie it to the route table (shared/routes) and to every problem code, and the end to
// end suite validates each request and response against it.
//
//go:embed openapi.json
var OpenAPI []byte

// serverURL is the document's one server URL. The served copy replaces it with the base path
// the document was fetched under: API Gateway serves the API under its stage (or a custom
// domain's base path), and a relative "/" would resolve to the host's root, where the API is
// not.
const serverURL = `"url": "/"`

// OpenAPIFor is the document as served under basePath ("/prod", or "" at the host's root):
// its servers URL is basePath.
func OpenAPIFor(basePath string) []byte {
	basePath = strings.TrimSuffix(basePath, "/")
	if basePath == "" {
		return OpenAPI
	}
	quoted, _ := json.Marshal(basePath) // a string always marshals
	return bytes.Replace(OpenAPI, []byte(serverURL), append([]byte(`"url": `), quoted...), 1)
}

// serveOpenAPI needs no key: the contract is public.
func (h *Handler) serveOpenAPI(w http.ResponseWriter, r *http.Request, _ capacity.Principal, _ string) error {
	base := ""
	if h.BasePath != nil {
		base = h.BasePath(r)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(OpenAPIFor(base))
	return nil
}
