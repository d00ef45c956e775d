package envvar

import (
	"go/parser"
	"go/token"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestOurs(t *testing.T) {
	for _, tc := range []struct {
		name string
		ours bool
	}{
		{"STATE_TABLE", true}, {"STATE_TABLES", true}, {"LOG_LEVL", true}, {"AGENT_TIMEOUT2", true},
		{"AWS_REGION", false}, {"AWS_LAMBDA_FUNCTION_NAME", false}, {"AWS_ENDPOINT_URL", false},
		{"LAMBDA_TASK_ROOT", false}, {"_HANDLER", false}, {"_X_AMZN_TRACE_ID", false}, {"_AWS_XRAY_DAEMON_PORT", false},
		{"GOMAXPROCS", false}, {"GODEBUG", false},
		{"PATH", false}, {"LANG", false}, {"TZ", false}, {"LD_LIBRARY_PATH", false}, {"PWD", false}, {"SHLVL", false},
		{"http_proxy", false}, {"State_Table", false}, {"", false},
	} {
		if got := Ours(tc.name); got != tc.ours {
			t.Errorf("Ours(%q) = %v, want %v", tc.name, got, tc.ours)
		}
	}
}

// TestDeclarations: every declared name is ours (so that a misspelling of it is refused) and
// names one variable only; the runtime's are not ours; function names are unique.
func TestDeclarations(t *testing.T) {
	byName := map[string]Variable{}
	functions := map[string]bool{}
	for _, fn := range Functions {
		if functions[fn.Name()] {
			t.Errorf("function %s declared twice", fn.Name())
		}
		functions[fn.Name()] = true
		if got, ok := Named(fn.Name()); !ok || got.Name() != fn.Name() {
			t.Errorf("Named(%q) = %v, %v", fn.Name(), got.Name(), ok)
		}
		seen := map[string]bool{}
		for _, v := range fn.Variables() {
			if !Ours(v.Name()) {
				t.Errorf("%s declares %s, which is not in our namespace", fn.Name(), v.Name())
			}
			if seen[v.Name()] {
				t.Errorf("%s declares %s twice", fn.Name(), v.Name())
			}
			seen[v.Name()] = true
			if other, ok := byName[v.Name()]; ok && other != v {
				t.Errorf("%s names two variables: %#v and %#v", v.Name(), other, v)
			}
			byName[v.Name()] = v
			if v.SetBy() < Stack || v.SetBy() > Developer {
				t.Errorf("%s: no setter", v.Name())
			}
		}
	}
	for _, v := range []Runtime{Region, EndpointURL} {
		if Ours(v.Name()) {
			t.Errorf("runtime variable %s is in our namespace", v.Name())
		}
	}
	if _, ok := Named("no-such-function"); ok {
		t.Error("Named found a function that is not declared")
	}
}

// TestEnv: an Env reports an undeclared variable of ours (a typo in the stack or a console
// edit), a missing required one, a read of an undeclared one and a declared one not read.
func TestEnv(t *testing.T) {
	fn := Declare("fn", AppEnv, StateTable, KeyCacheTTL)
	readAll := func(e *Env) { AppEnv.Get(e); StateTable.Get(e); KeyCacheTTL.Get(e) }
	for _, tc := range []struct {
		name    string
		environ []string
		read    func(e *Env)
		wantErr []string // each in the error; none: no error
	}{
		{name: "all set", environ: []string{"APP_ENV=dev", "STATE_TABLE=t", "KEY_CACHE_TTL=1s"}, read: readAll},
		{name: "optional unset", environ: []string{"APP_ENV=dev", "STATE_TABLE=t"}, read: readAll},
		{name: "the runtime's are not ours", read: readAll, environ: []string{"APP_ENV=dev", "STATE_TABLE=t",
			"AWS_REGION=eu-west-1", "_HANDLER=bootstrap", "PATH=/bin", "TZ=:UTC", "lowercase=x", "NOEQUALS"},
			wantErr: []string{"NOEQUALS is not one of fn's"}},
		{name: "misspelt", environ: []string{"APP_ENV=dev", "STATE_TABLE=t", "KEY_CACHE_TLL=1s"}, read: readAll,
			wantErr: []string{"environment variable KEY_CACHE_TLL is not one of fn's (APP_ENV, KEY_CACHE_TTL, STATE_TABLE)"}},
		{name: "another function's", environ: []string{"APP_ENV=dev", "STATE_TABLE=t", "AGENT_TIMEOUT=1s"}, read: readAll,
			wantErr: []string{"AGENT_TIMEOUT is not one of fn's"}},
		{name: "set but empty", environ: []string{"APP_ENV=dev", "STATE_TABLE="}, read: readAll,
			wantErr: []string{"environment variable STATE_TABLE must be set"}},
		{name: "required unset", environ: []string{"STATE_TABLE=t"}, read: readAll,
			wantErr: []string{"environment variable APP_ENV must be set"}},
		{name: "bad value", environ: []string{"APP_ENV=dev", "STATE_TABLE=t", "KEY_CACHE_TTL=30"}, read: readAll,
			wantErr: []string{"environment variable KEY_CACHE_TTL: time: missing unit"}},
		{name: "read but not declared", environ: []string{"APP_ENV=dev", "STATE_TABLE=t"},
			read:    func(e *Env) { readAll(e); AgentTimeout.Get(e) },
			wantErr: []string{"fn reads environment variable AGENT_TIMEOUT, which envvar does not declare for it"}},
		{name: "declared but not read", environ: []string{"APP_ENV=dev", "STATE_TABLE=t"},
			read:    func(e *Env) { AppEnv.Get(e); StateTable.Optional(e) },
			wantErr: []string{"fn declares environment variable KEY_CACHE_TTL but does not read it"}},
		{name: "every error", environ: []string{"STATE_TABLES=t", "KEY_CACHE_TTL=soon"}, read: readAll,
			wantErr: []string{"STATE_TABLES is not one of", "APP_ENV must be set", "STATE_TABLE must be set", "KEY_CACHE_TTL: time"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(fn, tc.environ)
			tc.read(e)
			err := e.Err()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q, want it to say %q", err, want)
				}
			}
		})
	}
}

