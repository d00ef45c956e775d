package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/wire"
)

func TestConfirm(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"y\n", true}, {"yes\n", true}, {"Y\n", true}, {" YES \n", true}, {"y", true},
		{"n\n", false}, {"\n", false}, {"", false}, {"maybe\n", false}, {"no\ny\n", false},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		got, err := confirm(context.Background(), strings.NewReader(tt.in), &out, "Proceed? [y/N] ")
		if err != nil || got != tt.want {
			t.Errorf("answer %q: %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if !strings.HasPrefix(out.String(), "Proceed? [y/N] ") {
			t.Errorf("prompt %q", out.String())
		}
	}
}

// fakeAPI is the reclaim side of the API: a dry run, the real call with If-Match, and the
// operation, whose VMs get an outcome one per poll.
type fakeAPI struct {
	t        *testing.T
	mu       sync.Mutex
	etag     string   // the current plan's ETag
	newPlan  bool     // the plan changes between the dry run and the real call
	outcomes []string // the VMs' outcomes, revealed one per GET
	throttle int      // answer the real call 503 throttled this many times first
	// fail are the real call's first answers, in order: an HTTP status sent as API Gateway
	// sends it (no problem code), "hang" (no answer until the client gives up) or "cancel"
	// (Ctrl-C during the call: cancels the command's context, then no answer).
	fail     []string
	cancel   func()
	pollFail []int // the GETs' first answers: these statuses
	polls    int
	calls    []string // method path If-Match Idempotency-Key
	units    []any    // the unitIds of the last reclaim
	short    bool     // a reclaim plan is refused: the reservation has too few units
}

func (f *fakeAPI) plan(etag string) string {
	return fmt.Sprintf(`{"id":"res-1","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-2","gpu-3"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":["gpu-2","gpu-3"],"topologyGen":1,"wouldTerminate":["vm-1","vm-2"],"wouldSkip":[],"planEtag":%q}`, etag)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, strings.Join([]string{r.Method, r.URL.Path, r.Header.Get("If-Match"), r.Header.Get("Idempotency-Key")}, " "))
	switch {
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/reclaim-plan"):
		if f.short {
			w.WriteHeader(422)
			_, _ = io.WriteString(w, `{"status":422,"code":"insufficient_units","detail":"the reservation has 2 units a reclaim can take; 4 asked","available":2}`)
			return
		}
		w.Header().Set("ETag", `"`+f.etag+`"`)
		_, _ = io.WriteString(w, `{"count":2,"unitIds":["gpu-3","gpu-2"],`+strings.TrimPrefix(f.plan(f.etag), "{"))
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/reclaim"):
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.units, _ = body["unitIds"].([]any)
		if body["dryRun"] == true {
			w.Header().Set("ETag", `"`+f.etag+`"`)
			_, _ = io.WriteString(w, f.plan(f.etag))
			return
		}
		if len(f.fail) > 0 {
			next := f.fail[0]
			f.fail = f.fail[1:]
			switch next {
			case "hang", "cancel":
				if next == "cancel" {
					f.cancel()
				}
				f.mu.Unlock() // let the retry in while this request waits for its client to go
				<-r.Context().Done()
				f.mu.Lock()
			case "502":
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(502)
				_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
			default:
				var status int
				_, _ = fmt.Sscan(next, &status)
				w.WriteHeader(status)
				_, _ = fmt.Fprintf(w, `{"message":%q}`, http.StatusText(status))
			}
			return
		}
		if f.throttle > 0 {
			f.throttle--
			w.WriteHeader(503)
			_, _ = io.WriteString(w, `{"status":503,"code":"throttled","detail":"try again"}`)
			return
		}
		if f.newPlan {
			w.Header().Set("ETag", `"e2"`)
			w.WriteHeader(412)
			_, _ = io.WriteString(w, `{"status":412,"code":"plan_changed","detail":"the plan changed","plan":`+f.plan("e2")+`}`)
			return
		}
		if r.Header.Get("If-Match") != `"`+f.etag+`"` {
			f.t.Errorf("If-Match %q, want the dry run's ETag", r.Header.Get("If-Match"))
		}
		_, _ = io.WriteString(w, `{"id":"res-1","nodeId":"node-1","allowedOrgIds":["a"],"reservedUnitIds":["gpu-2","gpu-3"],"startsAt":"2026-01-01T00:00:00Z","status":"active","managingOrgIds":[],"releasedUnitIds":[],"topologyGen":1,"terminated":["vm-1","vm-2"],"skipped":[],"reclaimId":"op-1"}`)
	case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/reclaims/op-1"):
		if len(f.pollFail) > 0 {
			status := f.pollFail[0]
			f.pollFail = f.pollFail[1:]
			w.WriteHeader(status)
			_, _ = fmt.Fprintf(w, `{"message":%q}`, http.StatusText(status))
			return
		}
		f.polls++
		op := wire.OperationJSON{ID: "op-1", NodeID: "node-1", ReservationID: "res-1", State: "terminating", UnitIDs: []string{"gpu-2", "gpu-3"}, CreatedAt: "t"}
		known := min(f.polls-1, len(f.outcomes))
		for i, o := range f.outcomes {
			v := wire.VMOutcomeJSON{VMID: fmt.Sprintf("vm-%d", i+1), Outcome: "pending"}
			if i < known {
				v.Outcome = o
				if o == "failed" {
					v.Error = "agent said no"
				}
			}
			op.VMs = append(op.VMs, v)
		}
		if known == len(f.outcomes) {
			op.State = "completed"
		}
		_ = json.NewEncoder(w).Encode(op)
	default:
		w.WriteHeader(404)
	}
}

