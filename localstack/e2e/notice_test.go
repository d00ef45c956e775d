package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/agentsim"
)

// reclaimVictimsWithGrace reclaims gpu-2, gpu-3 and gpu-0 of a demo node with the grace, which
// evicts vm-spot-1 and vm-spot-2, and returns the answer, its reclaim id and terminateAfter.
func reclaimVictimsWithGrace(t testing.TB, node string, grace int) (map[string]any, string, time.Time) {
	t.Helper()
	r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2", "gpu-3", "gpu-0"}, "graceSeconds": grace})
	if r.Status != http.StatusOK {
		t.Fatalf("reclaim: %d %s", r.Status, r.Body)
	}
	answer := r.json(t)
	reclaimID, _ := answer["reclaimId"].(string)
	terminateAfter, err := time.Parse(time.RFC3339, fmt.Sprint(answer["terminateAfter"]))
	if err != nil || reclaimID == "" {
		t.Fatalf("reclaim answer without reclaimId or terminateAfter: %s", r.Body)
	}
	return answer, reclaimID, terminateAfter
}

// guestNotices reads the VM's eviction notices from the agent as its guest would
// (GET /_admin/notices).
func guestNotices(t testing.TB, node, vm string) []agentsim.Notice {
	t.Helper()
	resp, err := http.Get(agents.URL() + "/_admin/notices?node=" + url.QueryEscape(node) + "&vmId=" + url.QueryEscape(vm))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var all []agentsim.AdminNotices
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /_admin/notices: %d, %v", resp.StatusCode, err)
	}
	if len(all) != 1 {
		return nil
	}
	return all[0].Notices
}

// vmNotices are the notice states the operation read shows, by VM.
func vmNotices(op map[string]any) map[string]string {
	out := map[string]string{}
	vms, _ := op["vms"].([]any)
	for _, v := range vms {
		vm, _ := v.(map[string]any)
		n, _ := vm["notice"].(map[string]any)
		out[fmt.Sprint(vm["vmId"])] = fmt.Sprint(n["state"])
	}
	return out
}

// TestGraceNoticeReachesTheAgentBeforeTermination: a reclaim with graceSeconds 4 tells each
// evicted VM's agent, signed, before any termination, the terminateAfter of the reclaim's
// answer, and the termination comes no earlier; the operation read shows each notice
// delivered. An agent that predates notices gets its terminations all the same, at the same
// time, and the operation shows its notices as unsupported.
func TestGraceNoticeReachesTheAgentBeforeTermination(t *testing.T) {
	for _, tc := range []struct {
		name       string
		oldAgent   bool
		wantNotice string
	}{
		{"agent with notices", false, "delivered"},
		{"agent that predates notices", true, "unsupported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := newNode(t, nil)
			agents.SetNoticesUnsupported(node, "", tc.oldAgent)
			_, reclaimID, terminateAfter := reclaimVictimsWithGrace(t, node, 4)
			op := awaitOperation(t, node, reclaimID, 60*time.Second)
			if op["state"] != "completed" {
				t.Fatalf("operation: %v", op)
			}
			states := vmNotices(op)
			for _, vm := range []string{"vm-spot-1", "vm-spot-2"} {
				if states[vm] != tc.wantNotice {
					t.Errorf("%s: operation shows notice %q, want %q", vm, states[vm], tc.wantNotice)
				}
				at := agents.TerminatedAt(node, vm)
				if at.IsZero() || at.Before(terminateAfter) {
					t.Errorf("%s: terminated at %s, want no earlier than terminateAfter %s", vm, at, terminateAfter)
				}
				got := guestNotices(t, node, vm)
				if tc.oldAgent {
					if len(got) != 0 {
						t.Errorf("%s: an agent without notices recorded %+v", vm, got)
					}
					continue
				}
				switch {
				case len(got) != 1:
					t.Errorf("%s: the guest sees %d notices, want 1", vm, len(got))
				case got[0].ReclaimID != reclaimID || !got[0].Time.Equal(terminateAfter) || got[0].Action != "terminate" || got[0].Reason != "reclaim":
					t.Errorf("%s: the guest sees %+v, want reclaim %s, terminate after %s", vm, got[0], reclaimID, terminateAfter)
				case !got[0].ReceivedAt.Before(at):
					t.Errorf("%s: notice received %s, not before its termination %s", vm, got[0].ReceivedAt, at)
				}
			}
		})
	}
}
