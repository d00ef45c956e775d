package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
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
			adapter := newAdapter(env.Store, nil, time.Minute, slog.New(slog.NewJSONHandler(io.Discard, nil)))
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
		})
	}
}
