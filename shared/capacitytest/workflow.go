// Package capacitytest holds in-memory stand-ins for the domain's ports (the termination
// workflow, the event bus, a node's agent, the API keys' lookup) and a settable clock, for the
// tests of every package that drives the domain. Each is safe for concurrent use.
package capacitytest

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/openrelay/capacity/shared/capacity"
)

// Workflow is Step Functions in memory: runs by execution name (capacity.ExecutionName). As a
// Standard machine (the default) a start of a name it has is taken as started, and
// StartChecked answers one the test closed with capacity.ErrExecutionExists; as an Express
// machine (Express) every start runs again. Its first FailStarts starts fail, as a throttle
// would. It cannot be asked what became of a run: neither can the reconciler.
type Workflow struct {
	FailStarts int
	Express    bool
	// StartClosed: every run closes at once without beginning its operation (its first step
	// keeps failing), as Close would.
	StartClosed bool

	mu      sync.Mutex
	started []string            // execution names, in start order (an Express name once per run)
	calls   map[string]int      // Start calls by execution name
	inputs  map[string][]string // VMs each execution was started for
	closed  map[string]bool     // runs the test closed, by name
}

func (w *Workflow) Start(_ context.Context, op capacity.Operation) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	name := capacity.ExecutionName(op)
	if w.calls == nil {
		w.calls, w.inputs, w.closed = map[string]int{}, map[string][]string{}, map[string]bool{}
	}
	w.calls[name]++
	if w.FailStarts > 0 {
		w.FailStarts--
		return errors.New("throttled")
	}
	if _, ok := w.inputs[name]; ok && !w.Express {
		return nil
	}
	w.started = append(w.started, name)
	w.inputs[name] = op.Unfinished()
	w.closed[name] = w.StartClosed
	return nil
}

// StartChecked starts as Start does, but as Step Functions answers it: on a Standard machine
// a start of an execution it has that runs is a success, of a closed one
// capacity.ErrExecutionExists; a start it fails (FailStarts) is capacity.ErrThrottled.
func (w *Workflow) StartChecked(ctx context.Context, op capacity.Operation) error {
	w.mu.Lock()
	_, ok := w.inputs[capacity.ExecutionName(op)]
	closed := w.closed[capacity.ExecutionName(op)]
	w.mu.Unlock()
	if ok && !w.Express {
		if closed {
			return capacity.ErrExecutionExists
		}
		return nil
	}
	if err := w.Start(ctx, op); err != nil {
		return errors.Join(capacity.ErrThrottled, err)
	}
	return nil
}

// Close ends the named run as Step Functions would (failed, timed out, aborted): on a
// Standard machine a later start of its name is refused.
func (w *Workflow) Close(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed == nil {
		w.calls, w.inputs, w.closed = map[string]int{}, map[string][]string{}, map[string]bool{}
	}
	w.closed[name] = true
}

// Started returns the names of the executions started, in start order.
func (w *Workflow) Started() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.started)
}

// Last returns the name of the last execution started, or "".
func (w *Workflow) Last() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.started) == 0 {
		return ""
	}
	return w.started[len(w.started)-1]
}

// Calls returns how many times the execution was asked to start, failed starts included.
func (w *Workflow) Calls(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls[name]
}

// Inputs returns the VMs the execution was started for.
func (w *Workflow) Inputs(name string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.inputs[name])
}
