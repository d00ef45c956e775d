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
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
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
	var out, errOut syncBuffer
	a := &app{io: stdio{in: stdin, out: &out, err: &errOut}, pollEvery: time.Millisecond,
		getenv: func(k string) string { return env[k] }}
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
		want []string // flags the help must list
	}{
		{[]string{"help"}, nil},
		{[]string{"-h"}, nil},
		{[]string{"reclaim", "-h"}, []string{"-idempotency-key", "-wait", "-grace", "-yes", "-endpoint"}},
		{[]string{"keys", "create", "--help"}, []string{"-bootstrap", "-idempotency-key", "-rate-limit"}},
		{[]string{"topology", "set", "--help"}, []string{"-expected-gen", "-idempotency-key"}},
	}
	for _, tt := range tests {
		got := runCLI(t, nil, "", nil, tt.args...)
		if got.code != exitOK || !strings.Contains(got.err, "sage") || strings.Contains(got.err, "capacityctl: ") {
			t.Errorf("%v: exit %d\n%s", tt.args, got.code, got.err)
		}
		for _, f := range tt.want {
			if !strings.Contains(got.err, "  "+f+" ") && !strings.Contains(got.err, "  "+f+"\n") {
				t.Errorf("%v: the help does not list %s\n%s", tt.args, f, got.err)
			}
		}
	}
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
			got, err := a.apiEndpoint(context.Background())
			if tt.want == "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("endpoint %q, error %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("endpoint %q, %v; want %q", got, err, tt.want)
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
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/dev/v1/nodes/node-1":
			_, _ = io.WriteString(w, node)
		case "/dev/v1/keys":
			_, _ = io.WriteString(w, keys)
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

func TestConfirm(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"y\n", true}, {"yes\n", true}, {"Y\n", true}, {" YES \n", true}, {"y", true},
		{"n\n", false}, {"\n", false}, {"", false}, {"maybe\n", false}, {"no\ny\n", false},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		got, err := confirm(context.Background(), strings.NewReader(tt.in), &out, "Proceed? [y/N] ")
		if err != nil || got != tt.want {
			t.Errorf("answer %q: %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if !strings.HasPrefix(out.String(), "Proceed? [y/N] ") {
			t.Errorf("prompt %q", out.String())
		}
	}
}

func TestParseExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		in, want string // want "" = none; "error" = an error
	}{
		{"", ""}, {"720h", "2026-01-31T00:00:00Z"}, {"2027-01-01T00:00:00+01:00", "2026-12-31T23:00:00Z"},
		{"-1h", "error"}, {"soon", "error"},
	}
	for _, tt := range tests {
		got, err := parseExpiry(tt.in, now)
		switch {
		case tt.want == "error":
			if err == nil {
				t.Errorf("%q: no error", tt.in)
			}
		case tt.want == "":
			if got != nil || err != nil {
				t.Errorf("%q: %v %v", tt.in, got, err)
			}
		case err != nil || got.Format(time.RFC3339) != tt.want:
			t.Errorf("%q: %v %v, want %s", tt.in, got, err, tt.want)
		}
	}
}

// fakeAPI is the reclaim side of the API: a dry run, the real call with If-Match, and the
// operation, whose VMs get an outcome one per poll.
type fakeAPI struct {
	t        *testing.T
	mu       sync.Mutex
	etag     string   // the current plan's ETag
	newPlan  bool     // the plan changes between the dry run and the real call
	outcomes []string // the VMs' outcomes, revealed one per GET
	throttle int      // answer the real call 503 throttled this many times first
	// fail are the real call's first answers, in order: an HTTP status sent as API Gateway
	// sends it (no problem code), "hang" (no answer until the client gives up) or "cancel"
	// (Ctrl-C during the call: cancels the command's context, then no answer).
	fail     []string
	cancel   func()
	pollFail []int // the GETs' first answers: these statuses
	polls    int
	calls    []string // method path If-Match Idempotency-Key
}

