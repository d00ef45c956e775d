// Package eventbus publishes the domain's events on an EventBridge bus: it implements
// capacity.Publisher with PutEvents, in batches within EventBridge's limits, retrying the
// entries EventBridge reports as failed.
package eventbus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/trace"
)

// EventBridge's limits on one PutEvents call.
const (
	MaxEntries = 10
	MaxBytes   = 256 * 1024
)

// timeBytes is what EventBridge counts for an entry's Time when it computes the entry's size.
const timeBytes = 14

// API is the part of the EventBridge client the publisher uses.
type API interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, optFns ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

// Publisher puts events on one bus with the source capacity.SourceCapacity.
type Publisher struct {
	Client  API
	BusName string
	// Retries bounds the rounds that re-send entries EventBridge failed (default 4). The
	// SDK's retryer already retries the call itself when it is throttled or fails; a
	// per-entry failure comes back in a successful answer and is retried here.
	Retries int
	// Backoff is the wait before retry round n (1, 2, ...); default 100ms doubling, with
	// jitter, at most 2s.
	Backoff func(n int) time.Duration
}

// New returns a publisher to the named bus.
func New(client *eventbridge.Client, busName string) *Publisher {
	return &Publisher{Client: client, BusName: busName}
}

var _ capacity.Publisher = (*Publisher)(nil)

// Publish puts every event on the bus or returns an error: all published, or an error naming
// what failed. A retry of Publish is safe: each event's detail carries a stable eventId by
// which consumers deduplicate.
func (p *Publisher) Publish(ctx context.Context, events []capacity.Event) error {
	entries := make([]types.PutEventsRequestEntry, 0, len(events))
	sizes := make([]int, 0, len(events))
	traceHeader := trace.Header(ctx)
	for _, e := range events {
		detail, err := json.Marshal(e.Detail)
		if err != nil {
			return fmt.Errorf("publish %s %s: encode detail: %w", e.DetailType, e.ID, err)
		}
		entry := types.PutEventsRequestEntry{
			EventBusName: aws.String(p.BusName),
			Source:       aws.String(capacity.SourceCapacity),
			DetailType:   aws.String(e.DetailType),
			Detail:       aws.String(string(detail)),
			Time:         aws.Time(e.Time.UTC()),
		}
		if traceHeader != "" {
			entry.TraceHeader = aws.String(traceHeader)
		}
		size := entrySize(entry)
		if size > MaxBytes {
			return fmt.Errorf("publish %s %s: the event is %d bytes, more than EventBridge's %d", e.DetailType, e.ID, size, MaxBytes)
		}
		entries, sizes = append(entries, entry), append(sizes, size)
	}
	for start := 0; start < len(entries); {
		end, total := start, 0
		for end < len(entries) && end-start < MaxEntries && total+sizes[end] <= MaxBytes {
			total += sizes[end]
			end++
		}
		if err := p.put(ctx, entries[start:end], events[start:end]); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// put sends one batch, re-sending the entries EventBridge failed, a bounded number of rounds.
func (p *Publisher) put(ctx context.Context, entries []types.PutEventsRequestEntry, events []capacity.Event) error {
	retries := p.Retries
	if retries <= 0 {
		retries = 4
	}
	for round := 0; ; round++ {
		out, err := p.Client.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries})
		if err != nil {
			return fmt.Errorf("put %d events on bus %s: %w", len(entries), p.BusName, err)
		}
		if out.FailedEntryCount == 0 {
			return nil
		}
		// Entries answer the request's entries in order; a failed one has an ErrorCode.
		var failed []types.PutEventsRequestEntry
		var failedEvents []capacity.Event
		var codes []string
		for i, res := range out.Entries {
			if i >= len(entries) || res.ErrorCode == nil {
				continue
			}
			failed, failedEvents = append(failed, entries[i]), append(failedEvents, events[i])
			codes = append(codes, fmt.Sprintf("%s %s: %s", events[i].DetailType, events[i].ID, *res.ErrorCode))
		}
		if len(failed) == 0 {
			// A count without codes: nothing tells which entry failed, so send all again.
			failed, failedEvents = entries, events
			codes = []string{fmt.Sprintf("%d entries failed without an error code", out.FailedEntryCount)}
		}
		if round >= retries {
			slices.Sort(codes)
			return fmt.Errorf("put events on bus %s: %d of %d failed after %d retries: %s",
				p.BusName, len(failed), len(entries), retries, strings.Join(codes, "; "))
		}
		if err := capacity.Sleep(ctx, p.backoff(round+1)); err != nil {
			return fmt.Errorf("put events on bus %s: %d failed (%s): %w", p.BusName, len(failed), strings.Join(codes, "; "), err)
		}
		entries, events = failed, failedEvents
	}
}

func (p *Publisher) backoff(n int) time.Duration {
	if p.Backoff != nil {
		return p.Backoff(n)
	}
	d := min(100*time.Millisecond<<(n-1), 2*time.Second)
	return d/2 + time.Duration(time.Now().UnixNano()%int64(d/2+1)) // jitter: spread retriers apart
}

// entrySize is an entry's size as EventBridge counts it against the call's 256 KB: its Time,
// Source, DetailType, Detail and Resources. The bus name and trace header are counted too,
// to stay on the safe side.
func entrySize(e types.PutEventsRequestEntry) int {
	n := 0
	if e.Time != nil {
		n += timeBytes
	}
	for _, s := range []*string{e.Source, e.DetailType, e.Detail, e.EventBusName, e.TraceHeader} {
		if s != nil {
			n += len(*s)
		}
	}
	for _, r := range e.Resources {
		n += len(r)
	}
	return n
}
