package capacity_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// reported is an operation of two VMs bought by two orgs, committed at t0 with 90s of grace.
func reported(state capacity.OperationState, attempt int, outcomes map[string]capacity.VMOutcome) capacity.Operation {
	return capacity.Operation{
		ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: state, Attempt: attempt,
		VMIDs: []string{"vb", "va"}, UnitIDs: []string{"u1", "u2"}, Outcomes: outcomes,
		CreatedAt: t0, UpdatedAt: t0.Add(5 * time.Minute), TerminateAfter: t0.Add(90 * time.Second), OwnerOrgID: "owner",
		Victims: []capacity.Victim{{VMID: "va", OrgID: "buyer-a", UnitIDs: []string{"u1"}}, {VMID: "vb", OrgID: "buyer-b", UnitIDs: []string{"u2", "u3"}}},
	}
}

func ids(events []capacity.Event) []string {
	out := []string{}
	for _, e := range events {
		out = append(out, e.DetailType+" "+e.ID)
	}
	return out
}

func detailJSON(t *testing.T, e capacity.Event) string {
	t.Helper()
	b, err := json.Marshal(e.Detail)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEvictionNotices(t *testing.T) {
	at := t0.Add(2 * time.Minute)
	tests := []struct {
		name string
		op   capacity.Operation
		want []string
	}{
		{"every VM before any outcome", reported(capacity.OpPendingStart, 0, nil),
			[]string{"Spot VM Eviction Notice rcl_1/notice/vb", "Spot VM Eviction Notice rcl_1/notice/va"}},
		{"only VMs without a final outcome", reported(capacity.OpTerminating, 1, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: at, Attempt: 1}}),
			[]string{"Spot VM Eviction Notice rcl_1/notice/vb"}},
		{"a re-drive notifies its VM again, under the same id", reported(capacity.OpPendingStart, 2, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: at, Attempt: 1}, "vb": {Outcome: capacity.OutcomeFailed, At: at, Attempt: 1}}),
			[]string{"Spot VM Eviction Notice rcl_1/notice/vb"}},
		{"none once every VM has its outcome", reported(capacity.OpCompleted, 1, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: at, Attempt: 1}, "vb": {Outcome: capacity.OutcomeAlreadyGone, At: at, Attempt: 1}}),
			[]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			built(t, capacity.EvictionNotices, tt.op, tt.want)
		})
	}
	notice := capacity.EvictionNotices(reported(capacity.OpPendingStart, 0, nil))[0]
	want := `{"eventId":"rcl_1/notice/vb","orgId":"buyer-b","vmId":"vb","nodeId":"n1","unitIds":["u2","u3"],"reservationId":"r1",` +
		`"reclaimId":"rcl_1","reasonCode":"reclaimed-by-capacity-owner","terminateAfter":"2026-11-01T00:01:30Z"}`
	if got := detailJSON(t, notice); got != want {
		t.Errorf("detail\n got %s\nwant %s", got, want)
	}
	// An operation committed before grace and victims were recorded: no wait, ids only.
	legacy := reported(capacity.OpPendingStart, 0, nil)
	legacy.TerminateAfter, legacy.Victims = time.Time{}, nil
	d := capacity.EvictionNotices(legacy)[0].Detail.(capacity.EvictionNoticeDetail)
	if d.TerminateAfter != "2026-11-01T00:00:00Z" || d.VMID != "vb" || d.UnitIDs == nil {
		t.Errorf("legacy notice %+v", d)
	}
}

