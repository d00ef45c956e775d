package emf_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/emf/emftest"
	"github.com/openrelay/capacity/shared/trace"
)

var at = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

const traceID = "1-5759e988-bd862e3fe1be46a994272793"

// valid checks one line is CloudWatch embedded metric format, as CloudWatch reads it, and
// returns its metric values by name and its dimension sets.
func valid(t *testing.T, line string) (map[string]any, map[string]float64, [][]string) {
	t.Helper()
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("not JSON: %v: %s", err, line)
	}
	var meta struct {
		Timestamp         *int64
		CloudWatchMetrics []struct {
			Namespace  string
			Dimensions [][]string
			Metrics    []struct{ Name, Unit string }
		}
	}
	raw, _ := json.Marshal(rec["_aws"])
	if err := json.Unmarshal(raw, &meta); err != nil || meta.Timestamp == nil || len(meta.CloudWatchMetrics) != 1 {
		t.Fatalf("_aws = %s (%v)", raw, err)
	}
	if *meta.Timestamp != at.UnixMilli() {
		t.Errorf("Timestamp = %d, want %d (milliseconds)", *meta.Timestamp, at.UnixMilli())
	}
	values := map[string]float64{}
	var dims [][]string
	for _, d := range meta.CloudWatchMetrics {
		if d.Namespace != emf.Namespace {
			t.Errorf("namespace %q", d.Namespace)
		}
		for _, set := range d.Dimensions {
			if len(set) > 30 {
				t.Errorf("%d dimensions, at most 30", len(set))
			}
			for _, name := range set {
				if v, ok := rec[name].(string); !ok || v == "" {
					t.Errorf("dimension %s has value %#v, want a string", name, rec[name])
				}
			}
			dims = append(dims, set)
		}
		if len(d.Metrics) == 0 || len(d.Metrics) > 100 {
			t.Errorf("%d metrics", len(d.Metrics))
		}
		for _, m := range d.Metrics {
			v, ok := rec[m.Name].(float64)
			if !ok {
				t.Errorf("metric %s has value %#v, want a number", m.Name, rec[m.Name])
			}
			if m.Unit != emf.Count && m.Unit != emf.Milliseconds {
				t.Errorf("metric %s unit %q", m.Name, m.Unit)
			}
			values[m.Name] = v
		}
	}
	return rec, values, dims
}

