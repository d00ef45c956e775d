package httpapi

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
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

// TestProblemTypesResolve: every problem code's type URI is a section of the errors page the
// console serves (console/web/errors.html, which go test ./console keeps equal to
// docs/errors.md): the URI is the page under the API's address, and the page has an element
// whose id is the code.
func TestProblemTypesResolve(t *testing.T) {
	page, err := os.ReadFile("../../console/web/errors.html")
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://abc.execute-api.eu-west-1.amazonaws.com/prod"
	codes := domainCodes(t, "../capacity/errors.go", "problem.go")
	if len(codes) < 20 {
		t.Fatalf("found only %d codes: %v", len(codes), codes)
	}
	for _, code := range slices.Sorted(maps.Keys(codes)) {
		uri := ProblemType(base, capacity.Code(code))
		target, anchor, ok := strings.Cut(uri, "#")
		if !ok || target != base+"/console/errors.html" || anchor != code {
			t.Errorf("%s: type %s is not the section %s of %s/console/errors.html", code, uri, code, base)
			continue
		}
		if !strings.Contains(string(page), `<section id="`+anchor+`">`) {
			t.Errorf("%s: type %s: the errors page has no section id=%q", code, uri, anchor)
		}
	}
}

// TestProblemTypeAddress: the type URI is built from the address the API was called under.
func TestProblemTypeAddress(t *testing.T) {
	prod := func(*http.Request) string { return "/prod" }
	tests := []struct {
		name     string
		host     string
		hostHdr  string
		proto    string
		basePath func(*http.Request) string
		want     string
	}{
		{"API Gateway, a stage", "abc.execute-api.eu-west-1.amazonaws.com", "abc.execute-api.eu-west-1.amazonaws.com", "https", prod,
			"https://abc.execute-api.eu-west-1.amazonaws.com/prod/console/errors.html#not_found"},
		{"a custom domain at its root", "capacity.example.com", "capacity.example.com", "https", nil,
			"https://capacity.example.com/console/errors.html#not_found"},
		{"the Host header over the event's domain", "abc.execute-api.localhost", "abc.execute-api.localhost:4566", "", prod,
			"http://abc.execute-api.localhost:4566/prod/console/errors.html#not_found"},
		{"an odd scheme is ignored", "h.example", "", "javascript", nil, "http://h.example/console/errors.html#not_found"},
		{"a host that is no host: the path alone", "h.example", "a/b@evil", "https", prod, "/prod/console/errors.html#not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/nodes/x", nil)
			r.Host = tt.host
			if tt.hostHdr != "" {
				r.Header.Set("Host", tt.hostHdr)
			}
			if tt.proto != "" {
				r.Header.Set("X-Forwarded-Proto", tt.proto)
			}
			h := &Handler{BasePath: tt.basePath}
			if got := problemOf(capacity.Errorf(capacity.CodeNotFound, "no such node"), h.apiBaseURL(r)).Type; got != tt.want {
				t.Errorf("type = %s, want %s", got, tt.want)
			}
		})
	}
}
