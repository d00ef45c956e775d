package stack

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// script writes an executable shell script and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()

	path := filepath.Join(t.TempDir(), "bootstrap")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	return path
}

func testSpec(t *testing.T, binary string) processSpec {
	return processSpec{
		function: "fn",
		binary:   binary,
		env:      []string{"PATH=" + os.Getenv("PATH"), "PID_DIR=" + t.TempDir()},
		logPath:  filepath.Join(t.TempDir(), "logs", "fn.log"),
	}
}

// gone reports whether pid has exited (an unreaped zombie counts as exited).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}

	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return os.IsNotExist(err)
	}

	// pid (comm) S ...: the state follows the last ')'.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))

	return len(fields) > 0 && fields[0] == "Z"
}

func TestSupervisorStopsWholeProcessGroups(t *testing.T) {
	// Like `go run`: the bootstrap starts a child that must stop with it.
	bin := script(t, `sleep 300 & echo $! > "$PID_DIR/child.$$"; exec sleep 300`)
	spec := testSpec(t, bin)
	pidDir := strings.TrimPrefix(spec.env[1], "PID_DIR=")

	s := newSupervisor(slog.New(slog.DiscardHandler))
	if err := s.start(spec, 2); err != nil {
		t.Fatal(err)
	}

	var children []int

	waitFor(t, func() bool { // both children have written their pid (not just created the file)
		entries, _ := os.ReadDir(pidDir)
		for _, e := range entries {
			if data, _ := os.ReadFile(filepath.Join(pidDir, e.Name())); strings.TrimSpace(string(data)) == "" {
				return false
			}
		}

		return len(entries) == 2
	})

	entries, _ := os.ReadDir(pidDir)
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(pidDir, e.Name()))

		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatal(err)
		}

		children = append(children, pid)
	}

	s.stop()

	for _, pid := range append(s.startedPIDs(), children...) {
		waitFor(t, func() bool { return gone(pid) })
	}
}

func TestSupervisorKillsWhatIgnoresSIGTERM(t *testing.T) {
	s := newSupervisor(slog.New(slog.DiscardHandler))
	s.grace = 200 * time.Millisecond

	// An ignored signal stays ignored across exec.
	if err := s.start(testSpec(t, script(t, `trap '' TERM; exec sleep 300`)), 1); err != nil {
		t.Fatal(err)
	}

	time.Sleep(100 * time.Millisecond) // let the trap run

	start := time.Now()
	s.stop()

	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("stop took %s", took)
	}

	for _, pid := range s.startedPIDs() {
		if !gone(pid) {
			t.Errorf("process %d survived stop", pid)
		}
	}
}

func TestSupervisorRestartsCrashedProcess(t *testing.T) {
	s := newSupervisor(slog.New(slog.DiscardHandler))
	spec := testSpec(t, script(t, `echo "init failed" >&2; exit 3`))

	if err := s.start(spec, 1); err != nil {
		t.Fatal(err)
	}

	defer s.stop()

	select {
	case e := <-s.exits:
		if e.function != "fn" || !strings.Contains(e.err.Error(), "exit status 3") {
			t.Errorf("exit = %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no exit reported")
	}

	// Started again after the backoff, as Lambda replaces a crashed environment.
	waitFor(t, func() bool { return len(s.startedPIDs()) >= 2 })

	if tail := logTail(spec.logPath, 1); tail != "init failed" {
		t.Errorf("log ends %q", tail)
	}
}

// TestSupervisorRestartsKilledProcess: a bootstrap killed (SIGKILL, as a crashed or reclaimed
// execution environment) is started again, as Lambda starts a new one.
func TestSupervisorRestartsKilledProcess(t *testing.T) {
	s := newSupervisor(slog.New(slog.DiscardHandler))
	if err := s.start(testSpec(t, script(t, `exec sleep 300`)), 2); err != nil {
		t.Fatal(err)
	}

	defer s.stop()

	if _, err := s.kill("other", 0); err == nil {
		t.Error("killed a process of a function that has none")
	}

	pid, err := s.kill("fn", 1)
	if err != nil {
		t.Fatal(err)
	}

	waitFor(t, func() bool { return gone(pid) })
	waitFor(t, func() bool {
		running, restarts := s.counts("fn")
		return running == 2 && restarts == 1 && len(s.startedPIDs()) == 3
	})
}