func TestReclaimFlow(t *testing.T) {
	args := []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2,gpu-3", "--reason", "training"}
	tests := []struct {
		name      string
		api       *fakeAPI
		stdin     string
		extra     []string
		code      int
		realCalls int      // real reclaim calls sent
		key       string   // their Idempotency-Key ("": one generated, capacityctl-…)
		stdout    []string // must appear, in order
		stderr    []string
	}{
		{"confirmed, all terminated", &fakeAPI{etag: "e1", outcomes: []string{"terminated", "already-gone"}}, "y\n", nil, 0, 1, "",
			[]string{"would terminate  vm-1,vm-2", `plan ETag        e1`, "reclaim id       op-1", "0/2 VMs done: 0 terminated, 0 already-gone, 0 failed",
				"1/2 VMs done: 1 terminated, 0 already-gone, 0 failed", "2/2 VMs done: 1 terminated, 1 already-gone, 0 failed"},
			[]string{"Proceed? [y/N] "}},
		{"--yes asks nothing", &fakeAPI{etag: "e1", outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 1, "",
			[]string{"1/1 VMs done: 1 terminated"}, nil},
		{"declined", &fakeAPI{etag: "e1"}, "n\n", nil, 1, 0, "", []string{"would terminate"}, []string{"not confirmed; nothing changed"}},
		{"no answer", &fakeAPI{etag: "e1"}, "", nil, 1, 0, "", nil, []string{"not confirmed"}},
		{"the plan changed", &fakeAPI{etag: "e1", newPlan: true}, "", []string{"--yes"}, 3, 1, "",
			[]string{"plan ETag        e1", "plan ETag        e2"}, []string{"the plan changed since the dry run", "plan changed"}},
		{"a VM failed", &fakeAPI{etag: "e1", outcomes: []string{"terminated", "failed"}}, "", []string{"--yes"}, 4, 1, "",
			[]string{"2/2 VMs done: 1 terminated, 0 already-gone, 1 failed"}, []string{"vm-2: agent said no", "1 VMs failed"}},
		{"throttled, retried with the same key", &fakeAPI{etag: "e1", throttle: 2, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 3, "",
			[]string{"1/1 VMs done"}, nil},
		{"API Gateway's 504, 429, 502 and 503 retried with the same key", &fakeAPI{etag: "e1", fail: []string{"504", "429", "502", "503"}, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 5, "",
			[]string{"1/1 VMs done"}, []string{"Idempotency-Key capacityctl-", "attempt 1 of 6: 504 Gateway Timeout", "attempt 4 of 6: 503"}},
		{"no answer within --timeout, retried with the same key", &fakeAPI{etag: "e1", fail: []string{"hang"}, outcomes: []string{"terminated"}}, "", []string{"--yes", "--timeout", "300ms"}, 0, 2, "",
			[]string{"reclaim id       op-1", "1/1 VMs done"}, []string{"Idempotency-Key capacityctl-", "attempt 1 of 6"}},
		{"no answer at all: the key and how to resume", &fakeAPI{etag: "e1", fail: []string{"504", "504", "504", "504", "504", "504"}}, "", []string{"--yes"}, 1, 6, "",
			nil, []string{"Idempotency-Key capacityctl-", "it may have been made", "capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2,gpu-3 --reason training --idempotency-key capacityctl-", "--yes", "no answer after 6 attempts"}},
		{"resumed with --idempotency-key", &fakeAPI{etag: "e1", outcomes: []string{"terminated"}}, "", []string{"--yes", "--idempotency-key", "capacityctl-earlier"}, 0, 1, "capacityctl-earlier",
			[]string{"idempotency key  capacityctl-earlier"}, []string{"Idempotency-Key capacityctl-earlier"}},
		{"a refusal is not retried", &fakeAPI{etag: "e1", fail: []string{"500"}}, "", []string{"--yes"}, 1, 1, "",
			nil, []string{"500 Internal Server Error"}},
		{"polls retried until they answer", &fakeAPI{etag: "e1", pollFail: []int{503, 500, 504, 429}, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 0, 1, "",
			[]string{"1/1 VMs done"}, nil},
		{"a poll answered 404 stops", &fakeAPI{etag: "e1", pollFail: []int{404}, outcomes: []string{"terminated"}}, "", []string{"--yes"}, 1, 1, "",
			nil, []string{"follow reclaim op-1: 404"}},
		{"polls failing until --wait runs out", &fakeAPI{etag: "e1", pollFail: slices.Repeat([]int{503}, 100000), outcomes: []string{"terminated"}}, "", []string{"--yes", "--wait", "50ms"}, exitWaitExpired, 1, "",
			nil, []string{"still running after 50ms", "last error", "503", "next: capacityctl reclaims wait --node node-1 --reservation res-1 --reclaim op-1 --endpoint "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.api
			runReclaim(t, f, tt.stdin, append(args, tt.extra...), tt.code, tt.stdout, tt.stderr)
			var real []string
			for _, c := range f.calls {
				if strings.HasPrefix(c, "POST ") && len(strings.Fields(c)) == 4 { // the dry run sends neither header
					real = append(real, c)
				}
			}
			if len(real) != tt.realCalls {
				t.Fatalf("real reclaim calls %q, want %d", real, tt.realCalls)
			}
			for _, c := range real {
				fs := strings.Fields(c)
				if fs[2] != `"e1"` || !strings.HasPrefix(fs[3], "capacityctl-") || fs[3] != strings.Fields(real[0])[3] || (tt.key != "" && fs[3] != tt.key) {
					t.Errorf("real call %q: want If-Match \"e1\" and one Idempotency-Key (%q) for every attempt", c, tt.key)
				}
			}
		})
	}
}

func TestReclaimJSONKeepsStdoutJSON(t *testing.T) {
	f := &fakeAPI{t: t, etag: "e1", outcomes: []string{"terminated"}}
	api := httptest.NewServer(f)
	defer api.Close()
	got := runCLI(t, api, "y\n", nil, "--output", "json", "reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.err)
	}
	docs := jsonDocs(t, got.stdout)
	if len(docs) != 3 || docs[0]["planEtag"] != "e1" || docs[1]["reclaimId"] != "op-1" || docs[2]["state"] != "completed" {
		t.Errorf("documents %v, want the plan, the reclaim and the final operation", docs)
	}
	assertInOrder(t, "stderr", got.err, []string{"Proceed? [y/N] ", "1/1 VMs done"})
}

// jsonDocs decodes stdout as a stream of JSON objects.
func jsonDocs(t *testing.T, stdout string) []map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	var docs []map[string]any
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("stdout is not a stream of JSON documents: %v\n%s", err, stdout)
		}
		docs = append(docs, m)
	}
	return docs
}

func assertInOrder(t *testing.T, name, s string, want []string) {
	t.Helper()
	rest := s
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Errorf("%s lacks %q (in order)\n%s", name, w, s)
			return
		}
		rest = rest[i+len(w):]
	}
}

