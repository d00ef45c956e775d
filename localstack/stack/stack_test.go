package stack

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	schedtypes "github.com/aws/aws-sdk-go-v2/service/scheduler/types"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

const fixtureTemplate = "testdata/capacity-local.template.json"

// TestStack runs the fixture stack end to end: build the echo function, provision, call the
// API, the table, the state machine and the event rule, then check Close stops everything.
func TestStack(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds a function and runs kumo on 127.0.0.1:4566")
	}

	// It runs on the default address, 127.0.0.1:4566, and checks the endpoint and URLs there
	// (TestStacksOnOtherAddressesRunTheirOwnFunctions runs stacks elsewhere). If another test
	// package's stack has it, Start waits for it; anything else there fails the test (not a
	// skip, so CI never passes vacuously).
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	echoDir, err := filepath.Abs("testdata/echo")
	if err != nil {
		t.Fatal(err)
	}

	buildDir := t.TempDir()
	start := time.Now()

	st, err := Start(ctx, Options{
		TemplatePath: fixtureTemplate,
		RepoRoot:     "../..",
		FunctionDir: func(name string) string {
			if name != "echo" {
				t.Errorf("asked for function %q", name)
			}

			return echoDir
		},
		BuildDir:  buildDir,
		Processes: 2,
		ExtraEnv:  map[string]string{"ECHO_EXTRA": "extra-value"},
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatalf("Start: %v (this test needs %s, the default address)", err, DefaultAddr)
	}

	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = st.Close()
		}
	})

	t.Logf("stack started in %s", time.Since(start).Round(time.Millisecond))

	if st.StackName() != "capacity-local" || st.Endpoint() != "http://127.0.0.1:4566" {
		t.Errorf("stack %q at %q", st.StackName(), st.Endpoint())
	}

	outputs := st.Outputs()
	apiURL := outputs["ApiUrl"]

	if !strings.HasPrefix(apiURL, "http://127.0.0.1:4566/restapis/") || !strings.HasSuffix(apiURL, "/local/_user_request_") {
		t.Fatalf("ApiUrl = %q, want the local path form", apiURL)
	}

	if outputs["ApiEndpoint4F160690"] != apiURL || outputs["TableName"] != "capacity-local-state" ||
		outputs["FunctionName"] != "capacity-local-echo" || !strings.HasPrefix(outputs["StateMachineArn"], "arn:aws:states:us-east-1:000000000000:stateMachine:") {
		t.Errorf("outputs = %v", outputs)
	}

	// What a bootstrap started outside the stack (BenchmarkBootstrap) needs: the build the
	// stack runs and the environment it runs it with.
	fns := st.Functions()
	if len(fns) != 1 || fns[0].Code != "echo" || fns[0].Name != "capacity-local-echo" ||
		fns[0].Bootstrap != filepath.Join(buildDir, "echo", "bootstrap") ||
		!slices.Contains(fns[0].Env, "TABLE_NAME=capacity-local-state") || !slices.Contains(fns[0].Env, "ECHO_EXTRA=extra-value") {
		t.Errorf("Functions() = %+v", fns)
	}

	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	endpoint := aws.String(st.Endpoint())

	t.Run("API reaches the function with the real path", func(t *testing.T) {
		resp, event := callAPI(t, http.MethodPost, apiURL+"/items/abc123", `{"hello":"world"}`)

		if event.Path != "/items/abc123" || event.PathParameters["id"] != "abc123" || event.Resource != "/items/{id}" ||
			event.RequestContext.Path != "/local/items/abc123" || event.RequestContext.ResourcePath != "/items/{id}" ||
			event.HTTPMethod != http.MethodPost || event.Body != `{"hello":"world"}` {
			t.Errorf("event = %+v", event)
		}

		// The function's environment: resolved template variables, runner variables, ExtraEnv.
		for header, want := range map[string]string{
			"X-Function-Name": "capacity-local-echo",
			"X-Table-Name":    "capacity-local-state",
			"X-Extra":         "extra-value",
			"X-Endpoint":      "http://localhost:4566",
		} {
			if got := resp.Header.Get(header); got != want {
				t.Errorf("%s = %q, want %q", header, got, want)
			}
		}
	})

	t.Run("API path values stay escaped", func(t *testing.T) {
		_, event := callAPI(t, http.MethodGet, apiURL+"/items/a%20b", "")

		if event.Path != "/items/a%20b" || event.PathParameters["id"] != "a b" {
			t.Errorf("path %q, id %q", event.Path, event.PathParameters["id"])
		}
	})

	t.Run("API unknown path", func(t *testing.T) {
		resp, err := http.Get(apiURL + "/nope")
		if err != nil {
			t.Fatal(err)
		}

		_ = resp.Body.Close()

		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("status %d, want 403 as on API Gateway", resp.StatusCode)
		}
	})

	t.Run("table has its GSI and TTL", func(t *testing.T) {
		db := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = endpoint })

		desc, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String("capacity-local-state")})
		if err != nil {
			t.Fatal(err)
		}

		gsis := desc.Table.GlobalSecondaryIndexes
		if len(gsis) != 1 || aws.ToString(gsis[0].IndexName) != "byState" || len(gsis[0].KeySchema) != 2 ||
			aws.ToString(gsis[0].KeySchema[0].AttributeName) != "gsi1pk" || aws.ToString(gsis[0].KeySchema[1].AttributeName) != "gsi1sk" {
			t.Errorf("GSIs = %+v", gsis)
		}

		ttl, err := db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String("capacity-local-state")})
		if err != nil {
			t.Fatal(err)
		}

		if d := ttl.TimeToLiveDescription; d == nil || aws.ToString(d.AttributeName) != "expiresAt" || d.TimeToLiveStatus != "ENABLED" {
			t.Errorf("TTL = %+v", d)
		}
	})

	t.Run("SDK invoke by name", func(t *testing.T) {
		fn := lambda.NewFromConfig(cfg, func(o *lambda.Options) { o.BaseEndpoint = endpoint })

		out, err := fn.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("capacity-local-echo"), Payload: []byte(`{"direct":true}`)})
		if err != nil {
			t.Fatal(err)
		}

		if out.FunctionError != nil || !strings.Contains(string(out.Payload), `{\"direct\":true}`) {
			t.Errorf("error %v, payload %s", aws.ToString(out.FunctionError), out.Payload)
		}
	})

	t.Run("state machine runs the function", func(t *testing.T) {
		sf := sfn.NewFromConfig(cfg, func(o *sfn.Options) { o.BaseEndpoint = endpoint })
		desc := runExecution(ctx, t, sf, outputs["StateMachineArn"], `{"marker":"from-sfn"}`)

		if desc.Status != sfntypes.ExecutionStatusSucceeded || !strings.Contains(aws.ToString(desc.Output), "from-sfn") {
			t.Errorf("status %s, output %s, error %s %s", desc.Status, aws.ToString(desc.Output), aws.ToString(desc.Error), aws.ToString(desc.Cause))
		}
	})

	t.Run("event rule delivers to the function", func(t *testing.T) {
		eb := eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = endpoint })

		rules, err := eb.ListRules(ctx, &eventbridge.ListRulesInput{})
		if err != nil {
			t.Fatal(err)
		}

		var names []string
		for _, r := range rules.Rules {
			names = append(names, aws.ToString(r.Name))
		}

		slices.Sort(names)

		if want := []string{"capacity-local-PingRule1D3E5F70", "capacity-local-ReconcileSchedule9C1B2A3D"}; !slices.Equal(names, want) {
			t.Errorf("rules %v, want %v", names, want)
		}

		marker := "marker-" + time.Now().Format("150405.000000")

		out, err := eb.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
			Source:     aws.String("capacity.test"),
			DetailType: aws.String("Ping"),
			Detail:     aws.String(`{"marker":"` + marker + `"}`),
		}}})
		if err != nil || out.FailedEntryCount != 0 {
			t.Fatalf("PutEvents: %v %+v", err, out)
		}

		logPath := filepath.Join(buildDir, "logs", "capacity-local-echo.log")

		waitFor(t, func() bool {
			data, _ := os.ReadFile(logPath)

			return strings.Contains(string(data), marker)
		})

		// Only the pattern rule delivers: the schedule rule is created disabled, since kumo
		// would match every event against a rule without a pattern.
		time.Sleep(300 * time.Millisecond)

		if data, _ := os.ReadFile(logPath); strings.Count(string(data), marker) != 1 {
			t.Errorf("event delivered %d times, want once", strings.Count(string(data), marker))
		}

		sched, err := eb.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: aws.String("capacity-local-ReconcileSchedule9C1B2A3D")})
		if err != nil {
			t.Fatal(err)
		}

		targets, err := eb.ListTargetsByRule(ctx, &eventbridge.ListTargetsByRuleInput{Rule: sched.Name})
		if err != nil {
			t.Fatal(err)
		}

		if sched.State != ebtypes.RuleStateDisabled || aws.ToString(sched.ScheduleExpression) != "rate(5 minutes)" ||
			len(targets.Targets) != 1 || aws.ToString(targets.Targets[0].Input) != `{"reconcile":true}` {
			t.Errorf("schedule rule %+v, targets %+v", sched, targets.Targets)
		}
	})

	// kumo neither fires schedules nor polls event source mappings; the runner does both, so a
	// one-time schedule reaches the function through the bus, the rule, the queue and the mapping.
	t.Run("schedule fires through the bus and the queue to the function", func(t *testing.T) {
		sched := scheduler.NewFromConfig(cfg, func(o *scheduler.Options) { o.BaseEndpoint = endpoint })
		q := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = endpoint })
		marker := "scheduled-" + time.Now().Format("150405.000000")

		name := "s-" + strings.ReplaceAll(marker, ".", "-")

		_, err := sched.CreateSchedule(ctx, &scheduler.CreateScheduleInput{
			Name: aws.String(name), GroupName: aws.String("capacity-local"),
			ScheduleExpression:    aws.String("at(" + time.Now().UTC().Add(time.Second).Format("2006-01-02T15:04:05") + ")"),
			ActionAfterCompletion: schedtypes.ActionAfterCompletionDelete,
			FlexibleTimeWindow:    &schedtypes.FlexibleTimeWindow{Mode: schedtypes.FlexibleTimeWindowModeOff},
			Target: &schedtypes.Target{
				Arn: aws.String(outputs["BusArn"]), RoleArn: aws.String("arn:aws:iam::000000000000:role/scheduler"),
				Input:                 aws.String(`{"marker":"` + marker + `"}`),
				EventBridgeParameters: &schedtypes.EventBridgeParameters{Source: aws.String("capacity.test.queue"), DetailType: aws.String("Queued Ping")},
			},
		})
		if err != nil {
			t.Fatal(err)
		}

		logPath := filepath.Join(buildDir, "logs", "capacity-local-echo.log")

		deadline := time.Now().Add(20 * time.Second)
		for {
			data, _ := os.ReadFile(logPath)
			if line := lineWith(string(data), marker); line != "" {
				if !strings.Contains(line, `"eventSource":"aws:sqs"`) || !strings.Contains(line, `detail-type\":\"Queued Ping`) {
					t.Errorf("the function got %s, want an SQS batch holding the event", line)
				}

				break
			}

			if time.Now().After(deadline) {
				t.Fatal("the scheduled event did not reach the function within 20s")
			}

			time.Sleep(50 * time.Millisecond)
		}

		// Fired once and deleted (ActionAfterCompletion DELETE); the batch succeeded, so the
		// message is deleted too.
		waitFor(t, func() bool {
			_, err := sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(name), GroupName: aws.String("capacity-local")})

			var notFound *schedtypes.ResourceNotFoundException
			if !errors.As(err, &notFound) {
				return false
			}

			attrs, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
				QueueUrl: aws.String(outputs["RequestsQueueUrl"]), AttributeNames: []sqstypes.QueueAttributeName{"All"},
			})

			return err == nil && attrs.Attributes["ApproximateNumberOfMessages"] == "0" && attrs.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
		})

		if data, _ := os.ReadFile(logPath); strings.Count(string(data), marker) != 1 {
			t.Errorf("scheduled event delivered %d times, want once", strings.Count(string(data), marker))
		}
	})

	pids := st.procs.startedPIDs()
	if len(pids) != 2 {
		t.Errorf("started %d processes, want 2: %v", len(pids), pids)
	}

	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Errorf("bootstrap %d not running before Close: %v", pid, err)
		}
	}

	if len(stackGoroutines()) == 0 {
		t.Error("goroutine check is blind: no goroutine of the running stack found")
	}

	closeStart := time.Now()

	if err := st.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	closed = true
	t.Logf("stack closed in %s", time.Since(closeStart).Round(time.Millisecond))

	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("bootstrap %d still exists after Close (kill 0: %v)", pid, err)
		}
	}

	// None of the stack's goroutines outlive it (kumo's own service goroutines are process-wide
	// singletons and are not the stack's to stop).
	deadline := time.Now().Add(5 * time.Second)
	for len(stackGoroutines()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := stackGoroutines(); len(g) > 0 {
		t.Fatalf("goroutines outlive the stack:\n%s", strings.Join(g, "\n\n"))
	}

	// The address is free again, unless another test package's stack took it at once.
	if ln, err := net.Listen("tcp", DefaultAddr); err == nil {
		_ = ln.Close()
	} else if h, ok := readHolder(DefaultAddr); !ok || h.PID == os.Getpid() {
		t.Errorf("%s still busy after Close: %v", DefaultAddr, err)
	}
}

func TestStartFailsOnBusyAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	defer func() { _ = ln.Close() }()

	addr := ln.Addr().String()

	_, err = Start(t.Context(), Options{TemplatePath: fixtureTemplate, Addr: addr, BuildDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("err = %v, want it to name %s", err, addr)
	}
}

func TestStartCleansUpWhenBuildFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	addr := ln.Addr().String()
	_ = ln.Close()

	_, err = Start(t.Context(), Options{
		TemplatePath: fixtureTemplate,
		Addr:         addr,
		RepoRoot:     "../..",
		FunctionDir:  func(string) string { return t.TempDir() }, // no Go files
		BuildDir:     t.TempDir(),
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err == nil || !strings.Contains(err.Error(), "build function echo") {
		t.Fatalf("err = %v, want a build error", err)
	}

	// The address was released.
	requireAddrFree(t, addr)
}

func TestListenWaitsForAnotherTestsStack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	addr := ln.Addr().String()
	log := slog.New(slog.DiscardHandler)

	// Held by something that is not a test's stack: fail at once, naming the holder.
	writeHolderFile(t, addr, holder{PID: os.Getpid(), Stack: "capacity-local", Test: false})

	if _, err := listen(t.Context(), addr, log); err == nil || !strings.Contains(err.Error(), "held by local stack capacity-local") {
		t.Fatalf("err = %v, want it to name the holder", err)
	}

	// Held by a test's stack in this very process: waiting would never end.
	writeHolderFile(t, addr, holder{PID: os.Getpid(), Stack: "capacity-local", Test: true})

	if _, err := listen(t.Context(), addr, log); err == nil {
		t.Fatal("listen waited for its own process")
	}

	// Held by another process's test stack (the parent of this test binary stands in for it):
	// wait until it lets go.
	writeHolderFile(t, addr, holder{PID: os.Getppid(), Stack: "capacity-local", Test: true})

	time.AfterFunc(300*time.Millisecond, func() { _ = ln.Close() })

	got, err := listen(t.Context(), addr, log)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}

	_ = got.Close()
}