func (f *fakeAPI) plan(etag string) string {
	return fmt.Sprintf(`{"id":"res-1","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-2","gpu-3"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":["gpu-2","gpu-3"],"topologyGen":1,"wouldTerminate":["vm-1","vm-2"],"wouldSkip":[],"planEtag":%q}`, etag)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, strings.Join([]string{r.Method, r.URL.Path, r.Header.Get("If-Match"), r.Header.Get("Idempotency-Key")}, " "))
	switch {
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/reclaim"):
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body["dryRun"] == true {
			w.Header().Set("ETag", `"`+f.etag+`"`)
			_, _ = io.WriteString(w, f.plan(f.etag))
			return
		}
		if len(f.fail) > 0 {
			next := f.fail[0]
			f.fail = f.fail[1:]
			switch next {
			case "hang", "cancel":
				if next == "cancel" {
					f.cancel()
				}
				f.mu.Unlock() // let the retry in while this request waits for its client to go
				<-r.Context().Done()
				f.mu.Lock()
			case "502":
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(502)
				_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
			default:
				var status int
				_, _ = fmt.Sscan(next, &status)
				w.WriteHeader(status)
				_, _ = fmt.Fprintf(w, `{"message":%q}`, http.StatusText(status))
			}
			return
		}
		if f.throttle > 0 {
			f.throttle--
			w.WriteHeader(503)
			_, _ = io.WriteString(w, `{"status":503,"code":"throttled","detail":"try again"}`)
			return
		}
		if f.newPlan {
			w.Header().Set("ETag", `"e2"`)
			w.WriteHeader(412)
			_, _ = io.WriteString(w, `{"status":412,"code":"plan_changed","detail":"the plan changed","plan":`+f.plan("e2")+`}`)
			return
		}
		if r.Header.Get("If-Match") != `"`+f.etag+`"` {
			f.t.Errorf("If-Match %q, want the dry run's ETag", r.Header.Get("If-Match"))
		}
		_, _ = io.WriteString(w, `{"id":"res-1","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-2","gpu-3"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":1,"terminated":["vm-1","vm-2"],"skipped":[],"reclaimId":"op-1"}`)
	case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/reclaims/op-1"):
		if len(f.pollFail) > 0 {
			status := f.pollFail[0]
			f.pollFail = f.pollFail[1:]
			w.WriteHeader(status)
			_, _ = fmt.Fprintf(w, `{"message":%q}`, http.StatusText(status))
			return
		}
		f.polls++
		op := wire.OperationJSON{ID: "op-1", NodeID: "node-1", ReservationID: "res-1", State: "terminating", UnitIDs: []string{"gpu-2", "gpu-3"}, CreatedAt: "t"}
		known := min(f.polls-1, len(f.outcomes))
		for i, o := range f.outcomes {
			v := wire.VMOutcomeJSON{VMID: fmt.Sprintf("vm-%d", i+1), Outcome: "pending"}
			if i < known {
				v.Outcome = o
				if o == "failed" {
					v.Error = "agent said no"
				}
			}
			op.VMs = append(op.VMs, v)
		}
		if known == len(f.outcomes) {
			op.State = "completed"
		}
		_ = json.NewEncoder(w).Encode(op)
	default:
		w.WriteHeader(404)
	}
}

