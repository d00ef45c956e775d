package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestProblemTypeLeadsToItsFix: a real 404 problem's type, followed as a person's browser
// would, opens the errors page the stack serves through API Gateway, at the code's section.
func TestProblemTypeLeadsToItsFix(t *testing.T) {
	r := call(t, http.MethodGet, "/v1/nodes/no-such-node-e2e", keyOwner, nil)
	var p struct{ Type, Code string }
	if r.Status != http.StatusNotFound || json.Unmarshal(r.Body, &p) != nil || p.Code != "not_found" {
		t.Fatalf("GET an unknown node: %d %s, want a 404 not_found problem", r.Status, r.Body)
	}
	typ, err := url.Parse(p.Type)
	if err != nil || !typ.IsAbs() || typ.Host == "" || typ.Fragment != p.Code ||
		!strings.HasSuffix(typ.Path, "/console/errors.html") {
		t.Fatalf("type %q: want an absolute http(s) address of /console/errors.html#%s", p.Type, p.Code)
	}
	t.Logf("type: %s", p.Type)

	// The address names the API as API Gateway does (its execute-api host on the local stack,
	// which browsers resolve to this machine, *.localhost); dial the local stack whatever the
	// host, as not every resolver here knows *.localhost.
	api, err := url.Parse(apiURL)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, api.Host)
		},
	}}
	resp, err := client.Get(p.Type) // the client sends no fragment
	if err != nil {
		t.Fatalf("GET %s: %v", p.Type, err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("GET %s: %d %s, CSP %q: want 200, an HTML page with the console's headers",
			p.Type, resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Security-Policy"))
	}
	section := `<section id="` + p.Code + `">` + "\n" + `<h2><code>` + p.Code + `</code></h2>`
	if !strings.Contains(string(page), section) {
		t.Errorf("GET %s: the page has no section %q with its heading", p.Type, p.Code)
	}
}