func writeHolderFile(t *testing.T, addr string, h holder) {
	t.Helper()

	data, _ := json.Marshal(h)
	if err := os.WriteFile(holderPath(addr), data, 0o644); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = os.Remove(holderPath(addr)) })
}

func TestFunctionEnv(t *testing.T) {
	fn := functionSpec{
		name: "capacity-local-api", handler: "bootstrap", memory: 512,
		env: map[string]string{"TABLE_NAME": "t", "AWS_REGION": "eu-west-1"},
	}

	env := functionEnv(fn, "4566", map[string]string{"AGENT_SECRET": "s", "TABLE_NAME": "override"})

	want := map[string]string{
		"AWS_LAMBDA_RUNTIME_API":          "127.0.0.1:4566/_runtime/capacity-local-api",
		"AWS_ENDPOINT_URL":                "http://localhost:4566",
		"AWS_REGION":                      "us-east-1", // reserved: the runner's value wins
		"AWS_DEFAULT_REGION":              "us-east-1",
		"AWS_ACCESS_KEY_ID":               "test",
		"AWS_SECRET_ACCESS_KEY":           "test",
		"AWS_LAMBDA_FUNCTION_NAME":        "capacity-local-api",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
		"_HANDLER":                        "bootstrap",
		"AGENT_SECRET":                    "s",
		"TABLE_NAME":                      "override", // ExtraEnv wins
	}

	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}

	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}

	for _, leaked := range []string{"HOME", "AWS_PROFILE", "GOFLAGS"} {
		if _, ok := got[leaked]; ok {
			t.Errorf("%s leaked from the runner's environment", leaked)
		}
	}
}

