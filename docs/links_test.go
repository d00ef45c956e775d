// Package docs holds the service's documentation (the Markdown files beside this one) and
// the test that keeps its links working: the README and every docs file link each other by
// relative path and heading anchor, and a moved file or a renamed heading would otherwise
// leave a reader at a dead link.
package docs

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// markdownFiles are the files whose links are checked: the README and every docs/*.md.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{"../README.md"}, files...)
}

// TestLinksResolve: every relative link of the README and the docs names a file that exists
// and, with a #fragment, a heading of that file (GitHub's anchors).
func TestLinksResolve(t *testing.T) {
	for _, problem := range brokenLinks(t, markdownFiles(t)) {
		t.Error(problem)
	}
}

// brokenLinks returns, for each link of files that names no file or no heading, where it is
// and what is wrong with it.
func brokenLinks(t *testing.T, files []string) []string {
	t.Helper()
	var problems []string
	anchors := map[string]map[string]bool{} // cleaned path -> its heading anchors
	for _, f := range files {
		for _, l := range links(read(t, f)) {
			target, fragment, _ := strings.Cut(l.target, "#")
			path := filepath.Clean(f)
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
			}
			if _, err := os.Stat(path); err != nil {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: %v", f, l.line, l.target, err))
				continue
			}
			if fragment == "" {
				continue
			}
			if !strings.HasSuffix(path, ".md") {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: an anchor into a file that is not Markdown", f, l.line, l.target))
				continue
			}
			if anchors[path] == nil {
				anchors[path] = headingAnchors(read(t, path))
			}
			if !anchors[path][fragment] {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: %s has no heading with anchor #%s", f, l.line, l.target, path, fragment))
			}
		}
	}
	return problems
}

// TestREADMELinksEveryDoc: a newcomer reaches every docs file from the README.
func TestREADMELinksEveryDoc(t *testing.T) {
	linked := map[string]bool{}
	for _, l := range links(read(t, "../README.md")) {
		target, _, _ := strings.Cut(l.target, "#")
		linked[filepath.Clean(filepath.Join("..", target))] = true
	}
	for _, f := range markdownFiles(t)[1:] {
		if !linked[filepath.Join("..", "docs", f)] {
			t.Errorf("README.md does not link docs/%s", f)
		}
	}
}

// link is one inline link or image of a Markdown file: its target as written and its line.
type link struct {
	target string
	line   int
}

var (
	// inlineLink matches the target of [text](target) and ![alt](target), with an optional
	// "title"; the text may span lines, the target may not.
	inlineLink = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
)

// links returns the relative links of text outside fenced code blocks and code spans.
// External ones (a scheme such as https: or mailto:) are not checked here.
func links(text string) []link {
	var out []link
	for i, line := range proseLines(text) {
		for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			if target := m[1]; !hasScheme(target) {
				out = append(out, link{target, i + 1})
			}
		}
	}
	return out
}

// proseLines returns text's lines with those of fenced code blocks blanked, so that line
// numbers stay those of the file.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

func hasScheme(target string) bool {
	scheme, _, ok := strings.Cut(target, ":")
	return ok && !strings.ContainsAny(scheme, "/#.")
}

// headingAnchors returns the anchors GitHub gives text's ATX headings: the heading's text as
// shown (links reduced to their text, code spans to their content), lower-cased, with every
// character but letters, digits, spaces, hyphens and underscores dropped and each space
// made a hyphen; a repeated anchor gets -1, -2, ... in order.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := slug(m[2])
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

var linkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

func slug(title string) string {
	title = linkText.ReplaceAllString(title, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBrokenLinks: the check finds each kind of broken link, and only those.
func TestBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("b.md", "# B\n\n## Known limits\n\n## Known limits\n")
	write("code.go", "package x\n")
	tests := []struct {
		name, text string
		broken     int
	}{
		{"file and anchors that exist", "[b](b.md) [l](b.md#known-limits) [l2](b.md#known-limits-1) [self](#a) [go](code.go)\n# A\n", 0},
		{"no such file", "[x](missing.md)\n", 1},
		{"no such heading", "[x](b.md#known-limit)\n", 1},
		{"no such heading here", "# A\n[x](#b)\n", 1},
		{"anchor into a file that is not Markdown", "[x](code.go#L1)\n", 1},
		{"a link text over two lines", "[the\nlimits](b.md#nope)\n", 1},
		{"external links and code are not checked", "[x](https://example.com/nope) `[x](nope.md)`\n```\n[x](nope.md)\n```\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			problems := brokenLinks(t, []string{write("a.md", tt.text)})
			if len(problems) != tt.broken {
				t.Errorf("problems = %q, want %d", problems, tt.broken)
			}
		})
	}
}

// TestHeadingAnchors pins GitHub's anchor rules against headings of the kinds the docs have.
func TestHeadingAnchors(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"## Security model", []string{"security-model"}},
		{"### What the functions' roles may do", []string{"what-the-functions-roles-may-do"}},
		{"#### Authorisation matrix: figures", []string{"authorisation-matrix-figures"}},
		{"## Read, decide, commit", []string{"read-decide-commit"}},
		{"## `capacityctl` and its exit codes", []string{"capacityctl-and-its-exit-codes"}},
		{"## The [local stack](local-stack.md)", []string{"the-local-stack"}},
		{"## snake_case and Ünïcode", []string{"snake_case-and-ünïcode"}},
		{"## Closed ##", []string{"closed"}},
		{"# A\n## A\n## A", []string{"a", "a-1", "a-2"}},
		{"```\n# not a heading\n```\n#not one either", nil},
	}
	for _, tt := range tests {
		if got := slices.Sorted(maps.Keys(headingAnchors(tt.text))); !slices.Equal(got, tt.want) {
			t.Errorf("headingAnchors(%q) = %q, want %q", tt.text, got, tt.want)
		}
	}
}
