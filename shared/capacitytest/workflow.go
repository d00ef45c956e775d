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

// Workflow is Step Functions in memory: executions by name (capacity.ExecutionName), each
// started one in StartAs ("": running) until the test closes it. Its first FailStarts starts
// fail, as an outage would; a start of an execution it has is taken as started
// (ExecutionAlreadyExists).
type Workflow struct {
	FailStarts int
	StartAs    capacity.ExecutionStatus
	StatusErr  error // fails every Status call

	mu      sync.Mutex
	started []string                            // execution names, in start order
	calls   map[string]int                      // Start calls by execution name
	inputs  map[string][]string                 // VMs each execution was started for
	status  map[string]capacity.ExecutionStatus // by execution name
}

func (w *Workflow) Start(_ context.Context, op capacity.Operation) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	name := capacity.ExecutionName(op)
	if w.calls == nil {
		w.calls, w.inputs, w.status = map[string]int{}, map[string][]string{}, map[string]capacity.ExecutionStatus{}
	}
	w.calls[name]++
	if w.FailStarts > 0 {
		w.FailStarts--
		return errors.New("throttled")
	}
	if _, ok := w.status[name]; ok {
		return nil
	}
	w.started = append(w.started, name)
	w.inputs[name] = op.Unfinished()
	w.status[name] = capacity.ExecRunning
	if w.StartAs != "" {
		w.status[name] = w.StartAs
	}
	return nil
}

// StartChecked starts as Start does, but as Step Functions answers it: a start of an
// execution it has that is running is a success, of a closed one capacity.ErrExecutionExists;
// a start it fails (FailStarts) is capacity.ErrThrottled. Only a start of an execution it
// does not have counts in Calls.
func (w *Workflow) StartChecked(ctx context.Context, op capacity.Operation) error {
	w.mu.Lock()
	st, ok := w.status[capacity.ExecutionName(op)]
	w.mu.Unlock()
	switch {
	case ok && st.Closed():
		return capacity.ErrExecutionExists
	case ok:
		return nil
	}
	if err := w.Start(ctx, op); err != nil {
		return errors.Join(capacity.ErrThrottled, err)
	}
	return nil
}

func (w *Workflow) Status(_ context.Context, op capacity.Operation) (capacity.ExecutionStatus, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.StatusErr != nil {
		return "", w.StatusErr
	}
	if st, ok := w.status[capacity.ExecutionName(op)]; ok {
		return st, nil
	}
	return capacity.ExecNotFound, nil
}

// SetStatus ends (or revives) an execution as Step Functions would; "" forgets it, as Step
// Functions does past its history's retention.
func (w *Workflow) SetStatus(name string, st capacity.ExecutionStatus) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st == "" {
		delete(w.status, name)
		return
	}
	if w.status == nil {
		w.status = map[string]capacity.ExecutionStatus{}
	}
	w.status[name] = st
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
