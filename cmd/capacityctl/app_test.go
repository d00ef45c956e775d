package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// result is one run of capacityctl.
type result struct {
	code        int
	stdout, err string
}

// runCLI runs capacityctl with args against api (may be nil), stdin and env.
func runCLI(t *testing.T, api *httptest.Server, stdin string, env map[string]string, args ...string) result {
	t.Helper()
	return runCLIWith(context.Background(), t, api, strings.NewReader(stdin), env, args...)
}

// runCLIWith is runCLI with a context (Ctrl-C cancels it) and any stdin.
func runCLIWith(ctx context.Context, t *testing.T, api *httptest.Server, stdin io.Reader, env map[string]string, args ...string) result {
	t.Helper()
	return runApp(ctx, t, api, stdin, env, nil, args...)
}

// runApp is runCLIWith with configure (nil: none) applied to the app before it runs: a clock, say.
func runApp(ctx context.Context, t *testing.T, api *httptest.Server, stdin io.Reader, env map[string]string, configure func(*app), args ...string) result {
	t.Helper()
	var out, errOut syncBuffer
	a := &app{io: stdio{in: stdin, out: &out, err: &errOut}, pollEvery: time.Millisecond,
		getenv: func(k string) string { return env[k] }}
	if configure != nil {
		configure(a)
	}
	if api != nil {
		a.httpClient = api.Client()
		if _, ok := env["CAPACITY_ENDPOINT"]; !ok && !hasFlag(args, "--endpoint") {
			args = append([]string{"--endpoint", api.URL + "/dev/"}, args...)
		}
		if !hasFlag(args, "--key") {
			args = append([]string{"--key", "ocap_test"}, args...)
		}
	}
	a.describeStack = func(_ context.Context, _ aws.Config, name string) (map[string]string, error) {
		if name != "capacity-dev" {
			return nil, fmt.Errorf("describe stack %s: does not exist", name)
		}
		return map[string]string{"ApiUrl": "https://from-stack.example/dev/", "KeysTableName": "keys-dev"}, nil
	}
	a.awsConfig = func(context.Context) (aws.Config, error) { return aws.Config{Region: "eu-west-1"}, nil }
	code := a.main(ctx, args)
	return result{code, out.String(), errOut.String()}
}

// syncBuffer is a bytes.Buffer safe for the prompt's reader goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

