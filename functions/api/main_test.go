package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/emf"
)

// TestSampleEvents runs each sample API Gateway event in events/ through the wired function
// (adapter, API, domain, store on the emulator, demo data), as `make invoke` would send it.
func TestSampleEvents(t *testing.T) {
	want := map[string]int{
		"api-reclaim-dry-run.json":       200,
		"api-reclaim.json":               200,
		"api-release.json":               200,
		"api-get-reservation.json":       200,
		"api-place-spot-vm.json":         201,
		"api-reclaim-typo-rejected.json": 400,
		"api-reclaim-no-permission.json": 404,
	}
	files, err := filepath.Glob("../../events/api-*.json")
	if err != nil || len(files) != len(want) {
		t.Fatalf("sample events = %v (%v); want one per case in this test", files, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			env := dynamotest.New(t)
			if err := env.Store.Put(context.Background(), demo.Seed(time.Now())); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var ev events.APIGatewayProxyRequest
			if err := json.Unmarshal(raw, &ev); err != nil {
				t.Fatal(err)
			}
			var metrics bytes.Buffer
			adapter := newAdapter(env.Store, nil, nil, emf.New(&metrics, "local"), time.Minute, slog.New(slog.NewJSONHandler(io.Discard, nil)))
			resp, err := adapter.ProxyWithContext(context.Background(), ev)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != want[filepath.Base(file)] {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, want[filepath.Base(file)], resp.Body)
			}
			if !json.Valid([]byte(resp.Body)) {
				t.Fatalf("body is not JSON: %s", resp.Body)
			}
			if filepath.Base(file) == "api-reclaim.json" {
				// The reclaim's metrics, under API Gateway's request id.
				var line struct {
					Reclaims, ReclaimVictims *float64
					RequestID                string `json:"request_id"`
				}
				if err := json.Unmarshal(metrics.Bytes(), &line); err != nil || line.Reclaims == nil || *line.Reclaims != 1 ||
					line.ReclaimVictims == nil || line.RequestID == "" || line.RequestID != ev.RequestContext.RequestID {
					t.Fatalf("metrics line %s (%v), want Reclaims 1 under request id %q", metrics.String(), err, ev.RequestContext.RequestID)
				}
			}
		})
	}
}

func TestSchedulerFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name             string
		group, role, bus string
		want             bool // a scheduler
		wantErr          bool
	}{
		{"none: scheduling unavailable", "", "", "", false, false},
		{"all three", "capacity-test", "arn:aws:iam::1:role/r", "arn:aws:events:us-east-1:1:event-bus/capacity-test", true, false},
		{"no bus", "capacity-test", "arn:aws:iam::1:role/r", "", false, true},
		{"only the group", "capacity-test", "", "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SCHEDULE_GROUP", tc.group)
			t.Setenv("SCHEDULE_ROLE_ARN", tc.role)
			t.Setenv("EVENT_BUS_ARN", tc.bus)
			s, err := schedulerFromEnv(aws.Config{Region: "us-east-1"})
			if (err != nil) != tc.wantErr || (s != nil) != tc.want {
				t.Fatalf("scheduler %v, err %v", s, err)
			}
		})
	}
}
