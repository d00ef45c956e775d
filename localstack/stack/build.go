package stack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// functionDir is the directory of function name's main package.
func (o *Options) functionDir(name string) string {
	dir := filepath.Join("functions", name)
	if o.FunctionDir != nil {
		dir = o.FunctionDir(name)
	}

	if !filepath.IsAbs(dir) {
		dir = filepath.Join(o.RepoRoot, dir)
	}

	return dir
}

// bootstrapPath is where the host build of function name goes.
func (o *Options) bootstrapPath(name string) string {
	return filepath.Join(o.BuildDir, name, "bootstrap")
}

// buildFunctions builds each named function once, for the host: the local stack runs the
// bootstraps as host processes, not in a Lambda sandbox.
func buildFunctions(ctx context.Context, o *Options, names []string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("build functions: go toolchain not found on PATH: %w", err)
	}

	for _, name := range names {
		start := time.Now()
		out := o.bootstrapPath(name)

		if err := goBuild(ctx, goTool, o.RepoRoot, o.functionDir(name), out); err != nil {
			return fmt.Errorf("build function %s: %w", name, err)
		}

		o.Logger.Info("built function", "function", name, "bootstrap", out, "took", time.Since(start).Round(time.Millisecond))
	}

	return nil
}

func goBuild(ctx context.Context, goTool, moduleDir, pkgDir, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("create output dir: %w", err)
	}

	cmd := exec.CommandContext(ctx, goTool, "build", "-tags", "lambda.norpc", "-o", out, pkgDir)
	cmd.Dir = moduleDir
	// Host platform on purpose, whatever GOOS/GOARCH the caller's shell exports for Lambda builds.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
	// Own process group, so that cancelling also stops the compilers go build has started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second

	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output

	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkgDir, err, strings.TrimSpace(output.String()))
	}

	return nil
}
