package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

type recordingWorkflow struct {
	mu      sync.Mutex
	started []string
}

func (w *recordingWorkflow) Start(_ context.Context, op capacity.Operation) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.started = append(w.started, op.ID)
	return nil
}

// TestScheduledEvent runs events/reconciler-scheduled.json through the handler: an operation
// left pending-start is started, and the run is reported.
func TestScheduledEvent(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	env := dynamotest.New(t)
	if err := env.Store.Put(ctx, demo.Seed(time.Now().Add(-time.Hour))); err != nil {
		t.Fatal(err)
	}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	svc := &capacity.Service{Store: env.Store, Logger: quiet, Now: func() time.Time { return time.Now().Add(-time.Minute) }}
	res, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: demo.NodeID, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	wf := &recordingWorkflow{}
	r := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 30 * time.Second, StuckAfter: 15 * time.Minute, Logger: quiet}
	event, err := os.ReadFile("../../events/reconciler-scheduled.json")
	if err != nil {
		t.Fatal(err)
	}
	out, err := handler(r, quiet)(ctx, json.RawMessage(event))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.Started, []string{res.ReclaimID}) || !slices.Equal(wf.started, out.Started) || len(out.Stuck) != 0 {
		t.Fatalf("result = %+v, started = %v", out, wf.started)
	}
}