func TestUsageErrors(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a usage error must send nothing: %s %s", r.Method, r.URL)
	}))
	defer api.Close()
	tests := []struct {
		name    string
		noAPI   bool
		args    []string
		wantErr string
	}{
		{"no command", false, nil, "usage: capacityctl"},
		{"unknown command", false, []string{"nodes", "explode"}, `unknown command "nodes explode"`},
		{"a group without its verb", false, []string{"reclaims"}, "reclaims needs a verb: one of list, get, wait, retry, force-end"},
		{"no such group", false, []string{"nodez"}, `unknown command "nodez"`},
		{"help of no such group", false, []string{"help", "nodez"}, `unknown command "nodez"`},
		{"bad -o", false, []string{"-o", "yaml", "nodes", "get", "--node", "n"}, "--output must be table or json"},
		{"dry run and at", false, []string{"reclaim", "--node", "n", "--reservation", "r", "--units", "u", "--dry-run", "--at", "1h"}, "--dry-run or --at, not both"},
		{"at with a count", false, []string{"reclaim", "--node", "n", "--reservation", "r", "--count", "1", "--at", "1h"}, "--at needs --units"},
		{"at in the past", false, []string{"reclaim", "--node", "n", "--reservation", "r", "--units", "u", "--at", "-1h"}, "--at: want a positive duration"},
		{"bad at", false, []string{"reclaim", "--node", "n", "--reservation", "r", "--units", "u", "--at", "midnight"}, "--at: want an RFC 3339 time"},
		{"bad tier", false, []string{"vms", "place", "--node", "n", "--vm", "v", "--org", "o", "--tier", "gold", "--units", "u"}, "--tier must be spot, reserved or on-demand"},
		{"force-end without a reason", false, []string{"reclaims", "force-end", "--node", "n", "--reservation", "r", "--reclaim", "op", "--vm", "v"}, "--reason is required"},
		{"wait without the reclaim", false, []string{"reclaims", "wait", "--node", "n", "--reservation", "r"}, "--reclaim is required"},
		{"scheduled cancel without an id", false, []string{"scheduled", "cancel", "--node", "n", "--reservation", "r"}, "--id is required"},
		{"release without units", false, []string{"release", "--node", "n", "--reservation", "r"}, "--units is required"},
		{"completion of no shell", false, []string{"completion"}, "name the shell"},
		{"completion of another shell", false, []string{"completion", "tcsh"}, "completion for bash, zsh or fish"},
		{"missing flag", false, []string{"reservations", "get", "--node", "n"}, "--reservation is required"},
		{"bad output", false, []string{"--output", "xml", "nodes", "get", "--node", "n"}, "--output must be table or json"},
		{"unknown flag", false, []string{"nodes", "get", "--nod", "n"}, "flag provided but not defined: -nod"},
		{"revoke without an id", false, []string{"keys", "revoke"}, "name the key"},
		{"extra argument", false, []string{"nodes", "get", "--node", "n", "extra"}, `unexpected argument "extra"`},
		{"verify names no chain", false, []string{"audit", "verify"}, "name exactly one chain"},
		{"verify names two chains", false, []string{"audit", "verify", "--node", "n", "--keys"}, "name exactly one chain"},
		{"audit list of a reservation of the keys", false, []string{"audit", "list", "--keys", "--reservation", "r"}, "name --node N"},
		{"grace out of range", false, []string{"reclaim", "--node", "n", "--reservation", "r", "--units", "u", "--grace", "121"}, "--grace must be 0..120"},
		{"expected generation 0", false, []string{"topology", "set", "--node", "n", "--units", "u", "--expected-gen", "0"}, "--expected-gen must be at least 1"},
		{"expected generation negative", false, []string{"topology", "set", "--node", "n", "--units", "u", "--expected-gen", "-2"}, "--expected-gen must be at least 1"},
		{"bad expiry", false, []string{"keys", "create", "--org", "o", "--expires", "tomorrow"}, "--expires"},
		{"bad rate limit", false, []string{"keys", "create", "--org", "o", "--rate-limit", "5"}, "--rate-limit: want PER_SECOND/BURST"},
		{"rate limit not a number", false, []string{"keys", "create", "--org", "o", "--rate-limit", "fast/10"}, "--rate-limit: want PER_SECOND/BURST"},
		{"bad start", false, []string{"reservations", "create", "--node", "n", "--units", "u", "--allowed-orgs", "o", "--starts", "monday"}, "--starts: want an RFC 3339 time"},
		{"no endpoint", true, []string{"--key", "k", "nodes", "get", "--node", "n"}, "no API endpoint"},
		{"no key", true, []string{"--endpoint", "https://x/", "nodes", "get", "--node", "n"}, "no API key"},
		{"bootstrap without outputs", true, []string{"keys", "create", "--bootstrap", "--org", "o"}, "KeysTableName"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := api
			if tt.noAPI {
				srv = nil
			}
			got := runCLI(t, srv, "", nil, tt.args...)
			if got.code != exitUsage || !strings.Contains(got.err, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", got.code, got.err, exitUsage, tt.wantErr)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	tests := []struct {
		args []string
		want []string // the help must hold these (flags: listed as "  -name")
	}{
		{[]string{"help"}, []string{"usage: capacityctl", "reclaims wait", "examples:", "exit codes:", "5 reclaim --wait or reclaims wait ran out"}},
		{[]string{"-h"}, []string{"usage: capacityctl", "-o, --output FORMAT"}},
		{[]string{"reclaim", "-h"}, []string{"  -idempotency-key", "  -wait", "  -grace", "  -yes", "  -endpoint", "  -dry-run", "  -at", "  -o ", "capacityctl reclaim --dry-run --node"}},
		{[]string{"keys", "create", "--help"}, []string{"  -bootstrap", "  -idempotency-key", "  -rate-limit", "examples:"}},
		{[]string{"topology", "set", "--help"}, []string{"  -expected-gen", "  -idempotency-key"}},
		{[]string{"reclaims", "--help"}, []string{"capacityctl reclaims: reclaim operations", "verbs:", "  get ", "  wait ", "  retry ", "  force-end ", "capacityctl reclaims wait --node node-1"}},
		{[]string{"help", "scheduled"}, []string{"  cancel ", "capacityctl scheduled cancel --node node-1 --reservation res-acme --id srcl_01hx"}},
		{[]string{"help", "reclaims", "force-end"}, []string{"usage: capacityctl reclaims force-end", "  -vm", "  -reason"}},
	}
	for _, tt := range tests {
		got := runCLI(t, nil, "", nil, tt.args...)
		if got.code != exitOK || got.err != "" {
			t.Errorf("%v: exit %d, stderr %q; want 0 and the help on stdout", tt.args, got.code, got.err)
		}
		for _, w := range tt.want {
			if !strings.Contains(got.stdout, w) {
				t.Errorf("%v: the help lacks %q\n%s", tt.args, w, got.stdout)
			}
		}
	}
}

// Every command's and every group's help has examples, and each example names its command.
func TestHelpExamples(t *testing.T) {
	for _, c := range commands() {
		if len(c.examples) == 0 {
			t.Errorf("%s has no example", c.name())
		}
		for _, ex := range c.examples {
			if !strings.Contains(ex, "capacityctl ") || !strings.Contains(ex, " "+c.group) {
				t.Errorf("%s: example %q does not run it", c.name(), ex)
			}
		}
		got := runCLI(t, nil, "", nil, append(strings.Fields(c.name()), "--help")...)
		if got.code != exitOK || !strings.Contains(got.stdout, "usage: capacityctl "+c.name()) || !strings.Contains(got.stdout, c.examples[0]) {
			t.Errorf("%s --help: exit %d\n%s", c.name(), got.code, got.stdout)
		}
	}
	for _, g := range groups {
		got := runCLI(t, nil, "", nil, g.name, "--help")
		if got.code != exitOK || !strings.Contains(got.stdout, "examples:") {
			t.Errorf("%s --help: exit %d\n%s%s", g.name, got.code, got.stdout, got.err)
		}
	}
}

// endpointIs checks the API endpoint a resolves: want, or ("" want) an error naming
// wantErr. It reports whether it resolved one.
func endpointIs(t *testing.T, a *app, want, wantErr string) bool {
	t.Helper()
	got, err := a.apiEndpoint(context.Background())
	if want == "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("endpoint %q, error %v; want an error with %q", got, err, wantErr)
		}
		return false
	}
	if err != nil || got != want {
		t.Fatalf("endpoint %q, %v; want %q", got, err, want)
	}
	return true
}

