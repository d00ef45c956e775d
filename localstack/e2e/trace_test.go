package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// traceIDPattern is an X-Ray trace id, the Root of a trace header.
var traceIDPattern = regexp.MustCompile(`^1-[0-9a-f]{8}-[0-9a-f]{24}$`)

// functionLog returns the path of the log the local stack writes for the function whose
// logical name ends in name (its stdout: log lines and metric lines), or skips the test on a
// stack this process did not start.
func functionLog(t *testing.T, name string) string {
	t.Helper()
	if os.Getenv("CAPACITY_OUTPUTS") != "" {
		t.Skip("function logs are read from the local stack this test starts")
	}
	paths, err := filepath.Glob(filepath.Join("..", "..", "build", "local", "logs", "*-"+name+".log"))
	if err != nil || len(paths) != 1 {
		t.Fatalf("log of function %s: %v (%v)", name, paths, err)
	}
	return paths[0]
}

// jsonLines returns the JSON object lines of a log for which keep holds.
func jsonLines(t *testing.T, path string, keep func(map[string]any) bool) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && keep(line) {
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitForLines polls a function's log until want holds of the lines keep selects, or fails
// at the deadline.
func waitForLines(t *testing.T, path string, keep func(map[string]any) bool, want func([]map[string]any) bool) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines := jsonLines(t, path, keep)
		if want(lines) {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: lines %v", path, lines)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A reclaim through the API is one trace: every log line the api function wrote for it
// carries the invocation's trace id, and so does its metric line (Reclaims 1 with its
// victims); the operation it started reports how long it took when its Report step ends it.
func TestReclaimLogsAndMetricsCarryTheTrace(t *testing.T) {
	apiLog, eventsLog := functionLog(t, "api"), functionLog(t, "operation-events")
	node := newNode(t, nil)
	r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2", "gpu-3"}})
	if r.Status != http.StatusOK {
		t.Fatalf("reclaim: %d %s", r.Status, r.Body)
	}
	body := r.json(t)
	victims := len(strs(body["terminated"]))
	reqID := r.Header.Get("X-Request-Id")
	if reqID == "" || victims == 0 {
		t.Fatalf("request id %q, answer %s", reqID, r.Body)
	}

	ofCall := func(l map[string]any) bool { return l["request_id"] == reqID }
	lines := waitForLines(t, apiLog, ofCall, func(ls []map[string]any) bool {
		var request, metric bool
		for _, l := range ls {
			request = request || l["msg"] == "request"
			metric = metric || l["_aws"] != nil
		}
		return request && metric
	})
	traceID, _ := lines[0]["trace_id"].(string)
	if !traceIDPattern.MatchString(traceID) {
		t.Fatalf("trace_id %q in %v", traceID, lines[0])
	}
	// Every line of the invocation: those naming the call, and any other with its trace id.
	all := jsonLines(t, apiLog, func(l map[string]any) bool { return ofCall(l) || l["trace_id"] == traceID })
	var metric map[string]any
	for _, l := range all {
		if l["trace_id"] != traceID {
			t.Errorf("line without the call's trace id %s: %v", traceID, l)
		}
		if l["_aws"] != nil {
			metric = l
		}
	}
	if metric["Reclaims"] != 1.0 || metric["ReclaimVictims"] != float64(victims) || metric["Environment"] != "local" {
		t.Errorf("metric line %v, want Reclaims 1, ReclaimVictims %d, Environment local", metric, victims)
	}

	// The Report step ends the operation and reports how long it took, once.
	ended := waitForLines(t, eventsLog, func(l map[string]any) bool {
		return l["reclaim_id"] == body["reclaimId"] && l["_aws"] != nil
	}, func(ls []map[string]any) bool { return len(ls) > 0 })
	if ms, ok := ended[0]["ReclaimTerminationTime"].(float64); !ok || ms < 0 || len(ended) != 1 {
		t.Errorf("termination time lines %v", ended)
	}
}