func TestOperationReport(t *testing.T) {
	a1, a2 := t0.Add(2*time.Minute), t0.Add(3*time.Minute)
	failedWithReason := reported(capacity.OpFailed, 2, nil)
	failedWithReason.Reason = "restarts exhausted"
	tests := []struct {
		name string
		op   capacity.Operation
		want []string
		end  string // the end event's detail JSON, if one
	}{
		{"nothing final yet", reported(capacity.OpTerminating, 1, nil), []string{}, ""},
		{"one of two final: no end yet", reported(capacity.OpTerminating, 1, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: a1, Attempt: 1}}),
			[]string{"Spot VM Terminated rcl_1/vm/va/1"}, ""},
		{"all final, end not yet written: ends as the outcomes say", reported(capacity.OpTerminating, 1, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: a1, Attempt: 1}, "vb": {Outcome: capacity.OutcomeAlreadyGone, At: a2}}),
			[]string{"Spot VM Terminated rcl_1/vm/va/1", "Spot VM Terminated rcl_1/vm/vb/1", "Reclaim Operation Completed rcl_1/end/1"},
			`{"eventId":"rcl_1/end/1","ownerOrgId":"owner","nodeId":"n1","reservationId":"r1","reclaimId":"rcl_1","state":"completed",` +
				`"vms":[{"vmId":"va","orgId":"buyer-a","outcome":"terminated"},{"vmId":"vb","orgId":"buyer-b","outcome":"already-gone"}],` +
				`"counts":{"terminated":1,"alreadyGone":1,"failed":0,"pending":0},"createdAt":"2026-11-01T00:00:00Z","endedAt":"2026-11-01T00:03:00Z"}`},
		{"a failure: failed, ended when written", reported(capacity.OpFailed, 1, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: a1, Attempt: 1}, "vb": {Outcome: capacity.OutcomeFailed, Error: "agent down", At: a2, Attempt: 1}}),
			[]string{"Spot VM Terminated rcl_1/vm/va/1", "Spot VM Terminated rcl_1/vm/vb/1", "Reclaim Operation Failed rcl_1/end/1"},
			`{"eventId":"rcl_1/end/1","ownerOrgId":"owner","nodeId":"n1","reservationId":"r1","reclaimId":"rcl_1","state":"failed",` +
				`"vms":[{"vmId":"va","orgId":"buyer-a","outcome":"terminated"},{"vmId":"vb","orgId":"buyer-b","outcome":"failed","error":"agent down"}],` +
				`"counts":{"terminated":1,"alreadyGone":0,"failed":1,"pending":0},"createdAt":"2026-11-01T00:00:00Z","endedAt":"2026-11-01T00:05:00Z"}`},
		{"failed with a reason, without outcomes", failedWithReason,
			[]string{"Reclaim Operation Failed rcl_1/end/2"},
			`{"eventId":"rcl_1/end/2","ownerOrgId":"owner","nodeId":"n1","reservationId":"r1","reclaimId":"rcl_1","state":"failed",` +
				`"reason":"restarts exhausted","vms":[{"vmId":"va","orgId":"buyer-a"},{"vmId":"vb","orgId":"buyer-b"}],` +
				`"counts":{"terminated":0,"alreadyGone":0,"failed":0,"pending":2},"createdAt":"2026-11-01T00:00:00Z","endedAt":"2026-11-01T00:05:00Z"}`},
		{"re-driven: the old failure is not final, no end", reported(capacity.OpTerminating, 2, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: a1, Attempt: 1}, "vb": {Outcome: capacity.OutcomeFailed, At: a2, Attempt: 1}}),
			[]string{"Spot VM Terminated rcl_1/vm/va/1"}, ""},
		{"re-driven and ended: the new outcome and end are new events", reported(capacity.OpCompleted, 2, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: a1, Attempt: 1}, "vb": {Outcome: capacity.OutcomeTerminated, At: a2, Attempt: 2}}),
			[]string{"Spot VM Terminated rcl_1/vm/va/1", "Spot VM Terminated rcl_1/vm/vb/2", "Reclaim Operation Completed rcl_1/end/2"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := built(t, capacity.OperationReport, tt.op, tt.want)
			if tt.end != "" {
				if got := detailJSON(t, got[len(got)-1]); got != tt.end {
					t.Errorf("end detail\n got %s\nwant %s", got, tt.end)
				}
			}
		})
	}
	vm := capacity.OperationReport(reported(capacity.OpTerminating, 1, map[string]capacity.VMOutcome{
		"vb": {Outcome: capacity.OutcomeFailed, Error: "dial tcp 10.0.0.7:443: refused", At: a1, Attempt: 1}}))[0]
	want := `{"eventId":"rcl_1/vm/vb/1","orgId":"buyer-b","vmId":"vb","nodeId":"n1","unitIds":["u2","u3"],"reservationId":"r1",` +
		`"reclaimId":"rcl_1","outcome":"failed","at":"2026-11-01T00:02:00Z"}`
	if got := detailJSON(t, vm); got != want { // no agent error: it names endpoints
		t.Errorf("detail\n got %s\nwant %s", got, want)
	}
}

// memOps is a ReportStore over operations in memory.
type memOps map[string]capacity.Operation

