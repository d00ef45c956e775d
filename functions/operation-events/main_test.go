package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/eventbus"
	"github.com/openrelay/capacity/shared/stepfn"
)

var quiet = slog.New(slog.NewJSONHandler(io.Discard, nil))

// bus answers PutEvents as EventBridge does, failing the first failEntries entries it is sent
// with a per-entry error in a successful answer (FailedEntryCount), which the SDK does not
// retry.
type bus struct {
	mu          sync.Mutex
	failEntries int
	calls       int
	accepted    []types.PutEventsRequestEntry
}

func (b *bus) PutEvents(_ context.Context, in *eventbridge.PutEventsInput, _ ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	out := &eventbridge.PutEventsOutput{}
	for _, e := range in.Entries {
		if b.failEntries > 0 {
			b.failEntries--
			out.FailedEntryCount++
			out.Entries = append(out.Entries, types.PutEventsResultEntry{ErrorCode: aws.String("ThrottlingException")})
			continue
		}
		b.accepted = append(b.accepted, e)
		out.Entries = append(out.Entries, types.PutEventsResultEntry{EventId: aws.String("e")})
	}
	return out, nil
}

// reclaimed commits a reclaim evicting two spot VMs, with grace, on a fresh store.
func reclaimed(t *testing.T) (*dynamo.Store, *capacity.CapacityResult) {
	t.Helper()
	ctx := context.Background()
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	env := dynamotest.New(t)
	err := env.Store.Put(ctx, dynamo.Seed{
		Nodes: []capacity.Node{{ID: "n1", OwnerOrgID: "owner", TopologyGen: 1, UnitIDs: []string{"u0", "u1", "u2"}, Version: 1}},
		Reservations: []capacity.Reservation{{ID: "r1", NodeID: "n1", ReservedUnitIDs: []string{"u0", "u1", "u2"},
			ReleasedUnitIDs: []string{"u1", "u2"}, StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 1, Version: 1}},
		VMs: []capacity.VM{
			{ID: "s1", NodeID: "n1", OrgID: "buyer-1", Tier: capacity.TierSpot, UnitIDs: []string{"u1"}, State: capacity.VMRunning, Version: 1},
			{ID: "s2", NodeID: "n1", OrgID: "buyer-2", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}, State: capacity.VMRunning, Version: 1},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := &capacity.Service{Store: env.Store, Logger: quiet, Now: func() time.Time { return t0.Add(time.Hour) }}
	owner := capacity.Principal{OrgID: "owner", Permissions: []string{capacity.PermCapacity}}
	res, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1", "u2"}, GraceSeconds: 60}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	return env.Store, res
}

func TestHandler(t *testing.T) {
	store, res := reclaimed(t)
	tests := []struct {
		name        string
		task        string // the task's input, as the state machine passes it
		failEntries int    // entries EventBridge fails
		want        int
		wantErr     bool
		wantTypes   []string
	}{
		{name: "notices", task: `{"phase":"notice","reclaimId":"%s","nodeId":"n1","attempt":1}`, want: 2,
			wantTypes: []string{capacity.DetailEvictionNotice, capacity.DetailEvictionNotice}},
		{name: "notices after a failed entry is re-sent", task: `{"phase":"notice","reclaimId":"%s","nodeId":"n1","attempt":1}`,
			failEntries: 1, want: 2, wantTypes: []string{capacity.DetailEvictionNotice, capacity.DetailEvictionNotice}},
		{name: "an entry that keeps failing fails the task", task: `{"phase":"notice","reclaimId":"%s","nodeId":"n1","attempt":1}`,
			failEntries: 100, wantErr: true},
		{name: "notices of an older attempt", task: `{"phase":"notice","reclaimId":"%s","nodeId":"n1","attempt":0}`, want: 2,
			wantTypes: []string{capacity.DetailEvictionNotice, capacity.DetailEvictionNotice}}, // 0 is the first attempt
		{name: "report before any outcome", task: `{"phase":"report","reclaimId":"%s","nodeId":"n1","attempt":1}`, want: 0},
		{name: "unknown phase", task: `{"phase":"later","reclaimId":"%s","nodeId":"n1","attempt":1}`, wantErr: true},
		{name: "unknown operation", task: `{"phase":"report","reclaimId":"rcl_none%.0s","nodeId":"n1","attempt":1}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &bus{failEntries: tt.failEntries}
			pub := &eventbus.Publisher{Client: b, BusName: "capacity-test", Backoff: func(int) time.Duration { return 0 }}
			h := handler(&capacity.Announcer{Store: store, Publisher: pub, Logger: quiet}, quiet)
			var task stepfn.EventsTask
			if err := json.Unmarshal(fmt.Appendf(nil, tt.task, res.ReclaimID), &task); err != nil {
				t.Fatal(err)
			}
			out, err := h(context.Background(), task)
			if (err != nil) != tt.wantErr || out.Published != tt.want {
				t.Fatalf("published %d, err %v; want %d, error %v", out.Published, err, tt.want, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			var types []string
			for _, e := range b.accepted {
				types = append(types, aws.ToString(e.DetailType))
				if aws.ToString(e.Source) != capacity.SourceCapacity || aws.ToString(e.EventBusName) != "capacity-test" {
					t.Errorf("entry source %s bus %s", aws.ToString(e.Source), aws.ToString(e.EventBusName))
				}
			}
			if !slices.Equal(types, tt.wantTypes) {
				t.Fatalf("published %v, want %v", types, tt.wantTypes)
			}
			if tt.want == 0 && b.calls != 0 {
				t.Errorf("%d PutEvents calls for nothing to publish", b.calls)
			}
			for _, e := range b.accepted { // a re-sent entry comes after the others
				var d capacity.EvictionNoticeDetail
				if err := json.Unmarshal([]byte(aws.ToString(e.Detail)), &d); err != nil {
					t.Fatal(err)
				}
				if d.VMID == "s1" && (d.EventID != res.ReclaimID+"/notice/s1" || d.OrgID != "buyer-1" || d.TerminateAfter != "2026-11-01T01:01:00Z") {
					t.Errorf("notice %+v", d)
				}
			}
		})
	}
}

// TestReadSettings: the function reads exactly the variables envvar.OperationEvents declares: an
// undeclared read, or a declared one left unread, would fail it at start.
func TestReadSettings(t *testing.T) {
	e := envvar.New(envvar.OperationEvents, []string{"APP_ENV=dev", "LOG_LEVEL=info", "STATE_TABLE=s", "EVENT_BUS_NAME=b"})
	if s := readSettings(e); e.Err() != nil || s.StateTable != "s" || s.eventBusName != "b" {
		t.Fatalf("settings %+v, error %v", s, e.Err())
	}
}

// TestHandlerRunsEveryPhase: the function runs every phase the workflow sends (stepfn.Phases,
// which infra's TestTerminationSendsEveryPhase ties to the state machine's tasks).
func TestHandlerRunsEveryPhase(t *testing.T) {
	store, res := reclaimed(t)
	pub := &eventbus.Publisher{Client: &bus{}, BusName: "capacity-test", Backoff: func(int) time.Duration { return 0 }}
	h := handler(&capacity.Announcer{Store: store, Publisher: pub, Logger: quiet}, quiet)
	for _, phase := range stepfn.Phases {
		if _, err := h(context.Background(), stepfn.EventsTask{Phase: phase, ReclaimID: res.ReclaimID, NodeID: "n1", Attempt: 1}); err != nil {
			t.Errorf("phase %q: %v", phase, err)
		}
	}
}
