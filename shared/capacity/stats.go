package capacity

import (
	"context"
	"sync"
	"time"
)

// CallStats is what one call cost, by phase: the HTTP layer reports it (Server-Timing, the
// request log) so that a call's time and reads can be told apart without a profiler. The
// service fills the phases, the store the reads. A nil *CallStats ignores every method, so
// code that runs outside a request needs no check.
type CallStats struct {
	mu        sync.Mutex
	phases    map[string]time.Duration
	itemsRead int
	bytesRead int
	rounds    int
}

// Phases of a call, as CallStats names them.
const (
	PhaseAuth   = "auth"
	PhaseLimit  = "limit" // the key's rate limit
	PhaseRead   = "read"
	PhaseDecide = "decide"
	PhaseCommit = "commit"
	PhaseStart  = "start"
)

type callStatsKey struct{}

// WithCallStats returns a context that carries a new CallStats, and the CallStats.
func WithCallStats(ctx context.Context) (context.Context, *CallStats) {
	s := &CallStats{phases: map[string]time.Duration{}}
	return context.WithValue(ctx, callStatsKey{}, s), s
}

// CallStatsFrom returns the context's CallStats, or nil.
func CallStatsFrom(ctx context.Context) *CallStats {
	s, _ := ctx.Value(callStatsKey{}).(*CallStats)
	return s
}

// Since adds the time since start to a phase.
func (s *CallStats) Since(phase string, start time.Time) {
	if s == nil {
		return
	}
	d := time.Since(start)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phases[phase] += d
}

// AddRead counts items and bytes a store read returned.
func (s *CallStats) AddRead(items, bytes int) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.itemsRead += items
	s.bytesRead += bytes
}

// AddRound counts one read-decide-commit round.
func (s *CallStats) AddRound() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rounds++
}

// Snapshot is a copy of a CallStats' figures.
type Snapshot struct {
	Phases    map[string]time.Duration
	ItemsRead int
	BytesRead int
	Rounds    int
}

// Snapshot returns the figures so far (zero for nil).
func (s *CallStats) Snapshot() Snapshot {
	if s == nil {
		return Snapshot{Phases: map[string]time.Duration{}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Snapshot{Phases: make(map[string]time.Duration, len(s.phases)), ItemsRead: s.itemsRead, BytesRead: s.bytesRead, Rounds: s.rounds}
	for k, v := range s.phases {
		out.Phases[k] = v
	}
	return out
}
