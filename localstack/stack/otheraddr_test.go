package stack

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
)

// What a child stack of TestStacksOnOtherAddressesRunTheirOwnFunctions is told: its folder
// and its name (which its function answers with, as ECHO_EXTRA).
const (
	childStackDirEnv  = "LOCALSTACK_TEST_CHILD_DIR"
	childStackNameEnv = "LOCALSTACK_TEST_CHILD_NAME"
)

// childReady is what a child stack writes once it serves.
type childReady struct {
	Endpoint string            `json:"endpoint"`
	Outputs  map[string]string `json:"outputs"`
}

// TestStacksOnOtherAddressesRunTheirOwnFunctions runs two stacks side by side on free ports
// (kumo is one per process, so each runs in a child process of this test binary) and drives
// each one's API, state machine and event rule: every invocation must run the function of the
// stack it was made in, and only that one. kumo makes those invocations by calling itself at
// the hard-coded http://localhost:4566, which reached nothing, or whichever stack held port
// 4566, before the stack routed them to its own address.
func TestStacksOnOtherAddressesRunTheirOwnFunctions(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds a function and runs two stacks")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	stacks := []*childStack{startChildStack(t, "one"), startChildStack(t, "two")}
	for _, s := range stacks {
		s.waitReady(ctx, t)
	}

	cfg := aws.Config{Region: region, Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	markers := map[*childStack][]string{}

	for i, s := range stacks {
		other := stacks[1-i]
		endpoint := aws.String(s.ready.Endpoint)

		if strings.HasSuffix(s.ready.Endpoint, ":4566") {
			t.Fatalf("stack %s is on %s, want a port other than 4566", s.name, s.ready.Endpoint)
		}

		t.Run(s.name+" API runs its own function", func(t *testing.T) {
			marker := s.name + "-api-" + time.Now().Format("150405.000000")
			markers[s] = append(markers[s], marker)

			resp, event := callAPI(t, http.MethodPost, s.ready.Outputs["ApiUrl"]+"/items/x", `{"marker":"`+marker+`"}`)
			if got := resp.Header.Get("X-Extra"); got != s.name {
				t.Errorf("the API of stack %s ran the function of stack %q", s.name, got)
			}

			if want := "http://localhost:" + s.port(t); resp.Header.Get("X-Endpoint") != want {
				t.Errorf("the function's AWS_ENDPOINT_URL is %q, want %q", resp.Header.Get("X-Endpoint"), want)
			}

			if !strings.Contains(event.Body, marker) {
				t.Errorf("the function got body %q, want the marker %s", event.Body, marker)
			}
		})

		t.Run(s.name+" state machine runs its own function", func(t *testing.T) {
			sf := sfn.NewFromConfig(cfg, func(o *sfn.Options) { o.BaseEndpoint = endpoint })
			marker := s.name + "-sfn-" + time.Now().Format("150405.000000")
			markers[s] = append(markers[s], marker)

			desc := runExecution(ctx, t, sf, s.ready.Outputs["StateMachineArn"], `{"marker":"`+marker+`"}`)

			var out struct {
				Headers map[string]string `json:"headers"`
			}

			if desc.Status != sfntypes.ExecutionStatusSucceeded || json.Unmarshal([]byte(aws.ToString(desc.Output)), &out) != nil {
				t.Fatalf("status %s, output %s, error %s %s", desc.Status, aws.ToString(desc.Output), aws.ToString(desc.Error), aws.ToString(desc.Cause))
			}

			if out.Headers["X-Extra"] != s.name {
				t.Errorf("the state machine of stack %s ran the function of stack %q", s.name, out.Headers["X-Extra"])
			}
		})

		t.Run(s.name+" event rule delivers to its own function", func(t *testing.T) {
			eb := eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = endpoint })
			marker := s.name + "-event-" + time.Now().Format("150405.000000")
			markers[s] = append(markers[s], marker)

			out, err := eb.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
				Source: aws.String("capacity.test"), DetailType: aws.String("Ping"), Detail: aws.String(`{"marker":"` + marker + `"}`),
			}}})
			if err != nil || out.FailedEntryCount != 0 {
				t.Fatalf("PutEvents: %v %+v", err, out)
			}

			waitFor(t, func() bool { return strings.Contains(s.functionLog(), marker) })
		})

		t.Run(s.name+" runs nothing of the other stack's", func(t *testing.T) {
			// EventBridge delivers asynchronously: give a stray delivery time to land.
			time.Sleep(300 * time.Millisecond)

			for _, m := range markers[s] {
				if strings.Contains(other.functionLog(), m) {
					t.Errorf("stack %s's function got %s, made in stack %s", other.name, m, s.name)
				}

				if !strings.Contains(s.functionLog(), m) {
					t.Errorf("stack %s's function did not get %s", s.name, m)
				}
			}
		})
	}
}

