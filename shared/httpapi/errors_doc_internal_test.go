package httpapi

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// errorTableHeader heads the error table of docs/api.md ("Errors"): one row per problem code.
const errorTableHeader = "| status | code | when |"

// TestErrorTableDoc: the error table of docs/api.md lists every problem code (the domain's
// and the transport's) once, no other, each with the status the API answers it with.
func TestErrorTableDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	codes := domainCodes(t, "../capacity/errors.go", "problem.go")
	if len(codes) < 20 {
		t.Fatalf("found only %d codes: %v", len(codes), codes)
	}
	for _, problem := range errorTableProblems(string(doc), codes) {
		t.Errorf("docs/api.md: %s", problem)
	}
}

// errorTableProblems returns what is wrong with doc's error table against codes (the
// declared problem codes) and StatusOf.
func errorTableProblems(doc string, codes map[string]bool) []string {
	lines := strings.Split(doc, "\n")
	start := slices.Index(lines, errorTableHeader)
	if start < 0 || start+2 > len(lines) {
		return []string{"no error table (header " + errorTableHeader + ")"}
	}
	var problems []string
	listed := map[string]bool{}
	for _, line := range lines[start+2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			problems = append(problems, fmt.Sprintf("row %q: want status | code | when", line))
			continue
		}
		code := strings.Trim(strings.TrimSpace(cells[1]), "`")
		status, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("row %q: status: %v", line, err))
		case !codes[code]:
			problems = append(problems, fmt.Sprintf("%s: no such problem code", code))
		case listed[code]:
			problems = append(problems, fmt.Sprintf("%s: listed twice", code))
		case status != StatusOf(capacity.Code(code)):
			problems = append(problems, fmt.Sprintf("%s: the table says %d, the API answers %d", code, status, StatusOf(capacity.Code(code))))
		}
		listed[code] = true
	}
	for _, code := range slices.Sorted(maps.Keys(codes)) {
		if !listed[code] {
			problems = append(problems, fmt.Sprintf("%s: missing from the table", code))
		}
	}
	return problems
}

// TestErrorTableProblems: the check finds each way the table can drift from the codes.
func TestErrorTableProblems(t *testing.T) {
	codes := map[string]bool{"not_found": true, "rate_limited": true}
	table := func(rows ...string) string {
		return "## Errors\n\n" + errorTableHeader + "\n|---|---|---|\n" + strings.Join(rows, "\n") + "\n\nA call answered ...\n"
	}
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"as the code says", table("| 404 | `not_found` | no such node |", "| 429 | `rate_limited` | over its limit |"), nil},
		{"a code missing", table("| 404 | `not_found` | no such node |"), []string{"rate_limited: missing from the table"}},
		{"a code that does not exist", table("| 404 | `not_found` | x |", "| 429 | `rate_limited` | x |", "| 409 | `gone` | x |"), []string{"gone: no such problem code"}},
		{"another status", table("| 410 | `not_found` | x |", "| 429 | `rate_limited` | x |"), []string{"not_found: the table says 410, the API answers 404"}},
		{"a code twice", table("| 404 | `not_found` | x |", "| 404 | `not_found` | y |", "| 429 | `rate_limited` | x |"), []string{"not_found: listed twice"}},
		{"no table", "## Errors\n", []string{"no error table (header " + errorTableHeader + ")"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errorTableProblems(tt.doc, codes); !slices.Equal(got, tt.want) {
				t.Errorf("problems = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestProblemTypesResolve: every problem code's type URI is a section of docs/errors.md (the
// page a person reads for the error's fix): the URI names that page, and the page has a
// heading whose anchor is the code.
func TestProblemTypesResolve(t *testing.T) {
	const page = "docs/errors.md"
	doc, err := os.ReadFile("../../" + page)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if title, ok := strings.CutPrefix(line, "### "); ok {
			anchors[strings.ToLower(strings.Trim(strings.TrimSpace(title), "`"))] = true
		}
	}
	codes := domainCodes(t, "../capacity/errors.go", "problem.go")
	if len(codes) < 20 {
		t.Fatalf("found only %d codes: %v", len(codes), codes)
	}
	for _, code := range slices.Sorted(maps.Keys(codes)) {
		uri := ProblemType(capacity.Code(code))
		target, anchor, ok := strings.Cut(uri, "#")
		if !ok || !strings.HasSuffix(target, "/"+page) {
			t.Errorf("%s: type %s is not a section of %s", code, uri, page)
			continue
		}
		if !anchors[anchor] {
			t.Errorf("%s: type %s: %s has no section ### `%s`", code, uri, page, anchor)
		}
	}
}
