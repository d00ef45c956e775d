package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// timedService records into the request's CallStats what a real service and store would: a
// read of 7 items (2048 bytes) taking 1.5 ms, a decision, a commit of 2.5 ms and a start, in
// one round (the durations are back-dated, so the total does not include them); then answers
// as the embedded fake does.
type timedService struct{ *fakeService }

func (s timedService) spend(ctx context.Context) {
	st := capacity.CallStatsFrom(ctx)
	st.AddRound()
	st.Since(capacity.PhaseRead, time.Now().Add(-1500*time.Microsecond))
	st.AddRead(7, 2048)
	st.Since(capacity.PhaseDecide, time.Now())
	st.Since(capacity.PhaseCommit, time.Now().Add(-2500*time.Microsecond))
	st.Since(capacity.PhaseStart, time.Now())
}

func (s timedService) Reclaim(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error) {
	s.spend(ctx)
	return s.fakeService.Reclaim(ctx, p, req, meta)
}

func (s timedService) GetReservation(ctx context.Context, p capacity.Principal, nodeID, reservationID string) (*capacity.Reservation, error) {
	s.spend(ctx)
	return s.fakeService.GetReservation(ctx, p, nodeID, reservationID)
}

// serverTimingEntry is one metric of a Server-Timing header.
type serverTimingEntry struct {
	dur  float64
	desc string
}

// parseServerTiming parses a Server-Timing header as a client would (W3C Server Timing):
// metrics in order, each with its dur and desc parameters.
func parseServerTiming(t *testing.T, h string) ([]string, map[string]serverTimingEntry) {
	t.Helper()
	var names []string
	out := map[string]serverTimingEntry{}
	for _, metric := range strings.Split(h, ",") {
		params := strings.Split(strings.TrimSpace(metric), ";")
		name := params[0]
		var e serverTimingEntry
		for _, p := range params[1:] {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok {
				t.Fatalf("Server-Timing %q: parameter %q has no value", h, p)
			}
			switch k {
			case "dur":
				d, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("Server-Timing %q: dur %q: %v", h, v, err)
				}
				e.dur = d
			case "desc":
				uq, err := strconv.Unquote(v)
				if err != nil {
					t.Fatalf("Server-Timing %q: desc %q is not a quoted string: %v", h, v, err)
				}
				e.desc = uq
			default:
				t.Fatalf("Server-Timing %q: unknown parameter %q", h, k)
			}
		}
		names = append(names, name)
		out[name] = e
	}
	return names, out
}

func TestServerTimingReportsTheCallsPhases(t *testing.T) {
	reclaimBody := `{"unitIds":["u2"]}`
	tests := []struct {
		name      string
		q         req
		svc       *fakeService
		wantNames []string // nil: no Server-Timing header
	}{
		{
			name:      "reclaim by the owner: durations only",
			q:         req{method: http.MethodPost, path: reclaimPath, body: reclaimBody},
			svc:       &fakeService{capacity: &capacity.CapacityResult{Reservation: reservation(nil, nil)}},
			wantNames: []string{"auth", "read", "decide", "commit", "start", "total"},
		},
		{
			name:      "reclaim by an operator: durations, items, bytes and rounds",
			q:         req{auth: ptr("Bearer " + secretOpNoVM), method: http.MethodPost, path: reclaimPath, body: reclaimBody},
			svc:       &fakeService{capacity: &capacity.CapacityResult{Reservation: reservation(nil, nil)}},
			wantNames: []string{"auth", "read", "decide", "commit", "start", "total", "items", "bytes", "rounds"},
		},
		{
			name:      "GET reservation",
			q:         req{method: http.MethodGet, path: reservationPath},
			svc:       &fakeService{res: ptr(reservation(nil, nil))},
			wantNames: []string{"auth", "read", "decide", "commit", "start", "total"},
		},
		{
			// A 404 carries the same headers whether or not the reservation exists.
			name: "not found: no header",
			q:    req{auth: ptr("Bearer " + secretOpNoVM), method: http.MethodPost, path: reclaimPath, body: reclaimBody},
			svc:  &fakeService{err: capacity.Errorf(capacity.CodeNotFound, "reservation r1 not found")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			h := &httpapi.Handler{
				Service: timedService{tt.svc},
				Auth:    &auth.Authenticator{Keys: testKeys(), TTL: time.Minute, Now: func() time.Time { return now }},
				Logger:  slog.New(slog.NewJSONHandler(&logs, nil)),
			}
			w := tt.q.do(t, h.Mux())
			header := w.Header().Get("Server-Timing")
			if tt.wantNames == nil {
				if header != "" {
					t.Errorf("status %d: Server-Timing = %q, want none", w.Code, header)
				}
			} else {
				if w.Code >= 400 {
					t.Fatalf("status %d: %s", w.Code, w.Body.String())
				}
				names, got := parseServerTiming(t, header)
				if strings.Join(names, ",") != strings.Join(tt.wantNames, ",") {
					t.Errorf("Server-Timing metrics = %v, want %v (header %q)", names, tt.wantNames, header)
				}
				if got["read"].dur < 1.5 || got["commit"].dur < 2.5 || got["total"].dur <= 0 {
					t.Errorf("Server-Timing %q: want read >= 1.5, commit >= 2.5 and a total", header)
				}
				if _, ok := got["items"]; ok && (got["items"].desc != "7" || got["bytes"].desc != "2048" || got["rounds"].desc != "1") {
					t.Errorf("Server-Timing %q: want items 7, bytes 2048, rounds 1", header)
				}
			}

			// The log line has every figure, whatever the answer.
			var line map[string]any
			if err := json.Unmarshal(bytes.TrimSpace(logs.Bytes()), &line); err != nil {
				t.Fatalf("log line: %v: %s", err, logs.String())
			}
			for _, k := range []string{"auth_ms", "read_ms", "decide_ms", "commit_ms", "start_ms", "items_read", "bytes_read", "rounds"} {
				if _, ok := line[k].(float64); !ok {
					t.Errorf("log line lacks number %q: %s", k, logs.String())
				}
			}
			if line["read_ms"].(float64) < 1.5 || line["items_read"] != 7.0 || line["bytes_read"] != 2048.0 || line["rounds"] != 1.0 {
				t.Errorf("log line figures: %s", logs.String())
			}
		})
	}
}
