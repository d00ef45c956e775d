package capacity_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// TestSleep: the one wait of the retries ends early with the context's error, and a wait of
// nothing on an ended context still reports it (a retry loop must not go round again).
func TestSleep(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want error
	}{
		{"nothing to wait", context.Background(), 0, nil},
		{"negative wait", context.Background(), -time.Second, nil},
		{"short wait", context.Background(), time.Millisecond, nil},
		{"nothing to wait, context ended", ended, 0, context.Canceled},
		{"long wait, context ended", ended, time.Hour, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := capacity.Sleep(c.ctx, c.d); !errors.Is(err, c.want) {
				t.Fatalf("Sleep(%v) = %v, want %v", c.d, err, c.want)
			}
		})
	}
}

// TestPauseEndsWithTheContext: a policy's pause is its wait, cut short by the context.
func TestPauseEndsWithTheContext(t *testing.T) {
	p := capacity.RetryPolicy{Base: time.Hour, Cap: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := p.Pause(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Pause = %v, want the context's deadline", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Pause took %v after its context ended", took)
	}
	if err := (capacity.RetryPolicy{Base: time.Millisecond, Cap: time.Millisecond}).Pause(context.Background(), 3); err != nil {
		t.Fatalf("Pause within its window = %v", err)
	}
}