func TestEndpointResolution(t *testing.T) {
	dir := t.TempDir()
	one := filepath.Join(dir, "one.json")
	two := filepath.Join(dir, "two.json")
	writeFile(t, one, `{"capacity-local":{"ApiUrl":"http://127.0.0.1:4566/restapis/a/local/_user_request_/","KeysTableName":"keys-local"}}`)
	writeFile(t, two, `{"capacity-dev":{"ApiUrl":"https://dev/"},"capacity-prod":{"ApiUrl":"https://prod/"}}`)
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		want    string // endpoint; "" = an error
		wantErr string
		local   string // the AWS endpoint for a local stack
	}{
		{"flag first", map[string]string{"CAPACITY_ENDPOINT": "https://env/"}, []string{"--endpoint", "https://flag/", "--outputs", one}, "https://flag/", "", ""},
		{"then the environment", map[string]string{"CAPACITY_ENDPOINT": "https://env/"}, []string{"--outputs", one}, "https://env/", "", ""},
		{"then an outputs file", nil, []string{"--outputs", one}, "http://127.0.0.1:4566/restapis/a/local/_user_request_/", "", "http://127.0.0.1:4566"},
		{"a file of two stacks needs --stack", nil, []string{"--outputs", two}, "", "name one with --stack", ""},
		{"--stack picks one of the file", nil, []string{"--outputs", two, "--stack", "capacity-prod"}, "https://prod/", "", ""},
		{"--stack alone asks CloudFormation", nil, []string{"--stack", "capacity-dev"}, "https://from-stack.example/dev/", "", ""},
		{"an unknown stack", nil, []string{"--stack", "capacity-nope"}, "", "does not exist", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &app{getenv: func(k string) string { return tt.env[k] }, io: stdio{err: io.Discard}}
			fs := newFlagSet(a)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			a.describeStack = func(_ context.Context, _ aws.Config, name string) (map[string]string, error) {
				if name != "capacity-dev" {
					return nil, fmt.Errorf("describe stack %s: does not exist", name)
				}
				return map[string]string{"ApiUrl": "https://from-stack.example/dev/"}, nil
			}
			a.awsConfig = func(context.Context) (aws.Config, error) { return aws.Config{}, nil }
			if !endpointIs(t, a, tt.want, tt.wantErr) {
				return
			}
			if local := a.localEndpoint(context.Background()); local != tt.local {
				t.Errorf("local AWS endpoint %q, want %q", local, tt.local)
			}
		})
	}
}

