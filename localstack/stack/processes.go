package stack

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"
)

// How long Close lets bootstraps stop on SIGTERM before it kills them, and how long a crashed
// bootstrap waits before it is started again.
const (
	stopGrace      = 3 * time.Second
	restartBackoff = time.Second
)

// processSpec is one function's bootstrap and how to run it.
type processSpec struct {
	function string // Lambda function name
	binary   string
	env      []string
	logPath  string
}

// procExit reports a bootstrap that ended while the stack was running.
type procExit struct {
	function string
	logPath  string
	err      error
}

// supervisor runs the bootstrap processes. Each runs in its own process group (so that anything
// it starts, e.g. the child of `go run`, stops with it) and is started again if it exits, as
// Lambda replaces a crashed execution environment.
type supervisor struct {
	log   *slog.Logger
	exits chan procExit
	grace time.Duration // SIGTERM to SIGKILL

	mu       sync.Mutex
	stopping bool
	stopCh   chan struct{}
	running  map[*slot]*exec.Cmd
	pids     []int
	restarts int // processes started again after they exited
	files    []*os.File
	wg       sync.WaitGroup
}

type slot struct {
	spec  processSpec
	index int
}

var errStopping = errors.New("stack is stopping")

func newSupervisor(log *slog.Logger) *supervisor {
	return &supervisor{
		log:     log,
		exits:   make(chan procExit, 64),
		grace:   stopGrace,
		stopCh:  make(chan struct{}),
		running: map[*slot]*exec.Cmd{},
	}
}

// start runs n processes of spec, writing their output to spec.logPath (truncated first).
func (s *supervisor) start(spec processSpec, n int) error {
	if err := os.MkdirAll(filepath.Dir(spec.logPath), 0o755); err != nil {
		return fmt.Errorf("create log dir: %w", err)
	}

	logFile, err := os.OpenFile(spec.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open function log: %w", err)
	}

	s.mu.Lock()
	s.files = append(s.files, logFile)
	s.mu.Unlock()

	for i := range n {
		sl := &slot{spec: spec, index: i}

		cmd, err := s.spawn(sl, logFile)
		if err != nil {
			return fmt.Errorf("start %s process %d: %w", spec.function, i, err)
		}

		s.wg.Add(1)

		go s.watch(sl, cmd, logFile)
	}

	return nil
}

func (s *supervisor) spawn(sl *slot, logFile *os.File) (*exec.Cmd, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if s.stopping {
		return nil, errStopping
	}

	cmd := exec.Command(sl.spec.binary)
	cmd.Dir = filepath.Dir(sl.spec.binary)
	cmd.Env = append(slices.Clip(sl.spec.env), fmt.Sprintf("AWS_LAMBDA_LOG_STREAM_NAME=local/%s/%d", sl.spec.function, sl.index))
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	if err := cmd.Start(); err != nil {
		return nil, err
	}

	s.running[sl] = cmd
	s.pids = append(s.pids, cmd.Process.Pid)

	return cmd, nil
}

// watch waits for the slot's process and starts it again until the supervisor stops.
func (s *supervisor) watch(sl *slot, cmd *exec.Cmd, logFile *os.File) {
	defer s.wg.Done()

	for {
		err := cmd.Wait()

		s.mu.Lock()
		delete(s.running, sl)
		stopping := s.stopping
		s.mu.Unlock()

		if stopping {
			return
		}

		if err == nil {
			err = errors.New("exit status 0")
		}

		s.log.Warn("function process exited; starting it again",
			"function", sl.spec.function, "pid", cmd.Process.Pid, "error", err, "log", sl.spec.logPath)

		select {
		case s.exits <- procExit{function: sl.spec.function, logPath: sl.spec.logPath, err: err}:
		default: // nobody is waiting for startup any more
		}

		select {
		case <-s.stopCh:
			return
		case <-time.After(restartBackoff):
		}

		next, err := s.spawn(sl, logFile)
		if err != nil {
			if !errors.Is(err, errStopping) {
				s.log.Error("restart function process", "function", sl.spec.function, "error", err)
			}

			return
		}

		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()

		cmd = next
	}
}

// kill ends one running process of function with SIGKILL (its whole group), as an execution
// environment that crashes or is reclaimed mid-invocation; watch starts it again. pick chooses
// among the function's running processes (modulo their number). It returns the killed PID.
func (s *supervisor) kill(function string, pick int) (int, error) {
	s.mu.Lock()
	var pids []int
	for sl, cmd := range s.running {
		if sl.spec.function == function {
			pids = append(pids, cmd.Process.Pid)
		}
	}
	s.mu.Unlock()

	if len(pids) == 0 {
		return 0, fmt.Errorf("no running process of function %s", function)
	}

	slices.Sort(pids)
	pid := pids[pick%len(pids)]

	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill process group %d of %s: %w", pid, function, err)
	}

	return pid, nil
}

// counts returns how many processes of function run now, and how many processes of any
// function were started again after exiting.
func (s *supervisor) counts(function string) (running, restarts int) {
	s.mu.Lock()
	defer s.mu.Unlock()

	for sl := range s.running {
		if sl.spec.function == function {
			running++
		}
	}

	return running, s.restarts
}

// stop ends every process group: SIGTERM, then SIGKILL after stopGrace.
func (s *supervisor) stop() {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()

		return
	}

	s.stopping = true
	close(s.stopCh)

	groups := make([]int, 0, len(s.running))
	for _, cmd := range s.running {
		groups = append(groups, cmd.Process.Pid)
	}
	s.mu.Unlock()

	signalGroups(groups, syscall.SIGTERM)

	done := make(chan struct{})

	go func() {
		s.wg.Wait()
		close(done)
	}()

	select {
	case <-done:
	case <-time.After(s.grace):
		s.log.Warn("function processes did not stop on SIGTERM; killing them", "groups", groups)
		signalGroups(groups, syscall.SIGKILL)
		<-done
	}

	// The group leaders are gone; kill whatever they started that is still in their groups.
	signalGroups(groups, syscall.SIGKILL)

	s.mu.Lock()
	defer s.mu.Unlock()

	for _, f := range s.files {
		_ = f.Close()
	}

	s.files = nil
}

// startedPIDs returns the PID of every process the supervisor has started.
func (s *supervisor) startedPIDs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return slices.Clone(s.pids)
}

func signalGroups(pgids []int, sig syscall.Signal) {
	for _, pgid := range pgids {
		// ESRCH: the group is already empty.
		_ = syscall.Kill(-pgid, sig)
	}
}