// TestFunctionEnvOnlyDeclared: a variable of ours from ExtraEnv goes only to the functions
// that declare it (they refuse any other), the runtime's to every function, and all to a
// function envvar does not know.
func TestFunctionEnvOnlyDeclared(t *testing.T) {
	extra := map[string]string{"START_AFTER": "1s", "CAPACITY_FAULTS": "*:Throttling=0.1", "AWS_EXTRA": "x"}
	for _, tc := range []struct {
		code string
		want []string
	}{
		{"reconciler", []string{"START_AFTER", "CAPACITY_FAULTS", "AWS_EXTRA"}},
		{"api", []string{"CAPACITY_FAULTS", "AWS_EXTRA"}},
		{"echo", []string{"START_AFTER", "CAPACITY_FAULTS", "AWS_EXTRA"}},
	} {
		t.Run(tc.code, func(t *testing.T) {
			var got []string
			for _, kv := range functionEnv(functionSpec{name: "capacity-local-" + tc.code, code: tc.code}, "4566", extra) {
				if k, _, _ := strings.Cut(kv, "="); extra[k] != "" {
					got = append(got, k)
				}
			}
			slices.Sort(got)
			slices.Sort(tc.want)
			if !slices.Equal(got, tc.want) {
				t.Errorf("extra variables %v, want %v", got, tc.want)
			}
		})
	}
}

