package e2e

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/stack"
)

// BenchmarkBootstrap reports, for each function of the stack, the size of the deployable
// bootstrap (linux/arm64, stripped, as `make lambdas` builds it) and the time from starting the
// local stack's host bootstrap to its first poll of the Lambda runtime API (a stand-in runtime
// API on loopback records the poll). Each starts with the environment the local stack gives
// it, which is the template's: a function that comes to require more configuration gets it
// from where it is declared (infra), not from a copy here. The short form (-short) skips the
// arm64 build.
func BenchmarkBootstrap(b *testing.B) {
	if localStack == nil {
		b.Skip("needs the local stack this test process starts (not CAPACITY_OUTPUTS): it starts each function with the stack's environment for it")
	}
	seen := map[string]bool{}
	for _, fn := range localStack.Functions() {
		if seen[fn.Code] {
			continue
		}
		seen[fn.Code] = true
		b.Run(fn.Code, func(b *testing.B) { benchBootstrap(b, fn) })
	}
}

func benchBootstrap(b *testing.B, fn stack.Function) {
	var armSize int64
	if !testing.Short() {
		arm := filepath.Join(b.TempDir(), "bootstrap")
		build(b, "../../functions/"+fn.Code, arm, "GOOS=linux", "GOARCH=arm64")
		fi, err := os.Stat(arm)
		if err != nil {
			b.Fatal(err)
		}
		armSize = fi.Size()
	}

	polled := make(chan struct{}, 1)
	runtime := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/runtime/invocation/next") {
			select {
			case polled <- struct{}{}:
			default:
			}
			<-r.Context().Done() // hold the poll, as the runtime API does while idle
		}
	}))
	defer runtime.Close()
	env := slices.DeleteFunc(slices.Clone(fn.Env), func(kv string) bool { return strings.HasPrefix(kv, "AWS_LAMBDA_RUNTIME_API=") })
	env = append(env, "AWS_LAMBDA_RUNTIME_API="+strings.TrimPrefix(runtime.URL, "http://"))

	var total time.Duration
	for b.Loop() {
		var stderr bytes.Buffer
		cmd := exec.Command(fn.Bootstrap)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, &stderr, &stderr
		exited := make(chan error, 1)
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		go func() { exited <- cmd.Wait() }()
		select {
		case <-polled:
			total += time.Since(start)
		case err := <-exited:
			b.Fatalf("bootstrap %s exited before polling the runtime API: %v\n%s", fn.Code, err, stderr.String())
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			b.Fatal("bootstrap did not poll the runtime API within 10s")
		}
		_ = cmd.Process.Kill()
		<-exited
	}
	if armSize > 0 { // reported after the loop: its start clears the metrics reported before
		b.ReportMetric(float64(armSize)/(1<<20), "arm64-bootstrap-MiB")
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-to-first-poll")
}

func build(b *testing.B, pkg, out string, env ...string) {
	b.Helper()
	cmd := exec.Command("go", "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Env = append(os.Environ(), append([]string{"CGO_ENABLED=0"}, env...)...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build %s: %v\n%s", out, err, msg)
	}
}