// TestParsers: each parser's default, accepted values and refusals; a refused value fails
// the function (an error naming the variable) rather than taking the default.
func TestParsers(t *testing.T) {
	type result struct {
		value any
		err   string // in the error; "" none
	}
	fn := Declare("fn", AppEnv, KeyCacheTTL, MaxPendingScheduledPerOrg, RateLimitPerSecond, RateLimitBurst, FaultsSeed,
		LogLevel, AgentAllowHTTP)
	parse := map[Variable]func(e *Env) any{
		KeyCacheTTL:               func(e *Env) any { return KeyCacheTTL.Get(e) },
		MaxPendingScheduledPerOrg: func(e *Env) any { return MaxPendingScheduledPerOrg.Get(e) },
		RateLimitPerSecond:        func(e *Env) any { v, _ := RateLimitPerSecond.Get(e); return v },
		RateLimitBurst:            func(e *Env) any { v, _ := RateLimitBurst.Get(e); return v },
		FaultsSeed:                func(e *Env) any { v, _ := FaultsSeed.Get(e); return v },
		LogLevel:                  func(e *Env) any { return LogLevel.Get(e) },
		AgentAllowHTTP:            func(e *Env) any { return AgentAllowHTTP.Get(e) },
	}
	for _, tc := range []struct {
		v      Variable
		value  string
		appEnv string
		want   result
	}{
		{KeyCacheTTL, "", "", result{30 * time.Second, ""}},
		{KeyCacheTTL, "1m30s", "", result{90 * time.Second, ""}},
		{KeyCacheTTL, "30", "", result{30 * time.Second, "KEY_CACHE_TTL"}},
		{MaxPendingScheduledPerOrg, "", "", result{0, ""}},
		{MaxPendingScheduledPerOrg, "7", "", result{7, ""}},
		{MaxPendingScheduledPerOrg, "0", "", result{0, "MAX_PENDING_SCHEDULED_PER_ORG: \"0\", want a whole number above 0"}},
		{MaxPendingScheduledPerOrg, "-3", "", result{0, "want a whole number above 0"}},
		{MaxPendingScheduledPerOrg, "ten", "", result{0, "want a whole number above 0"}},
		{MaxPendingScheduledPerOrg, "1.5", "", result{0, "want a whole number above 0"}},
		{RateLimitPerSecond, "0.5", "", result{0.5, ""}},
		{RateLimitPerSecond, "", "", result{0.0, "RATE_LIMIT_PER_SECOND must be set"}},
		{RateLimitPerSecond, "fast", "", result{0.0, "want a number"}},
		{RateLimitBurst, "100", "", result{100, ""}},
		{RateLimitBurst, "1.5", "", result{0, "RATE_LIMIT_BURST: \"1.5\", want a whole number"}},
		{FaultsSeed, "", "", result{int64(0), ""}},
		{FaultsSeed, "-7", "", result{int64(-7), ""}},
		{FaultsSeed, "x", "", result{int64(0), "CAPACITY_FAULTS_SEED"}},
		{LogLevel, "", "", result{slog.LevelInfo, ""}},
		{LogLevel, "debug", "", result{slog.LevelDebug, ""}},
		{LogLevel, "WARN", "", result{slog.LevelWarn, ""}},
		{LogLevel, "verbose", "", result{slog.LevelInfo, "LOG_LEVEL: \"verbose\""}},
		{AgentAllowHTTP, "", "prod", result{false, ""}},
		{AgentAllowHTTP, "false", "prod", result{false, ""}},
		{AgentAllowHTTP, "", "local", result{false, ""}},
		{AgentAllowHTTP, "true", "local", result{true, ""}},
		{AgentAllowHTTP, "true", "prod", result{false, "AGENT_ALLOW_HTTP is true in env \"prod\""}},
		{AgentAllowHTTP, "true", "dev", result{false, "allowed only in env local"}},
		{AgentAllowHTTP, "true", "", result{false, "is true in env \"\""}},
		{AgentAllowHTTP, "TRUE", "local", result{false, "want true or false"}},
		{AgentAllowHTTP, "1", "local", result{false, "want true or false"}},
		{AgentAllowHTTP, "yes", "local", result{false, "want true or false"}},
	} {
		t.Run(tc.v.Name()+"="+tc.value, func(t *testing.T) {
			e := New(fn, []string{tc.v.Name() + "=" + tc.value, "APP_ENV=" + tc.appEnv})
			got := result{value: parse[tc.v](e)}
			// Only the errors of this variable: the others are not read.
			for _, err := range strings.Split(errText(e), "\n") {
				if strings.Contains(err, tc.v.Name()) && !strings.Contains(err, "does not read it") {
					got.err = err
				}
			}
			if got.value != tc.want.value || (got.err == "") != (tc.want.err == "") || !strings.Contains(got.err, tc.want.err) {
				t.Errorf("%s=%q: %#v, error %q; want %#v, error with %q", tc.v.Name(), tc.value, got.value, got.err, tc.want.value, tc.want.err)
			}
		})
	}
}

func errText(e *Env) string {
	if err := e.Err(); err != nil {
		return err.Error()
	}
	return ""
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * time.Second: "30s", 15 * time.Minute: "15m", time.Hour: "1h", 90 * time.Minute: "1h30m",
		5 * time.Second: "5s", 61 * time.Second: "1m1s", 1500 * time.Millisecond: "1.5s", 0: "0s", 10 * time.Hour: "10h",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(want); err != nil || back != d {
			t.Errorf("%q parses as %v, %v; want %v", want, back, err, d)
		}
	}
}

// TestStandardLibraryOnly: infra and the local stack import this package, so it imports
// nothing but the standard library.
func TestStandardLibraryOnly(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files: %v", err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s, not of the standard library", name, path)
			}
		}
	}
}