// apiEvent is the part of the echoed API Gateway event the tests check.
type apiEvent struct {
	Resource       string            `json:"resource"`
	Path           string            `json:"path"`
	HTTPMethod     string            `json:"httpMethod"`
	PathParameters map[string]string `json:"pathParameters"`
	Body           string            `json:"body"`
	RequestContext struct {
		Path         string `json:"path"`
		ResourcePath string `json:"resourcePath"`
	} `json:"requestContext"`
}

func callAPI(t *testing.T, method, url, body string) (*http.Response, apiEvent) {
	t.Helper()

	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}

	defer func() { _ = resp.Body.Close() }()

	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}

	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: status %d: %s", method, url, resp.StatusCode, data)
	}

	var event apiEvent
	if err := json.Unmarshal(data, &event); err != nil {
		t.Fatalf("response is not the echoed event: %v\n%s", err, data)
	}

	return resp, event
}

// runExecution starts an execution of the state machine and waits until it is no longer running.
func runExecution(ctx context.Context, t *testing.T, sf *sfn.Client, stateMachineArn, input string) *sfn.DescribeExecutionOutput {
	t.Helper()

	exec, err := sf.StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(stateMachineArn), Input: aws.String(input)})
	if err != nil {
		t.Fatalf("StartExecution: %v", err)
	}

	var desc *sfn.DescribeExecutionOutput

	waitFor(t, func() bool {
		desc, err = sf.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: exec.ExecutionArn})

		return err == nil && desc.Status != sfntypes.ExecutionStatusRunning
	})

	return desc
}

func requireAddrFree(t *testing.T, addr string) {
	t.Helper()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("%s is busy (%v): Start did not release it, or something else took it at once", addr, err)
	}

	_ = ln.Close()
}

// stackGoroutines returns the stacks of goroutines running this package's code, other than tests.
// lineWith returns the first line of text that contains s, or "".
func lineWith(text, s string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			return line
		}
	}

	return ""
}

func stackGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]

	var ours []string

	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "capacity/localstack/stack.") && !strings.Contains(g, "stack.Test") {
			ours = append(ours, g)
		}
	}

	return ours
}

// A stack on another address builds and logs apart from one on the default address, so two
// stacks of one checkout do not truncate each other's function logs.
func TestDefaultBuildDirByAddress(t *testing.T) {
	for _, tt := range []struct{ addr, want string }{
		{"", "local"},
		{DefaultAddr, "local"},
		{"127.0.0.1:4567", "local-4567"},
		{"localhost:4566", "local-4566"},
		{"[::1]:5000", "local-5000"},
	} {
		o := Options{TemplatePath: fixtureTemplate, Addr: tt.addr, RepoRoot: "/repo"}
		if err := o.setDefaults(); err != nil {
			t.Fatal(err)
		}

		if want := filepath.Join("/repo", "build", tt.want); o.BuildDir != want {
			t.Errorf("Addr %q: BuildDir %s, want %s", tt.addr, o.BuildDir, want)
		}
	}
}
