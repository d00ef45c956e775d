// Package quota models AWS's default service quotas in the local stack: token buckets of
// AWS's documented sizes and refill rates (Defaults), divided by a scale factor, applied by the
// stack's front proxy to every AWS call the functions make and every API request, and answered
// as AWS answers a throttle (the SDK's error, or the service's own delay). See docs/scale.md.
package quota

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// Bucket is a token bucket: it holds at most Size tokens and gains Rate a second. A request
// takes its cost; one that finds fewer tokens than it costs is throttled, except that a
// request costing more than the whole bucket passes on a full bucket (and leaves it in debt),
// so a scaled-down bucket smaller than one large item does not refuse it for ever.
type Bucket struct {
	mu     sync.Mutex
	size   float64
	rate   float64
	tokens float64
	last   time.Time
	now    func() time.Time
}

// NewBucket returns a full bucket.
func NewBucket(size, rate float64, now func() time.Time) *Bucket {
	if now == nil {
		now = time.Now
	}
	return &Bucket{size: size, rate: rate, tokens: size, last: now(), now: now}
}

// Size and Rate are the bucket's capacity and refill per second.
func (b *Bucket) Size() float64 { return b.size }
func (b *Bucket) Rate() float64 { return b.rate }

func (b *Bucket) refill() {
	t := b.now()
	if d := t.Sub(b.last).Seconds(); d > 0 {
		b.tokens = math.Min(b.size, b.tokens+d*b.rate)
	}
	b.last = t
}

// Take takes cost tokens if the bucket holds them and reports whether it did.
func (b *Bucket) Take(cost float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill()
	if !b.fits(cost) {
		return false
	}
	b.tokens -= cost
	return true
}

func (b *Bucket) fits(cost float64) bool {
	return b.tokens >= math.Min(cost, b.size)
}

// Reserve takes cost tokens now, going into debt if need be, and returns how long the caller
// must wait before its turn: what a service that delays rather than refuses does (EventBridge
// rule invocations, Scheduler invocations, Step Functions state transitions).
func (b *Bucket) Reserve(cost float64) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill()
	need := math.Min(cost, b.size)
	wait := time.Duration(0)
	if b.tokens < need && b.rate > 0 {
		wait = time.Duration((need - b.tokens) / b.rate * float64(time.Second))
	}
	b.tokens -= cost
	return wait
}

// takeAll takes costs[i] from buckets[i] only if every one of them holds its cost: the
// all-or-nothing check of a request charged to several partitions (a transaction, an item
// and its index entries). It returns the charges that did not fit, none if it took them. A
// bucket charged more than once (a table's warm throughput, by each item of a transaction)
// fails the charges that overflow it, in order, not the ones before.
func takeAll(buckets []*Bucket, costs []float64) (failed []int) {
	// Lock in a stable order (by address) so two requests over the same buckets cannot deadlock.
	unique := lockOrder(buckets)
	for _, b := range unique {
		b.mu.Lock()
	}
	defer func() {
		for _, b := range unique {
			b.mu.Unlock()
		}
	}()
	for _, b := range unique {
		b.refill()
	}
	owed := map[*Bucket]float64{}
	for i, b := range buckets {
		owed[b] += costs[i]
		if !b.fits(owed[b]) {
			failed = append(failed, i)
		}
	}
	if len(failed) > 0 {
		return failed
	}
	for i, b := range buckets {
		b.tokens -= costs[i]
	}
	return nil
}

// lockOrder returns the distinct buckets ordered by address.
func lockOrder(buckets []*Bucket) []*Bucket {
	unique := slices.Clone(buckets)
	addr := func(b *Bucket) uintptr { return uintptr(unsafe.Pointer(b)) }
	slices.SortFunc(unique, func(a, b *Bucket) int { return cmp.Compare(addr(a), addr(b)) })
	return slices.Compact(unique)
}
