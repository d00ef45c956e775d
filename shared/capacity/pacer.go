package capacity

import (
	"context"
	"errors"
	"sync"
	"time"
)

// pacer spaces calls at a steady rate shared by every caller (a token bucket of one: no
// burst, so a run never spends the account's whole bucket at once), and pushes the next call
// out, doubling, after a call the service throttled: the SDK's retryer already backed off
// within the call, so a throttle that reaches here means the rate is over the service's for
// now. A call that is not throttled resets the backoff. It runs on the wall clock: the
// Reconciler's Now is the domain's clock, which tests freeze.
type pacer struct {
	mu       sync.Mutex
	interval time.Duration // 0: unpaced
	base     time.Duration
	backoff  time.Duration
	next     time.Time
}

// maxPacerBackoff bounds the pause after repeated throttles.
const maxPacerBackoff = 5 * time.Second

func newPacer(perSecond float64, backoff time.Duration) *pacer {
	p := &pacer{base: backoff, backoff: backoff}
	if perSecond > 0 {
		p.interval = time.Duration(float64(time.Second) / perSecond)
	}
	return p
}

var errPastDeadline = errors.New("the run's time for starts is over")

// wait takes the next slot and sleeps until it; errPastDeadline if the slot is after stop.
func (p *pacer) wait(ctx context.Context, stop time.Time) error {
	p.mu.Lock()
	now := time.Now()
	slot := p.next
	if slot.Before(now) {
		slot = now
	}
	if slot.After(stop) {
		p.mu.Unlock()
		return errPastDeadline
	}
	p.next = slot.Add(p.interval)
	p.mu.Unlock()
	return Sleep(ctx, time.Until(slot))
}

// throttled pushes every caller's next slot out by the backoff, and doubles it.
func (p *pacer) throttled() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(p.backoff)
	p.backoff = min(2*p.backoff, maxPacerBackoff)
}

// ok resets the backoff after a call that was not throttled.
func (p *pacer) ok() {
	p.mu.Lock()
	p.backoff = p.base
	p.mu.Unlock()
}
