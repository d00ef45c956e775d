package quota

import (
	"slices"
	"sync"
	"time"
)

// Lambda's throttle reasons for synchronous invokes.
const (
	ReasonReserved = "ReservedFunctionConcurrentInvocationLimitExceeded"
	ReasonAccount  = "ConcurrentInvocationLimitExceeded"
)

// staleExecution is how long an execution that never reported its end (its process was
// killed) still counts: Lambda's longest timeout.
const staleExecution = 15 * time.Minute

// concurrency counts each function's executions: those running (seen on the runtime API, from
// the invocation handed to a bootstrap to its response or error), and the synchronous invokes
// admitted but not yet handed to one. It admits a synchronous invoke only under the function's
// reserved concurrency, or, without one, under the account's unreserved pool.
type concurrency struct {
	mu         sync.Mutex
	reserved   map[string]int
	unreserved int
	running    map[string]map[string]time.Time
	pending    map[string][]*syncInvoke
}

type syncInvoke struct{ fn string }

func newConcurrency(account int, fns []Function, limit func(float64) int) *concurrency {
	c := &concurrency{reserved: map[string]int{}, running: map[string]map[string]time.Time{}, pending: map[string][]*syncInvoke{}}
	sum := 0
	for _, f := range fns {
		if f.Reserved > 0 {
			c.reserved[f.Name] = limit(float64(f.Reserved))
			sum += c.reserved[f.Name]
		}
	}
	// AWS keeps 100 of the account's concurrency unreserved whatever the functions reserve.
	c.unreserved = max(account-sum, limit(100))
	return c
}

func (c *concurrency) inUse(fn string, now time.Time) int {
	for id, t := range c.running[fn] {
		if now.Sub(t) > staleExecution {
			delete(c.running[fn], id)
		}
	}
	return len(c.running[fn]) + len(c.pending[fn])
}

// admit admits a synchronous invoke of fn, or returns the reason Lambda throttles it.
func (c *concurrency) admit(fn string, now time.Time) (*syncInvoke, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.reserved[fn]; ok {
		if c.inUse(fn, now) >= r {
			return nil, ReasonReserved
		}
	} else {
		pool := 0
		for f := range c.names() {
			if _, ok := c.reserved[f]; !ok {
				pool += c.inUse(f, now)
			}
		}
		if pool >= c.unreserved {
			return nil, ReasonAccount
		}
	}
	inv := &syncInvoke{fn: fn}
	c.pending[fn] = append(c.pending[fn], inv)
	return inv, ""
}

func (c *concurrency) names() map[string]bool {
	out := map[string]bool{}
	for f := range c.running {
		out[f] = true
	}
	for f := range c.pending {
		out[f] = true
	}
	return out
}

// done ends a synchronous invoke's claim (its answer came back).
func (c *concurrency) done(inv *syncInvoke) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending[inv.fn] = slices.DeleteFunc(c.pending[inv.fn], func(p *syncInvoke) bool { return p == inv })
}

// started records an execution handed to a bootstrap. It takes the place of the oldest
// pending synchronous invoke: the runtime API does not say which invoke an execution serves,
// so an asynchronous one started meanwhile is, for a moment, counted in a synchronous one's
// place.
func (c *concurrency) started(fn, id string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running[fn] == nil {
		c.running[fn] = map[string]time.Time{}
	}
	c.running[fn][id] = now
	if len(c.pending[fn]) > 0 {
		c.pending[fn] = c.pending[fn][1:]
	}
}

// ended records an execution's response or error.
func (c *concurrency) ended(fn, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.running[fn], id)
}
