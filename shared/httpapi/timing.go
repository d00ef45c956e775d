package httpapi

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// timedPhases are the phases a call's Server-Timing header and log line report, in call order.
var timedPhases = []string{capacity.PhaseAuth, capacity.PhaseLimit, capacity.PhaseRead, capacity.PhaseDecide, capacity.PhaseCommit, capacity.PhaseStart}

// serverTiming renders a call's figures as a Server-Timing header (W3C Server Timing): each
// recorded phase as `<phase>;dur=<ms>`, then `total;dur=<ms>` (the handler's whole time, so
// that a client can tell the gateway's and the runtime's share from ours). With counts, also
// `items;desc="<n>"`, `bytes;desc="<n>"` and `rounds;desc="<n>"`: metrics without a duration,
// which standard parsers (browsers' PerformanceServerTiming, DevTools) accept as such.
func serverTiming(s capacity.Snapshot, total time.Duration, counts bool) string {
	var parts []string
	for _, ph := range timedPhases {
		if d, ok := s.Phases[ph]; ok {
			parts = append(parts, ph+";dur="+msString(d))
		}
	}
	parts = append(parts, "total;dur="+msString(total))
	if counts {
		parts = append(parts,
			`items;desc="`+strconv.Itoa(s.ItemsRead)+`"`,
			`bytes;desc="`+strconv.Itoa(s.BytesRead)+`"`,
			`rounds;desc="`+strconv.Itoa(s.Rounds)+`"`)
	}
	return strings.Join(parts, ", ")
}

// timingAttrs are the same figures for the request's log line: every phase (0 when the call
// did not reach it), the reads and the rounds.
func timingAttrs(s capacity.Snapshot) []any {
	attrs := make([]any, 0, len(timedPhases)+3)
	for _, ph := range timedPhases {
		attrs = append(attrs, slog.Float64(ph+"_ms", msFloat(s.Phases[ph])))
	}
	return append(attrs, slog.Int("items_read", s.ItemsRead), slog.Int("bytes_read", s.BytesRead), slog.Int("rounds", s.Rounds))
}

func msFloat(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func msString(d time.Duration) string { return strconv.FormatFloat(msFloat(d), 'f', 3, 64) }

// statusRecorder remembers the status written, for the request log, and adds the call's
// Server-Timing header to a successful answer as it goes out.
//
// Timings are public on purpose: durations tell a caller nothing its own clock does not, and
// they let anyone tell our time from the network's. They go on successful answers only: a
// 404 must carry the same headers whether or not the resource exists, and the phases reached
// (and the items read) would tell them apart. Items, bytes and rounds go to operators only:
// they count the node's live VMs and reservations, other orgs' business. The log line always
// has everything.
type statusRecorder struct {
	http.ResponseWriter
	status int
	stats  *capacity.CallStats
	start  time.Time
	counts bool // the caller may see items, bytes and rounds
	wrote  bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote && code < http.StatusBadRequest {
		s.Header().Set("Server-Timing", serverTiming(s.stats.Snapshot(), time.Since(s.start), s.counts))
	}
	s.wrote = true
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Write sends the implicit 200 through WriteHeader, so that it gets its timing too.
func (s *statusRecorder) Write(b []byte) (int, error) {
	if !s.wrote {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}