// childStack is a stack run by TestStackProcess in a child process.
type childStack struct {
	name, dir string
	cmd       *exec.Cmd
	exited    chan struct{}
	ready     childReady
}

func startChildStack(t *testing.T, name string) *childStack {
	t.Helper()

	s := &childStack{name: name, dir: t.TempDir(), exited: make(chan struct{})}

	out, err := os.Create(filepath.Join(s.dir, "child.log"))
	if err != nil {
		t.Fatal(err)
	}

	s.cmd = exec.Command(os.Args[0], "-test.run=^TestStackProcess$", "-test.count=1", "-test.timeout=6m")
	s.cmd.Env = append(os.Environ(), childStackDirEnv+"="+s.dir, childStackNameEnv+"="+name)
	s.cmd.Stdout, s.cmd.Stderr = out, out

	stdin, err := s.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}

	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}

	go func() {
		_ = s.cmd.Wait()
		_ = out.Close()
		close(s.exited)
	}()

	// Closing its standard input stops the child's stack; a child that does not stop is killed.
	t.Cleanup(func() {
		_ = stdin.Close()

		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
			t.Errorf("child stack %s did not stop within 30s of its input closing; its log ends:\n%s", name, logTail(out.Name(), 20))
		}
	})

	return s
}

func (s *childStack) waitReady(ctx context.Context, t *testing.T) {
	t.Helper()

	path := filepath.Join(s.dir, "ready.json")

	for {
		if data, err := os.ReadFile(path); err == nil {
			if err := json.Unmarshal(data, &s.ready); err != nil {
				t.Fatalf("child stack %s: %s: %v", s.name, path, err)
			}

			return
		}

		select {
		case <-s.exited:
			t.Fatalf("child stack %s exited before it was ready; its log ends:\n%s", s.name, logTail(filepath.Join(s.dir, "child.log"), 30))
		case <-ctx.Done():
			t.Fatalf("child stack %s not ready: %v; its log ends:\n%s", s.name, ctx.Err(), logTail(filepath.Join(s.dir, "child.log"), 30))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *childStack) port(t *testing.T) string {
	t.Helper()

	u, err := url.Parse(s.ready.Endpoint)
	if err != nil {
		t.Fatal(err)
	}

	_, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}

	return port
}

// functionLog is what the child's echo function wrote: every event it got.
func (s *childStack) functionLog() string {
	data, _ := os.ReadFile(filepath.Join(s.dir, "build", "logs", "capacity-local-echo.log"))

	return string(data)
}

// TestStackProcess is the child process of TestStacksOnOtherAddressesRunTheirOwnFunctions: it
// runs one stack on a free port until its standard input closes. In a test run of its own it
// does nothing.
func TestStackProcess(t *testing.T) {
	dir := os.Getenv(childStackDirEnv)
	if dir == "" {
		return
	}

	echoDir, err := filepath.Abs("testdata/echo")
	if err != nil {
		t.Fatal(err)
	}

	st, err := Start(t.Context(), Options{
		TemplatePath: fixtureTemplate,
		Addr:         "127.0.0.1:0",
		RepoRoot:     "../..",
		FunctionDir:  func(string) string { return echoDir },
		BuildDir:     filepath.Join(dir, "build"),
		ExtraEnv:     map[string]string{"ECHO_EXTRA": os.Getenv(childStackNameEnv)},
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}

	defer func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()

	data, err := json.Marshal(childReady{Endpoint: st.Endpoint(), Outputs: st.Outputs()})
	if err != nil {
		t.Fatal(err)
	}

	// Written whole, then renamed, so the parent never reads half of it.
	tmp := filepath.Join(dir, "ready.json.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}

	if err := os.Rename(tmp, filepath.Join(dir, "ready.json")); err != nil {
		t.Fatal(err)
	}

	_, _ = io.Copy(io.Discard, os.Stdin)
}
