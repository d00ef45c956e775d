package capacitytest

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/openrelay/capacity/shared/capacity"
)

// Agent is the nodes' agents in memory: it terminates any VM at the first call, but for the
// VMs the test makes fail. Maps are by VM id; nil maps make no VM fail.
type Agent struct {
	FailFirst map[string]int  // the VM's first calls fail, retryably
	Permanent map[string]bool // every call fails, not retryably
	Gone      map[string]bool // the agent no longer knows the VM

	mu    sync.Mutex
	calls map[string]int
}

// AgentError is an Agent's failure; Retryable tells the terminator whether a later call may
// succeed.
type AgentError struct{ Again bool }

func (e AgentError) Error() string   { return fmt.Sprintf("agent failed (retryable=%v)", e.Again) }
func (e AgentError) Retryable() bool { return e.Again }

func (a *Agent) Terminate(_ context.Context, _ capacity.Node, vmID string) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.calls == nil {
		a.calls = map[string]int{}
	}
	a.calls[vmID]++
	if a.Permanent[vmID] {
		return false, AgentError{Again: false}
	}
	if a.calls[vmID] <= a.FailFirst[vmID] {
		return false, AgentError{Again: true}
	}
	return a.Gone[vmID], nil
}

// Calls returns how many times the VM was asked to terminate.
func (a *Agent) Calls(vmID string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[vmID]
}

// AllCalls returns the terminate calls by VM.
func (a *Agent) AllCalls() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.calls)
}

// Total returns how many terminate calls the agents had, for all VMs.
func (a *Agent) Total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return sum(a.calls)
}

func sum(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}
