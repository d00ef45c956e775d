package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// maxAddrWait bounds how long Start waits for another test's stack to free the address.
const maxAddrWait = 10 * time.Minute

// holder is written next to a running stack so that another Start can tell who has the address.
type holder struct {
	PID   int    `json:"pid"`
	Stack string `json:"stack"`
	Test  bool   `json:"test"` // started by a test binary, so it will stop soon
}

// listen binds addr. Several test packages (go test ./... runs them in parallel) each start a
// stack on the default 127.0.0.1:4566; so when the address is held by another test's stack,
// listen waits for it. Anything else holding it (a `make run`,
// LocalStack) is an immediate, explicit error.
func listen(ctx context.Context, addr string, log *slog.Logger) (net.Listener, error) {
	deadline := time.Now().Add(maxAddrWait)
	waiting := false

	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln, nil
		}

		h, held := readHolder(addr)
		// Waiting makes sense only for another process's test, which will end on its own.
		wait := held && h.Test && h.PID != os.Getpid()

		if !errors.Is(err, syscall.EADDRINUSE) || !wait || time.Now().After(deadline) {
			what := "another local stack or LocalStack running?"
			if held {
				what = fmt.Sprintf("held by local stack %s, pid %d", h.Stack, h.PID)
			}

			return nil, fmt.Errorf("local stack cannot listen on %s (%s): %w", addr, what, err)
		}

		if !waiting {
			log.Info("address held by another test's local stack; waiting for it to stop", "addr", addr, "pid", h.PID)
			waiting = true
		}

		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for %s: %w", addr, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// holderPath is where the stack listening on addr in this process's network namespace
// describes itself.
func holderPath(addr string) string {
	return holderPathIn(netNamespace(), addr)
}

// holderPathIn names the holder file of addr in network namespace ns: 127.0.0.1:4566 of one
// namespace is not that of another (CI runners each in their own share /tmp), so each
// namespace has its own file. ns "" (no /proc) keys by the address alone.
func holderPathIn(ns, addr string) string {
	name := strings.NewReplacer(":", "_", "/", "_", "[", "", "]", "").Replace(addr)
	if ns != "" {
		name = "netns" + ns + "-" + name
	}
	return filepath.Join(os.TempDir(), "capacity-localstack-"+name+".json")
}

// netNamespace identifies this process's network namespace: the inode of /proc/self/ns/net
// (Linux), or "" where there is none.
func netNamespace() string {
	fi, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprint(st.Ino)
}

func writeHolder(addr, stackName string) error {
	data, err := json.Marshal(holder{PID: os.Getpid(), Stack: stackName, Test: testing.Testing()})
	if err != nil {
		return err
	}

	return os.WriteFile(holderPath(addr), data, 0o644)
}

// removeHolder deletes the holder file if this process wrote it.
func removeHolder(addr string) {
	if h, ok := readHolder(addr); ok && h.PID == os.Getpid() {
		_ = os.Remove(holderPath(addr))
	}
}

// readHolder returns the holder of addr if its process is alive.
func readHolder(addr string) (holder, bool) {
	data, err := os.ReadFile(holderPath(addr))
	if err != nil {
		return holder{}, false
	}

	var h holder
	if json.Unmarshal(data, &h) != nil || h.PID <= 0 {
		return holder{}, false
	}

	// A stale file from a stack that crashed names a dead process.
	if err := syscall.Kill(h.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return holder{}, false
	}

	return h, true
}
