package console

import (
	"bytes"
	"flag"
	"fmt"
	"html"
	"os"
	"regexp"
	"strings"
	"testing"
)

// update rewrites web/errors.html from docs/errors.md: go test ./console -run TestErrorsPage -update
var update = flag.Bool("update", false, "rewrite web/errors.html from docs/errors.md")

const (
	errorsDoc  = "../docs/errors.md"
	errorsPage = "web/errors.html"
)

// TestErrorsPage: the served errors page is docs/errors.md rendered (renderErrorsPage), so the
// two never drift: edit the markdown, then run the test with -update.
func TestErrorsPage(t *testing.T) {
	md, err := os.ReadFile(errorsDoc)
	if err != nil {
		t.Fatal(err)
	}
	want, err := renderErrorsPage(string(md))
	if err != nil {
		t.Fatalf("%s: %v", errorsDoc, err)
	}
	if *update {
		if err := os.WriteFile(errorsPage, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(errorsPage)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale against %s: run go test ./console -run TestErrorsPage -update", errorsPage, errorsDoc)
	}
	if served := assets["errors.html"]; !bytes.Equal(served.body, got) || served.contentType != contentTypes[".html"] {
		t.Errorf("errors.html is not served as committed")
	}
}

// TestRenderErrorsPage: each construct the page keeps, and that every string is escaped.
func TestRenderErrorsPage(t *testing.T) {
	tests := []struct {
		name, md, want string
	}{
		{"title and a section", "# Errors\n\n### `not_found`\n\n404. No such node.\nFix: check.\n",
			`<h1>Errors</h1>` + "\n" + `<section id="not_found">` + "\n" + `<h2><code>not_found</code></h2>` + "\n" + `<p>404. No such node. Fix: check.</p>` + "\n</section>\n"},
		{"inline code is escaped", "# E\n\nsend `<b>&x</b>` now\n", "<h1>E</h1>\n<p>send <code>&lt;b&gt;&amp;x&lt;/b&gt;</code> now</p>\n"},
		{"text is escaped", "# E\n\na <img src=x onerror=alert(1)> & \"b\"\n", "<h1>E</h1>\n<p>a &lt;img src=x onerror=alert(1)&gt; &amp; &#34;b&#34;</p>\n"},
		{"a link to another doc is its text", "# E\n\nsee [Permissions](api.md#permissions).\n", "<h1>E</h1>\n<p>see Permissions.</p>\n"},
		{"a link within the page", "# E\n\nsee [that](#not_found).\n", "<h1>E</h1>\n<p>see <a href=\"#not_found\">that</a>.</p>\n"},
		{"an outside link", "# E\n\nsee [RFC](https://www.rfc-editor.org/rfc/rfc9457?a=1&b=2).\n", "<h1>E</h1>\n<p>see <a href=\"https://www.rfc-editor.org/rfc/rfc9457?a=1&amp;b=2\">RFC</a>.</p>\n"},
		{"a script link is its text", "# E\n\n[x](javascript:void0)\n", "<h1>E</h1>\n<p>x</p>\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := renderBody(tt.md)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
	for _, bad := range []string{"# E\n\n- a list\n", "# E\n\n```\ncode\n```\n", "# E\n\n### not a code\n", "# E\n\n## level two\n"} {
		if _, err := renderBody(bad); err == nil {
			t.Errorf("renderBody(%q): no error, want one (the page would drop what it cannot render)", bad)
		}
	}
}

// renderErrorsPage is docs/errors.md as a plain HTML page in the console's style: no script.
func renderErrorsPage(md string) ([]byte, error) {
	body, err := renderBody(md)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n" +
		"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n" +
		"<title>Errors and their fixes</title>\n<link rel=\"icon\" href=\"data:,\">\n" +
		"<link rel=\"stylesheet\" href=\"style.css\">\n</head>\n<body>\n" +
		"<!-- Generated from docs/errors.md by go test ./console -run TestErrorsPage -update: edit that. -->\n" +
		"<header><nav><a href=\"./\">Capacity console</a></nav></header>\n<main>\n")
	b.WriteString(body)
	b.WriteString("</main>\n</body>\n</html>\n")
	return []byte(b.String()), nil
}

// codeHeading is a section's heading: ### `code`.
var codeHeading = regexp.MustCompile("^### `([a-z0-9_]+)`$")

// renderBody renders the markdown errors.md uses, and refuses anything else: a title (#), a
// section per code (### `code`), paragraphs with inline code and links.
func renderBody(md string) (string, error) {
	var b strings.Builder
	var para []string
	inSection := false
	flush := func() {
		if len(para) > 0 {
			b.WriteString("<p>" + inline(strings.Join(para, " ")) + "</p>\n")
			para = nil
		}
	}
	for _, line := range strings.Split(md, "\n") {
		line = strings.TrimRight(line, " ")
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "# "):
			flush()
			b.WriteString("<h1>" + inline(strings.TrimPrefix(line, "# ")) + "</h1>\n")
		case strings.HasPrefix(line, "#"):
			m := codeHeading.FindStringSubmatch(line)
			if m == nil {
				return "", fmt.Errorf("heading %q: only # title and ### `code` are rendered", line)
			}
			flush()
			if inSection {
				b.WriteString("</section>\n")
			}
			inSection = true
			b.WriteString(`<section id="` + m[1] + "\">\n<h2><code>" + m[1] + "</code></h2>\n")
		case strings.HasPrefix(line, "- "), strings.HasPrefix(line, "* "), strings.HasPrefix(line, "```"),
			strings.HasPrefix(line, "|"), strings.HasPrefix(line, ">"):
			return "", fmt.Errorf("line %q: lists, code blocks, tables and quotes are not rendered", line)
		default:
			para = append(para, strings.TrimSpace(line))
		}
	}
	flush()
	if inSection {
		b.WriteString("</section>\n")
	}
	return b.String(), nil
}

// inlineMarkup is inline code or a link [text](target).
var inlineMarkup = regexp.MustCompile("`([^`]*)`|\\[([^\\]]+)\\]\\(([^)\\s]+)\\)")

// inline escapes text, keeping inline code and links: a link within the page or to an
// https address stays one; a link to another doc (not served) is its text.
func inline(text string) string {
	var b strings.Builder
	last := 0
	for _, m := range inlineMarkup.FindAllStringSubmatchIndex(text, -1) {
		b.WriteString(html.EscapeString(text[last:m[0]]))
		last = m[1]
		if m[2] >= 0 {
			b.WriteString("<code>" + html.EscapeString(text[m[2]:m[3]]) + "</code>")
			continue
		}
		label, target := inline(text[m[4]:m[5]]), text[m[6]:m[7]]
		if strings.HasPrefix(target, "#") || strings.HasPrefix(target, "https://") {
			b.WriteString(`<a href="` + html.EscapeString(target) + `">` + label + "</a>")
		} else {
			b.WriteString(label)
		}
	}
	b.WriteString(html.EscapeString(text[last:]))
	return b.String()
}
