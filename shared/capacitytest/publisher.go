package capacitytest

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/openrelay/capacity/shared/capacity"
)

// ErrPublish is what a Publisher's failing call returns when it has no Err.
var ErrPublish = errors.New("put events: InternalFailure")

// Publisher is the event bus in memory: it records what it published. A failing call
// publishes nothing: every call fails with Err when set; else the first FailFirst calls fail
// with ErrPublish.
type Publisher struct {
	Err       error
	FailFirst int

	mu        sync.Mutex
	calls     int
	published []capacity.Event
}

func (p *Publisher) Publish(_ context.Context, events []capacity.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.Err != nil {
		return p.Err
	}
	if p.FailFirst > 0 {
		p.FailFirst--
		return ErrPublish
	}
	p.published = append(p.published, events...)
	return nil
}

// Published returns the events published, in order.
func (p *Publisher) Published() []capacity.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.published)
}

// Take returns the events published since the last Take, and forgets them.
func (p *Publisher) Take() []capacity.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	evs := p.published
	p.published = nil
	return evs
}

// Calls returns how many times Publish was called, failed calls included.
func (p *Publisher) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}
