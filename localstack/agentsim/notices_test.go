package agentsim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/agent"
)

// TestNoticesAsTheGuestReadsThem: a notice reaches a VM the node has once per reclaim (a
// repeat is answered, not recorded again), a VM the node lacks is a 404 unknown, and
// GET /_admin/notices shows each VM's notices as its guest reads them. With noticesUnsupported
// set over the admin API the agent answers as one that predates notices.
func TestNoticesAsTheGuestReadsThem(t *testing.T) {
	s, c := start(t)
	ctx := context.Background()
	mustAdd(t, s, "node-a", "vm-1", agent.StateRunning)
	mustAdd(t, s, "node-a", "vm-2", agent.StateRunning)
	req := agent.NoticeRequest{ReclaimID: "rcl_1", TerminateAfter: "2026-12-03T20:00:04Z", Reason: agent.NoticeReasonReclaim}
	for i := range 2 { // the second is a repeat
		if known, err := c.Notice(ctx, s.Endpoint("node-a"), "node-a", "vm-1", req); err != nil || !known {
			t.Fatalf("notice %d: %v, %v", i+1, known, err)
		}
	}
	if known, err := c.Notice(ctx, s.Endpoint("node-a"), "node-a", "vm-9", req); err != nil || known {
		t.Fatalf("notice of an unknown VM: %v, %v; want unknown", known, err)
	}
	resp, err := http.Get(s.URL() + "/_admin/notices?node=node-a")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var all []AdminNotices
	if err := json.Unmarshal(body, &all); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	want := time.Date(2026, 12, 3, 20, 0, 4, 0, time.UTC)
	byVM := map[string][]Notice{}
	for _, a := range all {
		byVM[a.VMID] = a.Notices
	}
	if n := byVM["vm-1"]; len(n) != 1 || !n[0].Time.Equal(want) || n[0].Action != "terminate" || n[0].ReclaimID != "rcl_1" || n[0].Reason != "reclaim" {
		t.Fatalf("vm-1's guest sees %+v", n)
	}
	if len(byVM["vm-2"]) != 0 || len(byVM["vm-9"]) != 0 {
		t.Fatalf("notices for VMs never told: %s", body)
	}

	resp, err = http.Post(s.URL()+"/_admin/faults", "application/json", strings.NewReader(`{"node":"node-a","noticesUnsupported":true}`))
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("set noticesUnsupported: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, err := c.Notice(ctx, s.Endpoint("node-a"), "node-a", "vm-2", req); !errors.Is(err, agent.ErrNoticeUnsupported) {
		t.Fatalf("old agent: %v, want %v", err, agent.ErrNoticeUnsupported)
	}
	if res, err := c.Terminate(ctx, s.Endpoint("node-a"), "node-a", "vm-2"); err != nil || res.AlreadyGone {
		t.Fatalf("old agent still terminates: %+v, %v", res, err)
	}
}
