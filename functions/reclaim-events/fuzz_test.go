package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/emf"
)

// FuzzReclaimEvent delivers any message body (an EventBridge envelope and its detail: a
// reclaim request, a scheduled firing, a topology change) to the wired intake (event API,
// domain, store on the emulator, demo data). Whatever comes, nothing panics and Handle never
// fails the batch; a message that is no event goes back to the queue (its dead letters) and
// changes nothing; a refused request is published as refused and changes nothing; the store
// changes only with an outcome published as applied. `make fuzz` runs it for FUZZTIME.
func FuzzReclaimEvent(f *testing.F) {
	env := dynamotest.New(f)
	ctx := context.Background()
	if err := env.Store.Put(ctx, demo.Seed(time.Now())); err != nil {
		f.Fatal(err)
	}
	bus := &capacitytest.Publisher{}
	principals, err := capacity.ParseEventPrincipals(`[
		{"source":"openrelay.scheduler","orgId":"org-platform","operator":true,"permissions":["reservation.capacity"]},
		{"source":"example.tenant-automation","orgId":"org-owner","permissions":["reservation.capacity"]},
		{"source":"openrelay.fleet","orgId":"platform","operator":true,"permissions":["node.topology"]}]`)
	if err != nil {
		f.Fatal(err)
	}
	h := newHandler(env.Store, &capacitytest.Workflow{}, emf.New(io.Discard, "local"), bus, principals, slog.New(slog.NewJSONHandler(io.Discard, nil)))

	// Seeds: the sample events of events/ (requests and topology changes), and their usual breaks.
	files, err := filepath.Glob("../../events/bus-*.json")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
		f.Add([]byte(strings.Replace(string(raw), `"detail": {`, `"detail": {"extra": 1, `, 1)))
		f.Add([]byte(strings.Replace(string(raw), `"source": "`, `"source": "x`, 1)))
	}
	for _, s := range []string{``, `{}`, `null`, `[]`, `{"id":"e","source":"s"}`, `{"id":"e","source":"openrelay.scheduler","detail-type":"Capacity Reclaim Requested","detail":null}`} {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, body []byte) {
		before := env.Snapshot(t)
		bus.Take()
		resp, err := h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{{MessageId: "msg-1", Body: string(body)}}})
		if err != nil {
			t.Fatalf("Handle(%q): %v", body, err)
		}
		published := bus.Take()
		applied := false
		for _, e := range published {
			switch e.DetailType {
			case capacity.DetailReclaimCompleted, capacity.DetailTopologyApplied:
				applied = true
			}
		}
		retried := len(resp.BatchItemFailures) > 0
		if retried && len(published) > 0 {
			t.Fatalf("%q: published %v and delivered again", body, published)
		}
		if applied {
			return
		}
		if d := before.Diff(env.Snapshot(t)); d != "" {
			t.Fatalf("%q: not applied (retried %v, published %v) but the store changed:\n%s", body, retried, detailTypes(published), d)
		}
	})
}

func detailTypes(es []capacity.Event) []string {
	var out []string
	for _, e := range es {
		b, _ := json.Marshal(e.Detail)
		out = append(out, e.DetailType+" "+string(b))
	}
	return out
}
