package console

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestLibrariesEmbedded fails when the build embedded the page without its libraries: they
// are copied from node_modules by `make console`, never committed.
func TestLibrariesEmbedded(t *testing.T) {
	for _, lib := range Libraries {
		if a, ok := assets[lib]; !ok || len(a.body) < 500 {
			t.Errorf("console/web/%s is missing (or empty): run `make console` (copies it from node_modules after npm ci) before building", lib)
		}
	}
}

func get(t *testing.T, h http.Handler, path string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestServes(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := With(api)
	for _, tc := range []struct {
		path        string
		status      int
		contentType string
		location    string
	}{
		{"/console", http.StatusMovedPermanently, "", "console/"},
		{"/console/", http.StatusOK, "text/html; charset=utf-8", ""},
		{"/console/app.js", http.StatusOK, "text/javascript; charset=utf-8", ""},
		{"/console/style.css", http.StatusOK, "text/css; charset=utf-8", ""},
		{"/console/vendor/README.md", http.StatusNotFound, "text/plain; charset=utf-8", ""},
		{"/console/nothing.js", http.StatusNotFound, "text/plain; charset=utf-8", ""},
		{"/console/../v1/nodes", http.StatusNotFound, "text/plain; charset=utf-8", ""},
		{"/consoles", http.StatusTeapot, "", ""},
		{"/v1/nodes", http.StatusTeapot, "", ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			w := get(t, h, tc.path)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d", w.Code, tc.status)
			}
			if tc.status == http.StatusTeapot {
				return
			}
			if got := w.Header().Get("Content-Type"); got != tc.contentType {
				t.Errorf("Content-Type %q, want %q", got, tc.contentType)
			}
			if got := w.Header().Get("Location"); got != tc.location {
				t.Errorf("Location %q, want %q", got, tc.location)
			}
			for name, want := range map[string]string{
				"Content-Security-Policy": ContentSecurityPolicy,
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
				"X-Frame-Options":         "DENY",
			} {
				if got := w.Header().Get(name); got != want {
					t.Errorf("%s %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestContentSecurityPolicy(t *testing.T) {
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
		if !strings.Contains(ContentSecurityPolicy, want) {
			t.Errorf("CSP lacks %q", want)
		}
	}
	if strings.Contains(ContentSecurityPolicy, "unsafe") {
		t.Errorf("CSP allows something unsafe: %s", ContentSecurityPolicy)
	}
}

func TestRevalidation(t *testing.T) {
	var h Handler
	w := get(t, h, "/console/app.js")
	etag := w.Header().Get("ETag")
	if etag == "" || w.Header().Get("Cache-Control") != "no-cache" {
		t.Fatalf("ETag %q, Cache-Control %q", etag, w.Header().Get("Cache-Control"))
	}
	if w := get(t, h, "/console/app.js", "If-None-Match", etag); w.Code != http.StatusNotModified || w.Body.Len() != 0 {
		t.Errorf("revalidation: %d with %d bytes, want 304 and none", w.Code, w.Body.Len())
	}
	if w := get(t, h, "/console/app.js", "If-None-Match", `"other"`); w.Code != http.StatusOK {
		t.Errorf("changed file: %d, want 200", w.Code)
	}
	if w := httptest.NewRecorder(); true {
		h.ServeHTTP(w, httptest.NewRequest("POST", "/console/", nil))
		if w.Code != http.StatusMethodNotAllowed {
			t.Errorf("POST: %d, want 405", w.Code)
		}
	}
}

// TestPageKeepsToItsOrigin: the page's own files load nothing from elsewhere, have no inline
// script (the CSP would block it), and never hand a string to the HTML parser.
func TestPageKeepsToItsOrigin(t *testing.T) {
	remote := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`)
	for name, a := range assets {
		if strings.HasPrefix(name, "vendor/") {
			continue
		}
		text := string(a.body)
		if remote.MatchString(text) {
			t.Errorf("%s refers to another origin", name)
		}
		for _, banned := range []string{"innerHTML", "outerHTML", "dangerouslySetInnerHTML", "insertAdjacentHTML", "document.write", "eval(", "localStorage", "document.cookie"} {
			if strings.Contains(text, banned) {
				t.Errorf("%s uses %s", name, banned)
			}
		}
	}
	index := string(assets["index.html"].body)
	if regexp.MustCompile(`<script(?:\s+type="module")?>`).MatchString(index) || strings.Contains(index, "style=") || strings.Contains(index, " on") && regexp.MustCompile(`\son\w+=`).MatchString(index) {
		t.Errorf("index.html has inline script, style or handlers")
	}
}
