// Package console serves the web console: the page's own files and the pinned npm libraries
// (copied into web/vendor by `make console`), embedded in the api function, under
// routes.ConsolePath. Every answer carries the security headers of docs/console.md.
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"

	"github.com/openrelay/capacity/shared/routes"
)

//go:embed web
var files embed.FS

// Libraries are the vendored library files the page imports: `make console` copies them from
// node_modules; a build without them serves a page that cannot start (TestLibrariesEmbedded).
var Libraries = []string{"vendor/preact.mjs", "vendor/htm.mjs"}

// ContentSecurityPolicy: only this origin, for everything; no inline script or style, no
// plug-ins, no framing, no <base> and no form posting elsewhere.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// asset is one file the console serves.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the console's files; a zero Handler is ready to use.
type Handler struct{}

// assets are the served files by path under routes.ConsolePath ("index.html", "vendor/htm.mjs").
var assets = load()

func load() map[string]asset {
	out := map[string]asset{}
	_ = fs.WalkDir(files, "web", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok { // the vendor folder's README, say: not part of the page
			return nil
		}
		body, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		out[strings.TrimPrefix(p, "web/")] = asset{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	return out
}

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// Serves reports whether a request path is the console's (routes.ConsolePath and below).
func Serves(urlPath string) bool {
	return urlPath == routes.ConsolePath || strings.HasPrefix(urlPath, routes.ConsolePath+"/")
}

// With routes the console's paths to the console and every other path to api.
func With(api http.Handler) http.Handler {
	var c Handler
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Serves(r.URL.Path) {
			c.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

// ServeHTTP answers GET of the page (routes.ConsolePath + "/") and its files. The page's
// address ends in "/", so that its files' relative addresses resolve under it: the bare path
// is redirected there (relatively, so that any stage or base path before it stays).
func (Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == routes.ConsolePath {
		h.Set("Cache-Control", "no-store")
		h.Set("Location", path.Base(routes.ConsolePath)+"/")
		w.WriteHeader(http.StatusMovedPermanently)
		return
	}
	name := strings.TrimPrefix(r.URL.Path, routes.ConsolePath+"/")
	if name == "" {
		name = "index.html"
	}
	a, ok := assets[name]
	if !ok {
		h.Set("Cache-Control", "no-store")
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	// Unversioned names: every load revalidates, and an unchanged file is a 304 of no body.
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	if match := r.Header.Get("If-None-Match"); match != "" && strings.Contains(match, a.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", a.contentType)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(a.body)
}