func (m memOps) EndOperation(_ context.Context, op capacity.Operation, state capacity.OperationState, now time.Time) error {
	got, ok := m[op.ID]
	if !ok || got.State != capacity.OpTerminating || got.CurrentAttempt() != op.CurrentAttempt() {
		return capacity.ErrConflict
	}
	got.State, got.UpdatedAt = state, now
	m[op.ID] = got
	return nil
}

func (m memOps) GetOperation(_ context.Context, _, id string) (*capacity.Operation, error) {
	op, ok := m[id]
	if !ok {
		return nil, capacity.Errorf(capacity.CodeNotFound, "no operation %s", id)
	}
	return &op, nil
}

func TestAnnouncer(t *testing.T) {
	ctx := context.Background()
	outage := errors.New("PutEvents: 1 of 2 entries failed: ThrottlingException")
	ops := memOps{
		"rcl_1": reported(capacity.OpTerminating, 2, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: t0, Attempt: 2}}),
		"rcl_final": reported(capacity.OpTerminating, 1, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: t0, Attempt: 1}, "vb": {Outcome: capacity.OutcomeTerminated, At: t0, Attempt: 1}}),
		"rcl_done": reported(capacity.OpCompleted, 1, map[string]capacity.VMOutcome{
			"va": {Outcome: capacity.OutcomeTerminated, At: t0, Attempt: 1}, "vb": {Outcome: capacity.OutcomeTerminated, At: t0, Attempt: 1}}),
	}
	for id, op := range ops {
		op.ID = id
		ops[id] = op
	}
	tests := []struct {
		name      string
		phase     string
		reclaimID string
		attempt   int
		err       error
		want      int                     // events published (and returned)
		wantErr   bool                    // the task fails (Step Functions retries it)
		calls     int                     // Publish calls
		state     capacity.OperationState // the operation's after
	}{
		{"notices of the current attempt", "notice", "rcl_1", 2, nil, 1, false, 1, capacity.OpTerminating},
		{"notices of an older attempt: none", "notice", "rcl_1", 1, nil, 0, false, 0, capacity.OpTerminating},
		{"notices of an ended operation: none to publish", "notice", "rcl_done", 1, nil, 0, false, 0, capacity.OpCompleted},
		{"notices not published: an error, none claimed", "notice", "rcl_1", 2, outage, 0, true, 1, capacity.OpTerminating},
		{"report of every VM final: published, then ended", "report", "rcl_final", 1, nil, 3, false, 1, capacity.OpCompleted},
		{"report of an ended operation: its report ended it, nothing", "report", "rcl_done", 1, nil, 0, false, 0, capacity.OpCompleted},
		{"report from an older attempt's task: the same events, no end", "report", "rcl_1", 1, nil, 1, false, 1, capacity.OpTerminating},
		{"report not published: an error, none claimed, not ended", "report", "rcl_final", 1, outage, 0, true, 1, capacity.OpTerminating},
		{"operation not found", "report", "rcl_gone", 1, nil, 0, true, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &capacitytest.Publisher{Err: tt.err}
			ops := maps.Clone(ops)
			a := &capacity.Announcer{Store: ops, Publisher: pub, Logger: quiet}
			run := a.Notify
			if tt.phase == "report" {
				run = a.Report
			}
			n, err := run(ctx, "n1", tt.reclaimID, tt.attempt)
			if (err != nil) != tt.wantErr || n != tt.want || pub.Calls() != tt.calls {
				t.Fatalf("published %d, err %v, %d calls; want %d, error %v, %d calls", n, err, pub.Calls(), tt.want, tt.wantErr, tt.calls)
			}
			if tt.err == nil && len(pub.Published()) != n {
				t.Errorf("%d events published, %d claimed", len(pub.Published()), n)
			}
			if tt.err != nil && !errors.Is(err, tt.err) {
				t.Errorf("error %v does not wrap the publisher's", err)
			}
			if got := ops[tt.reclaimID].State; got != tt.state {
				t.Errorf("operation %s after, want %s", got, tt.state)
			}
		})
	}
}

// built returns the events build makes of op, after checking their ids are want and that
// building them again gives the same events.
func built(t *testing.T, build func(capacity.Operation) []capacity.Event, op capacity.Operation, want []string) []capacity.Event {
	t.Helper()
	got := build(op)
	if !slices.Equal(ids(got), want) {
		t.Fatalf("events %v, want %v", ids(got), want)
	}
	if !reflect.DeepEqual(build(op), got) {
		t.Error("building the events again gave other events")
	}
	return got
}