func TestRecords(t *testing.T) {
	ctx := trace.WithHeader(context.Background(), "Root="+traceID+";Parent=53995c3f42cd8ad8;Sampled=1")
	op := capacity.Operation{ID: "rcl_1", NodeID: "n1", CreatedAt: at.Add(-1500 * time.Millisecond), State: capacity.OpTerminating,
		VMIDs: []string{"a"}, Outcomes: map[string]capacity.VMOutcome{"a": {Outcome: capacity.OutcomeTerminated}}}
	tests := []struct {
		name      string
		record    func(r *emf.Recorder)
		want      map[string]float64 // nil: no line
		dims      []string
		props     map[string]string
		requestID bool
	}{
		{"applied reclaim", func(r *emf.Recorder) {
			r.Call(ctx, capacity.CallOutcome{Action: capacity.ActionReclaim, RequestID: "req-1", Applied: true, Victims: 3})
		}, map[string]float64{"Reclaims": 1, "ReclaimVictims": 3}, []string{"Environment"}, map[string]string{"request_id": "req-1"}, true},
		{"reclaim evicting nobody", func(r *emf.Recorder) {
			r.Call(ctx, capacity.CallOutcome{Action: capacity.ActionReclaim, Applied: true})
		}, map[string]float64{"Reclaims": 1, "ReclaimVictims": 0}, []string{"Environment"}, nil, false},
		{"dry run", func(r *emf.Recorder) {
			r.Call(ctx, capacity.CallOutcome{Action: capacity.ActionReclaim, DryRun: true})
		}, map[string]float64{"ReclaimDryRuns": 1}, []string{"Environment"}, nil, false},
		{"refusal", func(r *emf.Recorder) {
			r.Call(ctx, capacity.CallOutcome{Action: capacity.ActionRelease, Refusal: capacity.CodeUnitsInUse})
		}, map[string]float64{"Refusals": 1}, []string{"Environment", "Action", "Code"}, map[string]string{"Action": "release", "Code": "units_in_use"}, false},
		{"replay", func(r *emf.Recorder) {
			r.Call(ctx, capacity.CallOutcome{Action: capacity.ActionReclaim, Replayed: true})
		}, nil, nil, nil, false},
		{"failure", func(r *emf.Recorder) { r.Call(ctx, capacity.CallOutcome{Action: capacity.ActionReclaim}) }, nil, nil, nil, false},
		{"applied placement", func(r *emf.Recorder) {
			r.Call(ctx, capacity.CallOutcome{Action: capacity.ActionPlace, Applied: true})
		}, nil, nil, nil, false},
		{"operation ended", func(r *emf.Recorder) { r.OperationEnded(ctx, op, at) },
			map[string]float64{"ReclaimTerminationTime": 1500}, []string{"Environment"}, map[string]string{"reclaim_id": "rcl_1", "state": "completed"}, false},
		{"reconciler run", func(r *emf.Recorder) {
			r.Reconciled(ctx, &capacity.ReconcileReport{Started: []string{"a", "b"}, Restarted: []string{"b"}, Stuck: []capacity.Operation{op}, Reported: []string{"c"},
				Held: []capacity.Operation{{ID: "rcl_h1", VMIDs: []string{"v1", "v2"}}, {ID: "rcl_h2", VMIDs: []string{"v3"}}}})
		}, map[string]float64{"StartedReclaimOperations": 2, "RestartedReclaimOperations": 1, "StartFailedReclaimOperations": 0,
			"EndedByReconciler": 0, "ReportedByReconciler": 1, "ReclaimStartsExhausted": 0, "StuckReclaimOperations": 1, "HeldReclaimOperations": 2, "HeldVMs": 3},
			[]string{"Environment"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			r := emf.New(&out, "staging")
			r.Now = func() time.Time { return at }
			tt.record(r)
			if tt.want == nil {
				if out.Len() != 0 {
					t.Fatalf("wrote %s, want nothing", out.String())
				}
				return
			}
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(lines) != 1 {
				t.Fatalf("%d lines, want 1: %s", len(lines), out.String())
			}
			rec, values, dims := valid(t, lines[0])
			if fmt.Sprint(values) != fmt.Sprint(tt.want) {
				t.Errorf("metrics = %v, want %v", values, tt.want)
			}
			if fmt.Sprint(dims) != fmt.Sprint([][]string{tt.dims}) {
				t.Errorf("dimensions = %v, want [%v]", dims, tt.dims)
			}
			if rec["Environment"] != "staging" || rec["trace_id"] != traceID {
				t.Errorf("Environment = %v, trace_id = %v", rec["Environment"], rec["trace_id"])
			}
			for k, v := range tt.props {
				if rec[k] != v {
					t.Errorf("%s = %v, want %s", k, rec[k], v)
				}
			}
			if _, ok := rec["request_id"]; ok != tt.requestID {
				t.Errorf("request_id present = %v, want %v", ok, tt.requestID)
			}
		})
	}
}

func TestNoTraceNoTraceID(t *testing.T) {
	t.Setenv("_X_AMZN_TRACE_ID", "")
	var out bytes.Buffer
	emf.New(&out, "").Call(context.Background(), capacity.CallOutcome{Action: capacity.ActionReclaim, DryRun: true})
	var rec map[string]any
	if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
		t.Fatal(err)
	}
	if _, ok := rec["trace_id"]; ok || rec["Environment"] != "unknown" {
		t.Errorf("record = %v: want no trace_id, Environment unknown", rec)
	}
}

// Concurrent records are whole lines: each decodes on its own.
func TestConcurrentRecordsDoNotInterleave(t *testing.T) {
	var out bytes.Buffer
	r := emf.New(&out, "dev")
	r.Now = func() time.Time { return at }
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			r.Call(context.Background(), capacity.CallOutcome{Action: capacity.ActionReclaim, Applied: true, Victims: i})
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 50 {
		t.Fatalf("%d lines, want 50", len(lines))
	}
	for _, l := range lines {
		valid(t, l)
	}
}

// TestMetricNames: MetricNames are exactly the metrics the Recorder writes, so that the
// stack's alarms and dashboard, which name them from there, cannot name one never written.
func TestMetricNames(t *testing.T) {
	var out bytes.Buffer
	r := emf.New(&out, "staging")
	r.Now = func() time.Time { return at }
	emftest.WriteEveryKind(context.Background(), r)
	written := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		_, values, _ := valid(t, line)
		for name := range values {
			written[name] = true
		}
	}
	listed := map[string]bool{}
	for _, name := range emf.MetricNames {
		listed[name] = true
	}
	if fmt.Sprint(written) != fmt.Sprint(listed) {
		t.Errorf("written %v, MetricNames %v", written, listed)
	}
}
