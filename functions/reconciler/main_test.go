package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/emf"
)

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
	wf := &capacitytest.Workflow{}
	r := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 30 * time.Second, StuckAfter: 15 * time.Minute, Logger: quiet}
	event, err := os.ReadFile("../../events/reconciler-scheduled.json")
	if err != nil {
		t.Fatal(err)
	}
	out, err := handler(r, emf.New(io.Discard, "local"))(ctx, json.RawMessage(event))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.Started, []string{res.ReclaimID}) || !slices.Equal(wf.Started(), out.Started) || len(out.Stuck) != 0 {
		t.Fatalf("result = %+v, started = %v", out, wf.Started())
	}
}

// An operation whose executions keep closing before their first round is restarted under new
// names, then failed: the run reports it and emits the ReclaimStartsExhausted metric.
func TestExhaustedRestartsAreAMetric(t *testing.T) {
	ctx := context.Background()
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	env := dynamotest.New(t)
	if err := env.Store.Put(ctx, demo.Seed(time.Now().Add(-time.Hour))); err != nil {
		t.Fatal(err)
	}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	wf := &capacitytest.Workflow{StartClosed: true} // every execution closes at once
	svc := &capacity.Service{Store: env.Store, Workflow: wf, Logger: logger, Now: func() time.Time { return time.Now().Add(-time.Minute) }}
	res, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: demo.NodeID, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	var metrics bytes.Buffer
	rec := emf.New(&metrics, "local")
	r := &capacity.Reconciler{Store: env.Store, Workflow: wf, StartAfter: 30 * time.Second, StuckAfter: 15 * time.Minute,
		MaxRestarts: 1, Logger: logger, Now: func() time.Time { return clock }}
	out, err := handler(r, rec)(ctx, nil)
	if err != nil || !slices.Equal(out.Restarted, []string{res.ReclaimID}) {
		t.Fatalf("first run: %+v, %v", out, err)
	}
	clock = clock.Add(time.Minute)
	metrics.Reset()
	out, err = handler(r, rec)(ctx, nil)
	if err != nil || !slices.Equal(out.Exhausted, []string{res.ReclaimID}) || len(out.Started) != 0 {
		t.Fatalf("second run: %+v, %v", out, err)
	}
	if !slices.Equal(wf.Started(), []string{res.ReclaimID, res.ReclaimID + "-2"}) {
		t.Fatalf("started %v", wf.Started())
	}
	var metric struct {
		Exhausted   int `json:"ReclaimStartsExhausted"`
		Environment string
		AWS         struct {
			CloudWatchMetrics []struct {
				Namespace string
				Metrics   []struct{ Name string }
			}
		} `json:"_aws"`
	}
	for line := range strings.Lines(metrics.String()) {
		if strings.Contains(line, `"_aws"`) {
			if err := json.Unmarshal([]byte(line), &metric); err != nil {
				t.Fatal(err)
			}
		}
	}
	declared := false
	for _, m := range metric.AWS.CloudWatchMetrics {
		for _, n := range m.Metrics {
			declared = declared || m.Namespace == "Capacity" && n.Name == "ReclaimStartsExhausted"
		}
	}
	if metric.Exhausted != 1 || !declared || metric.Environment != "local" {
		t.Fatalf("metric line = %+v in %s", metric, metrics.String())
	}
}

// TestReadSettings: the function reads exactly the variables envvar.Reconciler declares: an
// undeclared read, or a declared one left unread, would fail it at start.
func TestReadSettings(t *testing.T) {
	e := envvar.New(envvar.Reconciler, []string{"APP_ENV=dev", "LOG_LEVEL=info", "STATE_TABLE=s", "STATE_MACHINE_ARN=arn:sm", "EVENT_BUS_NAME=b", "HISTORY_RETENTION=2160h", "START_AFTER=1s", "STUCK_AFTER=15m", "HELD_AFTER=2h", "START_RATE=150"})
	if s := readSettings(e); e.Err() != nil || s.startAfter != time.Second || s.heldAfter != 2*time.Hour || s.startRate != 150 {
		t.Fatalf("settings %+v, error %v", s, e.Err())
	}
}