func TestReclaimFlow(t *testing.T) {
	args := []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2,gpu-3", "--reason", "training"}
	tests := []struct {
		name      string
		api       *fakeAPI
		stdin     string
		extra     []string
		code      int
		realCalls int      // real reclaim calls sent
		key       string   // their Idempotency-Key ("": one generated, capacityctl-…)
		stdout    []string // must appear, in order
		stderr    []string
	}{
		{"confirmed, all terminated", &fakeAPI{etag: "e1", outcomes: []string{"terminated", "already-gone"}}, "y\n", nil, 0, 1, "",
			[]string{"would terminate  vm-1,vm-2", `plan ETag        e1`, "reclaim id       op-1", "0/2 VMs done: 0 terminated, 0 already-gone, 0 failed",
				"1/2 VMs done: 1 terminated, 0 already-gone, 0 failed", "2/2 VMs done: 1 terminated, 1 already-gone, 0 failed"},
			[]string{"Proceed? [y/N] "}},
		{"--yes asks nothing", &fakeAPI{etag: "e1", outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 1, "",
			[]string{"1/1 VMs done: 1 terminated"}, nil},
		{"declined", &fakeAPI{etag: "e1"}, "n\n", nil, 1, 0, "", []string{"would terminate"}, []string{"not confirmed; nothing changed"}},
		{"no answer", &fakeAPI{etag: "e1"}, "", nil, 1, 0, "", nil, []string{"not confirmed"}},
		{"the plan changed", &fakeAPI{etag: "e1", newPlan: true}, "", []string{"--yes"}, 3, 1, "",
			[]string{"plan ETag        e1", "plan ETag        e2"}, []string{"the plan changed since the dry run", "plan changed"}},
		{"a VM failed", &fakeAPI{etag: "e1", outcomes: []string{"terminated", "failed"}}, "", []string{"--yes"}, 4, 1, "",
			[]string{"2/2 VMs done: 1 terminated, 0 already-gone, 1 failed"}, []string{"vm-2: agent said no", "1 VMs failed"}},
		{"throttled, retried with the same key", &fakeAPI{etag: "e1", throttle: 2, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 3, "",
			[]string{"1/1 VMs done"}, nil},
		{"API Gateway's 504, 429, 502 and 503 retried with the same key", &fakeAPI{etag: "e1", fail: []string{"504", "429", "502", "503"}, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 5, "",
			[]string{"1/1 VMs done"}, []string{"Idempotency-Key capacityctl-", "attempt 1 of 6: 504 Gateway Timeout", "attempt 4 of 6: 503"}},
		{"no answer within --timeout, retried with the same key", &fakeAPI{etag: "e1", fail: []string{"hang"}, outcomes: []string{"terminated"}}, "", []string{"--yes", "--timeout", "300ms"}, 0, 2, "",
			[]string{"reclaim id       op-1", "1/1 VMs done"}, []string{"Idempotency-Key capacityctl-", "attempt 1 of 6"}},
		{"no answer at all: the key and how to resume", &fakeAPI{etag: "e1", fail: []string{"504", "504", "504", "504", "504", "504"}}, "", []string{"--yes"}, 1, 6, "",
			nil, []string{"Idempotency-Key capacityctl-", "it may have been made", "capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2,gpu-3 --reason training --idempotency-key capacityctl-", "--yes", "no answer after 6 attempts"}},
		{"resumed with --idempotency-key", &fakeAPI{etag: "e1", outcomes: []string{"terminated"}}, "", []string{"--yes", "--idempotency-key", "capacityctl-earlier"}, 0, 1, "capacityctl-earlier",
			[]string{"idempotency key  capacityctl-earlier"}, []string{"Idempotency-Key capacityctl-earlier"}},
		{"a refusal is not retried", &fakeAPI{etag: "e1", fail: []string{"500"}}, "", []string{"--yes"}, 1, 1, "",
			nil, []string{"500 Internal Server Error"}},
		{"polls retried until they answer", &fakeAPI{etag: "e1", pollFail: []int{503, 500, 504, 429}, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 1, "",
			[]string{"1/1 VMs done"}, nil},
		{"a poll answered 404 stops", &fakeAPI{etag: "e1", pollFail: []int{404}, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 1, 1, "",
			nil, []string{"follow reclaim op-1: 404"}},
		{"polls failing until --wait runs out", &fakeAPI{etag: "e1", pollFail: slices.Repeat([]int{503}, 100000), outcomes: []string{"terminated"}}, "", []string{"--yes", "--wait", "50ms"}, 1, 1, "",
			nil, []string{"still running after 50ms", "last error", "503"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.api
			f.t = t
			api := httptest.NewServer(f)
			defer api.Close()
			got := runCLI(t, api, tt.stdin, nil, append(args, tt.extra...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
			assertInOrder(t, "stderr", got.err, tt.stderr)
			var real []string
			for _, c := range f.calls {
				if strings.HasPrefix(c, "POST ") && len(strings.Fields(c)) == 4 { // the dry run sends neither header
					real = append(real, c)
				}
			}
			if len(real) != tt.realCalls {
				t.Fatalf("real reclaim calls %q, want %d", real, tt.realCalls)
			}
			for _, c := range real {
				fs := strings.Fields(c)
				if fs[2] != `"e1"` || !strings.HasPrefix(fs[3], "capacityctl-") || fs[3] != strings.Fields(real[0])[3] || (tt.key != "" && fs[3] != tt.key) {
					t.Errorf("real call %q: want If-Match \"e1\" and one Idempotency-Key (%q) for every attempt", c, tt.key)
				}
			}
		})
	}
}

func TestReclaimJSONKeepsStdoutJSON(t *testing.T) {
	f := &fakeAPI{t: t, etag: "e1", outcomes: []string{"terminated"}}
	api := httptest.NewServer(f)
	defer api.Close()
	got := runCLI(t, api, "y\n", nil, "--output", "json", "reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.err)
	}
	dec := json.NewDecoder(strings.NewReader(got.stdout))
	var docs []map[string]any
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("stdout is not a stream of JSON documents: %v\n%s", err, got.stdout)
		}
		docs = append(docs, m)
	}
	if len(docs) != 3 || docs[0]["planEtag"] != "e1" || docs[1]["reclaimId"] != "op-1" || docs[2]["state"] != "completed" {
		t.Errorf("documents %v, want the plan, the reclaim and the final operation", docs)
	}
	assertInOrder(t, "stderr", got.err, []string{"Proceed? [y/N] ", "1/1 VMs done"})
}

func assertInOrder(t *testing.T, name, s string, want []string) {
	t.Helper()
	rest := s
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Errorf("%s lacks %q (in order)\n%s", name, w, s)
			return
		}
		rest = rest[i+len(w):]
	}
}

// chain builds n chained records of node-1.
func chain(n int) (capacity.AuditHead, []wire.AuditRecordJSON) {
	var head capacity.AuditHead
	var out []wire.AuditRecordJSON
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		r := capacity.AuditRecord{ID: fmt.Sprintf("rec-%d", i+1), Time: start.Add(time.Duration(i) * time.Second), Action: "reclaim",
			NodeID: "node-1", ReservationID: "res-1", UnitIDs: []string{"gpu-2"}, CallerOrgID: "org-owner", Via: "http"}
		r, head = capacity.ChainAuditRecord(r, head)
		out = append(out, wire.AuditRecord(r))
	}
	return head, out
}

// chainAPI is a chain as the API serves it: its records in pages of at most 2, under head;
// a read of one record (audit verify reading the head again) answers later, if set. It
// serves keys as the key list.
type chainAPI struct {
	head, later *capacity.AuditHead
	records     []wire.AuditRecordJSON
	keys        []wire.KeyJSON
	// calls, if set, is the node's calls chain (served for chain=calls).
	calls *chainAPI
}

func auditAPI(t *testing.T, head capacity.AuditHead, records []wire.AuditRecordJSON) *httptest.Server {
	return (&chainAPI{head: &head, records: records}).serve(t)
}

func (c *chainAPI) serve(t *testing.T) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/dev/v1/keys" {
			_ = json.NewEncoder(w).Encode(wire.KeyPageJSON{Keys: append([]wire.KeyJSON{}, c.keys...)})
			return
		}
		if r.URL.Path != "/dev/v1/nodes/node-1/audit" && r.URL.Path != "/dev/v1/keys/audit" {
			w.WriteHeader(404)
			return
		}
		c := c
		if r.URL.Query().Get("chain") == "calls" && c.calls != nil {
			c = c.calls
		}
		head := *c.head
		switch r.URL.Query().Get("limit") {
		case "100":
		case "1":
			if c.later != nil {
				head = *c.later
			}
		default:
			t.Errorf("limit %q, want 100 (or 1 for the head)", r.URL.Query().Get("limit"))
		}
		from := 0
		if cur := r.URL.Query().Get("cursor"); cur != "" {
			_, _ = fmt.Sscanf(cur, "p%d", &from)
		}
		to := min(from+2, len(c.records))
		page := wire.AuditChainPageJSON{Head: wire.AuditHead(head), Records: c.records[from:to]}
		if to < len(c.records) {
			page.NextCursor = fmt.Sprintf("p%d", to)
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
}

func TestAuditVerify(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(head *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON
		args   []string
		code   int
		stdout []string
	}{
		{"intact, over three pages", nil, nil, 0, []string{"OK: audit chain of node node-1 verified: 5 records checked, 0 unchained, head seq 5"}},
		{"the key chain", nil, []string{"--keys"}, 0, []string{"OK: audit chain of keys verified: 5 records checked"}},
		{"altered", func(_ *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON {
			rs[2].Reason = "nothing to see"
			return rs
		}, nil, 1, []string{"FAILED: audit chain of node node-1: altered", "record seq 3 id rec-3 (time 2026-01-01T00:00:02Z, action reclaim)"}},
		{"removed", func(_ *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON {
			return append(rs[:1:1], rs[3:]...)
		}, nil, 1, []string{"removed", "record seq 4 id rec-4", "missing seq 2..3"}},
		{"inserted", func(_ *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON {
			fake := rs[1]
			fake.ID, fake.Reason = "rec-x", "forged"
			return append(rs[:2:2], append([]wire.AuditRecordJSON{fake}, rs[2:]...)...)
		}, nil, 1, []string{"inserted", "id rec-x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			head, rs := chain(5)
			if tt.edit != nil {
				rs = tt.edit(&head, rs)
			}
			api := auditAPI(t, head, rs)
			defer api.Close()
			args := tt.args
			if args == nil {
				args = []string{"--node", "node-1"}
			}
			got := runCLI(t, api, "", nil, append([]string{"audit", "verify"}, args...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\n%s\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
}

// A node's verify reads and verifies both its chains, the changes then the calls, and fails
// on either.
func TestAuditVerifyBothNodeChains(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(rs []wire.AuditRecordJSON)
		args   []string
		code   int
		stdout []string
	}{
		{"both intact", nil, nil, 0, []string{
			"OK: audit chain of node node-1 verified: 5 records checked",
			"OK: audit chain of node node-1 calls verified: 3 records checked, 0 unchained, head seq 3"}},
		{"both intact, as JSON", nil, []string{"--output", "json"}, 0, []string{`"chain": "node node-1"`, `"calls": {`, `"chain": "node node-1 calls"`, `"checked": 3`}},
		{"a calls record altered", func(rs []wire.AuditRecordJSON) { rs[1].Outcome = "ok" }, nil, 1, []string{
			"OK: audit chain of node node-1 verified: 5 records checked",
			"FAILED: audit chain of node node-1 calls: altered", "record seq 2 id rec-2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			head, rs := chain(5)
			callsHead, calls := chain(3)
			if tt.edit != nil {
				tt.edit(calls)
			}
			api := (&chainAPI{head: &head, records: rs, calls: &chainAPI{head: &callsHead, records: calls}}).serve(t)
			defer api.Close()
			got := runCLI(t, api, "", nil, append([]string{"audit", "verify", "--node", "node-1"}, tt.args...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\n%s\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
}

// Each tampering that verification used to pass now fails it: a head moved back (records
// past it skipped unchecked), an unchained record planted before the chain (as if written
// before chains existed), and a key whose grants were changed in place. The same chains
// untampered pass, with what the chain cannot vouch for said aloud.
func TestAuditVerifyTamperings(t *testing.T) {
	legacy := capacity.AuditRecord{ID: "old", Time: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), NodeID: "node-1", Action: "release"}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	exp := at.AddDate(1, 0, 0)
	key := capacity.APIKey{KeyID: "key-1", OrgID: "acme", Permissions: []string{capacity.PermRead}, ExpiresAt: &exp, CreatedAt: at}
	// keyChain is the key-management chain of key-1's creation, its start pinned empty.
	keyChain := func() (capacity.AuditHead, []wire.AuditRecordJSON) {
		g := capacity.GrantsOf(key)
		rec, head := capacity.ChainAuditRecord(capacity.AuditRecord{ID: "k1", Time: at, Action: capacity.ActionKeyCreate,
			TargetKeyID: key.KeyID, ActingFor: key.OrgID, Outcome: "ok", Grants: &g}, capacity.AuditHead{})
		head.Start = capacity.ChainStartOf(nil)
		return head, []wire.AuditRecordJSON{wire.AuditRecord(rec)}
	}
	// nodeChain is node-1's chain of 5 records after one legacy record, its start pinned.
	nodeChain := func() (capacity.AuditHead, []wire.AuditRecordJSON) {
		head, rs := chain(5)
		head.Start = capacity.ChainStartOf([]capacity.AuditRecord{legacy})
		return head, append([]wire.AuditRecordJSON{wire.AuditRecord(legacy)}, rs...)
	}
	headAt := func(rs []wire.AuditRecordJSON, seq int64, start capacity.ChainStart) *capacity.AuditHead {
		for _, r := range rs {
			if r.Seq == seq {
				return &capacity.AuditHead{Seq: seq, Hash: r.Hash, Start: start}
			}
		}
		t.Fatalf("no record %d", seq)
		return nil
	}
	tests := []struct {
		name   string
		keys   bool
		setup  func(c *chainAPI)
		code   int
		stdout []string
	}{
		{"node chain untouched", false, func(c *chainAPI) {}, 0, []string{"OK: audit chain of node node-1 verified: 5 records checked, 1 unchained"}},
		{"records appended while verifying", false, func(c *chainAPI) {
			c.later, c.head = c.head, headAt(c.records, 3, c.head.Start)
		}, 0, []string{"verified: 3 records checked", "2 records appended while verifying (seq 4 to 5)"}},
		{"head rolled back", false, func(c *chainAPI) {
			c.head = headAt(c.records, 3, c.head.Start)
		}, 1, []string{"FAILED: audit chain of node node-1: beyond the head", "at record seq 4 id -", "head read after them is at seq 3"}},
		{"head rolled back and a record past it rewritten", false, func(c *chainAPI) {
			c.head = headAt(c.records, 3, c.head.Start)
			c.records[5].Reason = "nothing happened"
		}, 1, []string{"FAILED: audit chain of node node-1: altered", "record seq 5 id rec-5"}},
		{"back-dated unchained record planted", false, func(c *chainAPI) {
			planted := legacy
			planted.ID, planted.Time, planted.Reason = "planted", legacy.Time.Add(-time.Hour), "approved"
			c.records = append([]wire.AuditRecordJSON{wire.AuditRecord(planted)}, c.records...)
		}, 1, []string{"FAILED: audit chain of node node-1: inserted", "before the chain", "2 unchained records precede the chain; its start pins 1"}},
		{"legacy record rewritten", false, func(c *chainAPI) {
			c.records[0].Reason = "rewritten"
		}, 1, []string{"FAILED: audit chain of node node-1: altered", "before the chain"}},
		{"an unpinned start is said aloud", false, func(c *chainAPI) {
			c.head.Start = capacity.ChainStart{}
		}, 0, []string{"OK: audit chain of node node-1", "WARNING: the chain's start is not pinned", "1 unchained records are legacy"}},
		{"keys untouched", true, func(c *chainAPI) {}, 0, []string{"OK: audit chain of keys verified: 1 records checked", "1 keys grant what their records say"}},
		{"key made operator in place", true, func(c *chainAPI) {
			c.keys[0].Operator = true
		}, 1, []string{"FAILED: audit chain of keys: key key-1 altered", "record seq 1 id k1", "the key grants org acme, permissions [reservation.read], operator true"}},
		{"key's expiry extended in place", true, func(c *chainAPI) {
			c.keys[0].ExpiresAt = exp.AddDate(5, 0, 0).Format(time.RFC3339)
		}, 1, []string{"FAILED: audit chain of keys: key key-1 altered", "expires 2032"}},
		{"key planted without a record", true, func(c *chainAPI) {
			c.keys = append(c.keys, wire.Key(capacity.APIKey{KeyID: "key-x", OrgID: "acme", Operator: true}))
		}, 0, []string{"OK: audit chain of keys", "WARNING: key key-x: no record in the chain"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &chainAPI{}
			var head capacity.AuditHead
			args := []string{"--node", "node-1"}
			if tt.keys {
				head, c.records = keyChain()
				c.keys = []wire.KeyJSON{wire.Key(key)}
				args = []string{"--keys"}
			} else {
				head, c.records = nodeChain()
			}
			c.head = &head
			tt.setup(c)
			api := c.serve(t)
			defer api.Close()
			got := runCLI(t, api, "", nil, append([]string{"audit", "verify"}, args...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\n%s\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
}

func TestAuditVerifyJSON(t *testing.T) {
	head, rs := chain(3)
	rs[1].Action = "release"
	api := auditAPI(t, head, rs)
	defer api.Close()
	got := runCLI(t, api, "", nil, "audit", "verify", "--node", "node-1", "--output", "json")
	if got.code != 1 {
		t.Fatalf("exit %d: %s", got.code, got.err)
	}
	var v verifyResult
	if err := json.Unmarshal([]byte(got.stdout), &v); err != nil {
		t.Fatalf("%v: %s", err, got.stdout)
	}
	if v.OK || v.Problem != "altered" || v.Seq != 2 || v.RecordID != "rec-2" || v.Record == nil || v.Record.Action != "release" {
		t.Errorf("report %+v", v)
	}
}

// TestAuditListTables: the key chain's table names the key each record created or revoked;
// a node's keeps its reservation columns.
func TestAuditListTables(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var head capacity.AuditHead
	var keyRecs []wire.AuditRecordJSON
	for _, r := range []capacity.AuditRecord{
		{ID: "a1", Time: at, Action: capacity.ActionKeyCreate, Via: "http", CallerOrgID: "org-platform", ActorKeyID: "key-op", TargetKeyID: "key-new", Outcome: "ok"},
		{ID: "a2", Time: at.Add(time.Second), Action: capacity.ActionKeyRevoke, Via: "http", CallerOrgID: "org-platform", ActorKeyID: "key-op", TargetKeyID: "key-old", Outcome: "ok", Reason: "leaked"},
	} {
		var rec capacity.AuditRecord
		rec, head = capacity.ChainAuditRecord(r, head)
		keyRecs = append(keyRecs, wire.AuditRecord(rec))
	}
	nodeHead, nodeRecs := chain(1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page := wire.AuditChainPageJSON{Head: wire.AuditHead(head), Records: keyRecs}
		if r.URL.Path == "/dev/v1/nodes/node-1/audit" {
			page = wire.AuditChainPageJSON{Head: wire.AuditHead(nodeHead), Records: nodeRecs}
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
	defer api.Close()
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"keys", []string{"--keys"}, []string{
			"SEQ  TIME                  ACTION      VIA   ORG           KEY     TARGET KEY  OUTCOME  REASON",
			"1    2026-01-01T00:00:00Z  key.create  http  org-platform  key-op  key-new     ok       -",
			"2    2026-01-01T00:00:01Z  key.revoke  http  org-platform  key-op  key-old     ok       leaked",
		}},
		{"node", []string{"--node", "node-1"}, []string{
			"SEQ  TIME                  ACTION   VIA   ORG        KEY  RESERVATION  UNITS  DRY RUN  OUTCOME  REASON",
			"1    2026-01-01T00:00:00Z  reclaim  http  org-owner  -    res-1        gpu-2  false    -        -",
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := runCLI(t, api, "", nil, append([]string{"audit", "list"}, tt.args...)...)
			if got.code != 0 {
				t.Fatalf("exit %d: %s", got.code, got.err)
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSuffix(got.stdout, "\n"), "\n")[2:] {
				lines = append(lines, strings.TrimRight(l, " "))
			}
			if strings.Join(lines, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("stdout\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestTopologySetExpectedGen: --expected-gen reaches the body as expectedTopologyGen; without
// it the member is left out (any generation), and a refusal prints its code.
func TestTopologySetExpectedGen(t *testing.T) {
	var bodies []map[string]any
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || r.Method != http.MethodPut || r.URL.Path != "/dev/v1/nodes/node-1/topology" {
			t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
		}
		bodies = append(bodies, b)
		if b["expectedTopologyGen"] == float64(2) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"status":409,"code":"topology_changed","detail":"node node-1 is at topology generation 3"}`)
			return
		}
		_, _ = io.WriteString(w, `{"node":{"nodeId":"node-1","ownerOrgId":"o","unitIds":["gpu-0"],"agentEndpoint":"https://a","topologyGen":4,"version":5,"auditHead":{"seq":1,"hash":"h"}},"changed":true,"addedUnitIds":[],"removedUnitIds":["gpu-1"],"needsReview":[],"vmsOnRemovedUnits":[]}`)
	}))
	defer api.Close()
	for _, tt := range []struct {
		name string
		args []string
		code int
		want any // the body's expectedTopologyGen; nil: left out
		err  string
	}{
		{"given", []string{"--expected-gen", "3"}, 0, float64(3), ""},
		{"left out", nil, 0, nil, ""},
		{"stale", []string{"--expected-gen", "2"}, 1, float64(2), "409 topology_changed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bodies = nil
			got := runCLI(t, api, "", nil, append([]string{"topology", "set", "--node", "node-1", "--units", "gpu-0"}, tt.args...)...)
			if got.code != tt.code || !strings.Contains(got.err, tt.err) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", got.code, got.err, tt.code, tt.err)
			}
			if len(bodies) != 1 {
				t.Fatalf("bodies %v", bodies)
			}
			if v, ok := bodies[0]["expectedTopologyGen"]; v != tt.want || ok != (tt.want != nil) {
				t.Errorf("expectedTopologyGen %v (present %v), want %v", v, ok, tt.want)
			}
		})
	}
}

// cancelOnRead is a terminal at the prompt when Ctrl-C comes: its read cancels the command's
// context (as the signal does) and then never returns, as a terminal read does not.
type cancelOnRead struct {
	cancel func()
	done   <-chan struct{}
}

func (r cancelOnRead) Read([]byte) (int, error) {
	r.cancel()
	<-r.done
	return 0, io.EOF
}

// TestReclaimInterrupted: Ctrl-C at the prompt aborts with nothing reclaimed; Ctrl-C during
// the real call prints the Idempotency-Key and the command that resumes the reclaim.
func TestReclaimInterrupted(t *testing.T) {
	args := []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2", "--reason", "make room", "--grace", "30"}
	t.Run("at the prompt", func(t *testing.T) {
		f := &fakeAPI{t: t, etag: "e1"}
		api := httptest.NewServer(f)
		defer api.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		testDone := make(chan struct{})
		defer close(testDone)
		got := make(chan result, 1)
		go func() { got <- runCLIWith(ctx, t, api, cancelOnRead{cancel, testDone}, nil, args...) }()
		select {
		case r := <-got:
			if r.code != exitFailed || !strings.Contains(r.err, "nothing was reclaimed") {
				t.Errorf("exit %d, stderr %q; want 1 and nothing was reclaimed", r.code, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Ctrl-C at the prompt did not stop the command")
		}
		for _, c := range f.calls {
			if len(strings.Fields(c)) == 4 {
				t.Errorf("real call %q sent", c)
			}
		}
	})
	t.Run("during the real call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := &fakeAPI{t: t, etag: "e1", fail: []string{"cancel"}, cancel: cancel}
		api := httptest.NewServer(f)
		defer api.Close()
		r := runCLIWith(ctx, t, api, strings.NewReader(""), nil, append(args, "--yes")...)
		if r.code != exitFailed {
			t.Errorf("exit %d, want 1", r.code)
		}
		var key string
		for _, c := range f.calls {
			if fs := strings.Fields(c); len(fs) == 4 {
				key = fs[3]
			}
		}
		if key == "" {
			t.Fatalf("no real call: %q", f.calls)
		}
		assertInOrder(t, "stderr", r.err, []string{"Idempotency-Key " + key, "it may have been made",
			"capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2 --reason 'make room' --grace 30 --idempotency-key " + key + " --yes",
			"interrupted"})
	})
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{"gpu-1,gpu-2": "gpu-1,gpu-2", "": "''", "make room": "'make room'", "it's": `'it'\''s'`, "$(x)": "'$(x)'"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestScheduledList: scheduled list asks for the reservation's scheduled reclaims with the
// page flags and prints each with its state and how it ended.
func TestScheduledList(t *testing.T) {
	var asked string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = r.Method + " " + r.URL.RequestURI()
		_ = json.NewEncoder(w).Encode(wire.ScheduledPageJSON{ScheduledReclaims: []wire.ScheduledReclaimJSON{
			{ID: "srcl_1", At: "2026-01-01T00:00:00Z", State: "refused", UnitIDs: []string{"gpu-2"}, CreatedByOrgID: "org-owner",
				FiredAt: "2026-01-01T00:00:01Z", Code: "creator_key_invalid", Detail: "the API key key-1 that scheduled this reclaim was revoked"},
			{ID: "srcl_2", At: "2026-01-02T00:00:00Z", State: "scheduled", UnitIDs: []string{"gpu-2", "gpu-3"}, GraceSeconds: 30, CreatedByOrgID: "org-owner"},
		}, NextCursor: "c2"})
	}))
	defer api.Close()
	got := runCLI(t, api, "", nil, "scheduled", "list", "--node", "node-1", "--reservation", "res-1", "--limit", "2", "--cursor", "c1")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.err)
	}
	if want := "GET /dev/v1/nodes/node-1/reservations/res-1/scheduled-reclaims?cursor=c1&limit=2"; asked != want {
		t.Errorf("asked %s, want %s", asked, want)
	}
	for _, want := range []string{
		"srcl_1  2026-01-01T00:00:00Z  refused    gpu-2        0      org-owner   2026-01-01T00:00:01Z  creator_key_invalid: the API key key-1 that scheduled this reclaim was revoked",
		"srcl_2  2026-01-02T00:00:00Z  scheduled  gpu-2,gpu-3  30     org-owner   -",
		"c2",
	} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("stdout\n%s\nwant a line with\n%s", got.stdout, want)
		}
	}
}

// TestNodesRotateKey: rotate-key posts the reason to the node's rotate route with an
// Idempotency-Key and prints the new key once; a replay prints that it was shown.
func TestNodesRotateKey(t *testing.T) {
	var got []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || r.Method != http.MethodPost || r.URL.Path != "/dev/v1/nodes/node-1/agent-key/rotate" {
			t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
		}
		reason, _ := b["reason"].(string) // left out when empty
		got = append(got, reason+" "+r.Header.Get("Idempotency-Key"))
		if r.Header.Get("Idempotency-Key") == "again" {
			_, _ = io.WriteString(w, `{"nodeId":"node-1","agentKeyGen":3,"secretShown":true,"previousValidUntil":"2026-11-01T00:10:00Z"}`)
			return
		}
		_, _ = io.WriteString(w, `{"nodeId":"node-1","agentKeyGen":3,"agentKey":"a2V5","previousValidUntil":"2026-11-01T00:10:00Z"}`)
	}))
	defer api.Close()
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"new key", []string{"--reason", "laptop lost", "--idempotency-key", "first"},
			[]string{"agent key gen       3", "previous key until  2026-11-01T00:10:00Z", "agent key (base64, shown once; install it on the node's agent now):  a2V5"}},
		{"replay", []string{"--idempotency-key", "again"}, []string{"the agent key was shown by the first call with this Idempotency-Key"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := runCLI(t, api, "", nil, append([]string{"nodes", "rotate-key", "--node", "node-1"}, tt.args...)...)
			if res.code != 0 {
				t.Fatalf("exit %d: %s", res.code, res.err)
			}
			for _, w := range tt.want {
				if !strings.Contains(res.stdout, w) {
					t.Errorf("output lacks %q:\n%s", w, res.stdout)
				}
			}
			if strings.Contains(res.stdout, "a2V5") != (tt.name == "new key") {
				t.Errorf("key shown: %v\n%s", strings.Contains(res.stdout, "a2V5"), res.stdout)
			}
		})
	}
	if want := []string{"laptop lost first", " again"}; !slices.Equal(got, want) {
		t.Errorf("requests %q, want %q", got, want)
	}
}

// keys create --rate-limit sends the key's own limit in the creation's body; without it the
// body has none (the environment's).
func TestKeysCreateRateLimit(t *testing.T) {
	for _, tt := range []struct {
		flag []string
		want any
	}{
		{[]string{"--rate-limit", "2.5/10"}, map[string]any{"perSecond": 2.5, "burst": float64(10)}},
		{nil, nil},
	} {
		var body map[string]any
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewDecoder(r.Body).Decode(&body)
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"key":{"keyId":"key-1","orgId":"o","permissions":["reservation.read"],"operator":false,"createdAt":"2026-01-01T00:00:00Z","revoked":false},"secret":"s"}`)
		}))
		args := append([]string{"keys", "create", "--org", "o", "--permissions", "reservation.read"}, tt.flag...)
		if got := runCLI(t, api, "", nil, args...); got.code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, got.code, got.err)
		}
		api.Close()
		if !reflect.DeepEqual(body["rateLimit"], tt.want) {
			t.Errorf("%v: body rateLimit %v, want %v", tt.flag, body["rateLimit"], tt.want)
		}
	}
}
