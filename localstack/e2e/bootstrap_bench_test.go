package e2e

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkBootstrap reports, for each function, the size of the deployable bootstrap
// (linux/arm64, stripped, as `make lambdas` builds it) and the time from starting a host
// bootstrap process to its first poll of the Lambda runtime API (a stand-in runtime API on
// loopback records the poll).
func BenchmarkBootstrap(b *testing.B) {
	for _, fn := range []string{"api", "terminate-node", "reconciler"} {
		b.Run(fn, func(b *testing.B) { benchBootstrap(b, "../../functions/"+fn) })
	}
}

func benchBootstrap(b *testing.B, pkg string) {
	dir := b.TempDir()
	arm := filepath.Join(dir, "arm64", "bootstrap")
	build(b, pkg, arm, "GOOS=linux", "GOARCH=arm64")
	fi, err := os.Stat(arm)
	if err != nil {
		b.Fatal(err)
	}
	host := filepath.Join(dir, "host", "bootstrap")
	build(b, pkg, host)

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

	var total time.Duration
	for b.Loop() {
		cmd := exec.Command(host)
		cmd.Env = []string{
			"AWS_LAMBDA_RUNTIME_API=" + strings.TrimPrefix(runtime.URL, "http://"),
			// Every function's required configuration; none is used before the first poll.
			"STATE_TABLE=bench-state", "AUDIT_TABLE=bench-audit", "KEYS_TABLE=bench-keys", "AGENT_MASTER_SECRET_ID=bench",
			"STATE_MACHINE_ARN=arn:aws:states:us-east-1:000000000000:stateMachine:bench", "AWS_REGION=us-east-1",
			"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		select {
		case <-polled:
			total += time.Since(start)
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			b.Fatal("bootstrap did not poll the runtime API within 10s")
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	b.ReportMetric(float64(fi.Size())/(1<<20), "arm64-bootstrap-MiB")
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
