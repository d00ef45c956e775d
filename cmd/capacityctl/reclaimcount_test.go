package main

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestReclaimByCount: --count plans with the service, shows its choice, asks, and reclaims
// exactly the chosen units with the plan's ETag in If-Match.
func TestReclaimByCount(t *testing.T) {
	args := []string{"reclaim", "--node", "node-1", "--reservation", "res-1", "--count", "2", "--reason", "training"}
	tests := []struct {
		name      string
		api       *fakeAPI
		answer    string // typed at the prompt; "": run with --yes
		code      int
		realUnits string // the units of the real reclaim ("": none sent)
		stdout    []string
		stderr    []string
	}{
		{"confirmed", &fakeAPI{etag: "e1", outcomes: []string{"terminated"}}, "y\n", 0, "[gpu-3 gpu-2]",
			[]string{"chose 2 units, least disruption first: gpu-3,gpu-2", "would terminate  vm-1,vm-2", "plan ETag        e1", "reclaim id       op-1"},
			[]string{"Proceed? [y/N] "}},
		{"--yes asks nothing", &fakeAPI{etag: "e1", outcomes: []string{"terminated"}}, "", 0, "[gpu-3 gpu-2]",
			[]string{"plan ETag        e1", "1/1 VMs done"}, nil},
		{"declined", &fakeAPI{etag: "e1"}, "n\n", 1, "", []string{"would terminate"}, []string{"not confirmed; nothing changed"}},
		{"the plan changed", &fakeAPI{etag: "e1", newPlan: true}, "", exitPlanChanged, "[gpu-3 gpu-2]",
			[]string{"plan ETag        e1", "plan ETag        e2"}, []string{"the plan changed since the dry run", "plan changed"}},
		{"too few units", &fakeAPI{etag: "e1", short: true}, "", 1, "",
			nil, []string{"plan a reclaim of 2 units", "2 units a reclaim can take"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.api
			run := args
			if tt.answer == "" {
				run = append(slices.Clip(args), "--yes")
			}
			runReclaim(t, f, tt.answer, run, tt.code, tt.stdout, tt.stderr)
			var real []string
			for _, c := range f.calls {
				if strings.HasPrefix(c, "POST ") && strings.HasSuffix(strings.Fields(c)[1], "/reclaim") {
					real = append(real, c)
				}
			}
			if tt.realUnits == "" {
				if len(real) != 0 {
					t.Fatalf("reclaims sent %q, want none", real)
				}
				return
			}
			if len(real) != 1 || strings.Fields(real[0])[2] != `"e1"` || fmt.Sprint(f.units) != tt.realUnits {
				t.Errorf("reclaims %q of %v, want one of %s with If-Match \"e1\"", real, f.units, tt.realUnits)
			}
		})
	}
}

// runReclaim runs capacityctl against f and checks its exit code and, in order, what it printed.
func runReclaim(t *testing.T, f *fakeAPI, stdin string, args []string, code int, stdout, stderr []string) {
	t.Helper()
	f.t = t
	api := httptest.NewServer(f)
	defer api.Close()
	got := runCLI(t, api, stdin, nil, args...)
	if got.code != code {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", got.code, code, got.stdout, got.err)
	}
	assertInOrder(t, "stdout", got.stdout, stdout)
	assertInOrder(t, "stderr", got.err, stderr)
}

func TestReclaimUnitsOrCount(t *testing.T) {
	for _, extra := range [][]string{nil, {"--units", "u", "--count", "2"}, {"--count", "-1"}, {"--count", "65"}} {
		got := runCLI(t, nil, "", nil, append([]string{"reclaim", "--node", "n", "--reservation", "r"}, extra...)...)
		if got.code != exitUsage || !strings.Contains(got.err, "--count") {
			t.Errorf("%v: exit %d, stderr %q; want a usage error naming --count", extra, got.code, got.err)
		}
	}
}