// An outputs file found in the current directory sends the key only to this machine; one
// named with --outputs is used wherever it points, but never over plain http to another host.
func TestOutputsFileTrust(t *testing.T) {
	const local = `{"capacity-local":{"ApiUrl":"http://127.0.0.1:4566/restapis/a/local/_user_request_/"}}`
	tests := []struct {
		name    string
		file    string // .local/outputs.json in the working directory ("": none)
		args    []string
		env     map[string]string
		want    string // the URL the request went to; "" = refused, nothing sent
		wantErr string
	}{
		{"the local stack's file, found", local, nil, nil, "http://127.0.0.1:4566/restapis/a/local/_user_request_/v1/nodes/n1", ""},
		{"a found file naming another machine", `{"s":{"ApiUrl":"https://api.attacker.example/dev/"}}`, nil, nil, "", "not on this machine"},
		{"a found file naming a look-alike of localhost", `{"s":{"ApiUrl":"http://localhost.attacker.example/"}}`, nil, nil, "", "not on this machine"},
		{"a found file without an API", `{"s":{"TableName":"t"}}`, nil, nil, "", "not on this machine"},
		{"the same file named with --outputs", `{"s":{"ApiUrl":"https://api.example/dev/"}}`, []string{"--outputs", ".local/outputs.json"}, nil, "https://api.example/dev/v1/nodes/n1", ""},
		{"a named file with plain http to another machine", `{"s":{"ApiUrl":"http://api.example/dev/"}}`, []string{"--outputs", ".local/outputs.json"}, nil, "", "plain http"},
		{"--endpoint over plain http to another machine", "", []string{"--endpoint", "http://api.example/dev/"}, nil, "", "plain http"},
		{"CAPACITY_ENDPOINT over plain http to another machine", "", nil, map[string]string{"CAPACITY_ENDPOINT": "http://10.1.2.3/dev/"}, "", "plain http"},
		{"--endpoint over http to this machine", "", []string{"--endpoint", "http://localhost:4566/dev/"}, nil, "http://localhost:4566/dev/v1/nodes/n1", ""},
		{"an explicit endpoint wins over a found file", `{"s":{"ApiUrl":"https://api.attacker.example/dev/"}}`, []string{"--endpoint", "https://api.example/dev/"}, nil, "https://api.example/dev/v1/nodes/n1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			if tt.file != "" {
				if err := os.Mkdir(".local", 0o700); err != nil {
					t.Fatal(err)
				}
				writeFile(t, ".local/outputs.json", tt.file)
			}
			var sent []string
			var errOut bytes.Buffer
			a := &app{io: stdio{in: strings.NewReader(""), out: io.Discard, err: &errOut},
				getenv: func(k string) string { return tt.env[k] },
				httpClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					sent = append(sent, r.URL.String())
					return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{"id":"n1"}`))}, nil
				})}}
			code := a.main(context.Background(), append(append([]string{"--key", "ocap_secret"}, tt.args...), "nodes", "get", "--node", "n1"))
			if tt.want == "" {
				if code != exitUsage || !strings.Contains(errOut.String(), tt.wantErr) || len(sent) != 0 {
					t.Fatalf("exit %d, sent %v, stderr %s; want exit %d with %q, nothing sent", code, sent, errOut.String(), exitUsage, tt.wantErr)
				}
				return
			}
			if code != 0 || !slices.Equal(sent, []string{tt.want}) {
				t.Fatalf("exit %d, sent %v, stderr %s; want %s", code, sent, errOut.String(), tt.want)
			}
		})
	}
}

// A redirect may not carry the key to plain http.
func TestRedirectToPlainHTTPRefused(t *testing.T) {
	var sent []string
	var errOut bytes.Buffer
	a := &app{io: stdio{in: strings.NewReader(""), out: io.Discard, err: &errOut}, getenv: func(string) string { return "" },
		httpClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent = append(sent, r.URL.String())
			return &http.Response{StatusCode: http.StatusFound, Header: http.Header{"Location": {"http://api.example/dev/v1/nodes/n1"}}, Body: http.NoBody}, nil
		})}}
	code := a.main(context.Background(), []string{"--key", "ocap_secret", "--endpoint", "https://api.example/dev/", "nodes", "get", "--node", "n1"})
	if code == 0 || len(sent) != 1 || !strings.Contains(errOut.String(), "plain http") {
		t.Fatalf("exit %d, sent %v, stderr %s; want a failure after the first request only", code, sent, errOut.String())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func newFlagSet(a *app) *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	a.globalFlags(fs)
	return fs
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestOutputFormats(t *testing.T) {
	node := `{"node":{"nodeId":"node-1","ownerOrgId":"org-owner","unitIds":["gpu-0","gpu-1"],"agentEndpoint":"https://agent","topologyGen":2,"version":5,"auditHead":{"seq":7,"hash":"abc"},"agentKeyGen":2,"agentKeyRotatedAt":"2026-11-01T00:00:00Z"}}`
	keys := `{"keys":[{"keyId":"key-1","orgId":"org-a","permissions":["reservation.read"],"operator":false,"createdAt":"2026-01-01T00:00:00Z","revoked":false},` +
		`{"keyId":"key-22","orgId":"org-platform","permissions":["reservation.capacity","vm.place"],"operator":true,"createdAt":"2026-01-02T00:00:00Z","revoked":true}],"nextCursor":"c2"}`
	self := `{"key":{"keyId":"key-7","orgId":"org-platform","permissions":["node.manage"],"operator":true,"expiresAt":"2027-01-01T00:00:00Z","rateLimit":{"perSecond":2.5,"burst":5}}}`
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/dev/v1/nodes/node-1":
			_, _ = io.WriteString(w, node)
		case "/dev/v1/keys":
			_, _ = io.WriteString(w, keys)
		case "/dev/v1/keys/self":
			_, _ = io.WriteString(w, self)
		default:
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"status":404,"code":"not_found","detail":"no such node"}`)
		}
	}))
	defer api.Close()
	tests := []struct {
		name string
		args []string
		code int
		want []string // lines of stdout (trailing spaces trimmed); json: the compacted JSON
		json string
	}{
		{"node table", []string{"nodes", "get", "--node", "node-1"}, 0, []string{
			"node            node-1",
			"owner org       org-owner",
			"units           gpu-0,gpu-1",
			"agent endpoint  https://agent",
			"topology gen    2",
			"version         5",
			"audit head      seq 7 abc",
			"agent key gen   2 (rotated 2026-11-01T00:00:00Z)",
		}, ""},
		{"node json", []string{"nodes", "get", "--node", "node-1", "--output", "json"}, 0, nil, node},
		{"keys table", []string{"keys", "list"}, 0, []string{
			"KEY ID  ORG           PERMISSIONS                    OPERATOR  REVOKED  CREATED               EXPIRES  LAST USED  DESCRIPTION",
			"key-1   org-a         reservation.read               false     false    2026-01-01T00:00:00Z  -        -          -",
			"key-22  org-platform  reservation.capacity,vm.place  true      true     2026-01-02T00:00:00Z  -        -          -",
			"",
			"more: --cursor c2",
		}, ""},
		{"keys json", []string{"--output", "json", "keys", "list"}, 0, nil, keys},
		{"whoami table", []string{"whoami"}, 0, []string{
			"key          key-7",
			"org          org-platform",
			"operator     true",
			"permissions  node.manage",
			"expires      2027-01-01T00:00:00Z",
			"rate limit   2.5/s, burst 5",
		}, ""},
		{"whoami json", []string{"-o", "json", "whoami"}, 0, nil, self},
		{"a problem", []string{"nodes", "get", "--node", "node-2"}, 1, []string{""}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runCLI(t, api, "", nil, tt.args...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d: %s", got.code, tt.code, got.err)
			}
			if tt.json != "" {
				var buf bytes.Buffer
				if err := json.Compact(&buf, []byte(got.stdout)); err != nil || buf.String() != tt.json {
					t.Errorf("stdout %s, want %s (%v)", got.stdout, tt.json, err)
				}
				if !strings.Contains(got.stdout, "\n  ") {
					t.Error("json output is not indented")
				}
				return
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSuffix(got.stdout, "\n"), "\n") {
				lines = append(lines, strings.TrimRight(l, " "))
			}
			if strings.Join(lines, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("stdout\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
	got := runCLI(t, api, "", nil, "nodes", "get", "--node", "node-2")
	if !strings.Contains(got.err, "404 not_found: no such node") {
		t.Errorf("a problem prints its code and detail: %q", got.err)
	}
}
