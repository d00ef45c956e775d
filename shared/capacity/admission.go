package capacity

import "context"

// Admission is the rate limiter's answer for one call, which may still be coming. A call
// whose route overlaps the limiter with its decision read (the HTTP layer starts the limiter
// and carries the Admission in the context) reads while the limiter writes, then waits here
// before anything else (commitRounds, right after each read): a refused call answers 429
// and writes nothing, its read discarded, and an admitted one pays max(read, limiter) rather
// than their sum.
type Admission struct {
	done chan struct{}
	err  error
}

// StartAdmission runs admit concurrently (RateLimiter.Admit for the call) and returns its
// Admission. Its Wait must be called before the call answers, so that admit ends within it.
func StartAdmission(admit func() error) *Admission {
	a := &Admission{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.err = admit()
	}()
	return a
}

// Wait returns the answer once it has come: nil (admitted, or let through unchecked) or the
// refusal (an *Error CodeRateLimited). A nil Admission admits.
func (a *Admission) Wait() error {
	if a == nil {
		return nil
	}
	<-a.done
	return a.err
}

type admissionKey struct{}

// WithAdmission returns a context that carries a.
func WithAdmission(ctx context.Context, a *Admission) context.Context {
	return context.WithValue(ctx, admissionKey{}, a)
}

// Admitted waits for the Admission ctx carries, if any, and returns its answer: what a call
// does after its read and before its first write.
func Admitted(ctx context.Context) error {
	a, _ := ctx.Value(admissionKey{}).(*Admission)
	return a.Wait()
}