// cancelOnRead is a terminal at the prompt when Ctrl-C comes: its read cancels the command's
// context (as the signal does) and then never returns, as a terminal read does not.
type cancelOnRead struct {
	cancel func()
	done   <-chan struct{}
}

func (r cancelOnRead) Read([]byte) (int, error) {
	r.cancel()
	<-r.done
	return 0, io.EOF
}

// TestReclaimInterrupted: Ctrl-C at the prompt aborts with nothing reclaimed; Ctrl-C during
// the real call prints the Idempotency-Key and the command that resumes the reclaim.
func TestReclaimInterrupted(t *testing.T) {
	args := []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--units", "gpu-2", "--reason", "make room", "--grace", "30"}
	t.Run("at the prompt", func(t *testing.T) {
		f := &fakeAPI{t: t, etag: "e1"}
		api := httptest.NewServer(f)
		defer api.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		testDone := make(chan struct{})
		defer close(testDone)
		got := make(chan result, 1)
		go func() { got <- runCLIWith(ctx, t, api, cancelOnRead{cancel, testDone}, nil, args...) }()
		select {
		case r := <-got:
			if r.code != exitFailed || !strings.Contains(r.err, "nothing was reclaimed") {
				t.Errorf("exit %d, stderr %q; want 1 and nothing was reclaimed", r.code, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Ctrl-C at the prompt did not stop the command")
		}
		for _, c := range f.calls {
			if len(strings.Fields(c)) == 4 {
				t.Errorf("real call %q sent", c)
			}
		}
	})
	t.Run("during the real call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := &fakeAPI{t: t, etag: "e1", fail: []string{"cancel"}, cancel: cancel}
		api := httptest.NewServer(f)
		defer api.Close()
		r := runCLIWith(ctx, t, api, strings.NewReader(""), nil, append(args, "--yes")...)
		if r.code != exitFailed {
			t.Errorf("exit %d, want 1", r.code)
		}
		var key string
		for _, c := range f.calls {
			if fs := strings.Fields(c); len(fs) == 4 {
				key = fs[3]
			}
		}
		if key == "" {
			t.Fatalf("no real call: %q", f.calls)
		}
		assertInOrder(t, "stderr", r.err, []string{"Idempotency-Key " + key, "it may have been made",
			"capacityctl reclaim --node node-1 --reservation res-1 --units gpu-2 --reason 'make room' --grace 30 --idempotency-key " + key + " --yes",
			"interrupted"})
	})
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{"gpu-1,gpu-2": "gpu-1,gpu-2", "": "''", "make room": "'make room'", "it's": `'it'\''s'`, "$(x)": "'$(x)'"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
