package mesh

import (
	"context"
	"sync"
	"time"
)

// Clock is the time the Renewer keeps (a fake in tests).
type Clock interface {
	Now() time.Time
	// After is time.After.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RenewFraction is the part of a certificate's remaining life after which
// the Renewer asks for the next: two thirds.
const RenewFraction = 2.0 / 3.0

// DefaultRetry is the wait before asking again after a failure that may
// pass (the CA unreachable).
const DefaultRetry = 5 * time.Second

// Renewer keeps the pod's certificate current: it asks for one
// (Request), hands it on (Install), and asks again at RenewFraction of
// its remaining life. When the CA refuses (the pod's attestation failed,
// or the owner's policy no longer gives it the identity), or the
// certificate expires before the CA can be reached, the pod loses it
// (Drop): the files go and the proxy refuses every connection until a
// later attempt succeeds.
type Renewer struct {
	// Request asks for a new certificate (Client.Request).
	Request func(ctx context.Context) (*Certificate, error)
	// Install makes c the pod's certificate; Drop takes it away (why:
	// the error that lost it).
	Install func(c *Certificate) error
	Drop    func(why error)
	// Clock is the time (nil: the real one).
	Clock Clock
	// Retry is the wait after a failure (default DefaultRetry); after a
	// refusal the Renewer asks again only after RefusedRetry (default ten
	// times Retry), so that a pod the owner readmits gets its identity
	// back without flooding the CA meanwhile.
	Retry, RefusedRetry time.Duration
	// Log is told of each attempt's outcome (nil: nothing).
	Log func(c *Certificate, renewAt time.Time, err error)

	mu      sync.Mutex
	first   chan struct{} // closed after the first attempt
	current *Certificate
}

func (r *Renewer) clock() Clock {
	if r.Clock == nil {
		return realClock{}
	}
	return r.Clock
}

func (r *Renewer) init() {
	r.mu.Lock()
	if r.first == nil {
		r.first = make(chan struct{})
	}
	r.mu.Unlock()
}

// FirstAttempt is closed once the first request has succeeded or failed.
func (r *Renewer) FirstAttempt() <-chan struct{} {
	r.init()
	return r.first
}

// Current is the certificate in use, nil without one.
func (r *Renewer) Current() *Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.current
}

// Run keeps the certificate current until ctx ends.
func (r *Renewer) Run(ctx context.Context) {
	r.init()
	var once sync.Once
	firstDone := func() { once.Do(func() { close(r.first) }) }
	defer firstDone()
	retry := r.Retry
	if retry <= 0 {
		retry = DefaultRetry
	}
	refusedRetry := r.RefusedRetry
	if refusedRetry <= 0 {
		refusedRetry = 10 * retry
	}
	var expires time.Time // of the current certificate, by this clock
	for {
		c, err := r.Request(ctx)
		if ctx.Err() != nil {
			return
		}
		now := r.clock().Now()
		var wait time.Duration
		if err == nil {
			if err = r.Install(c); err == nil {
				remaining := c.TLS.Leaf.NotAfter.Sub(now)
				expires = now.Add(remaining)
				wait = time.Duration(float64(remaining) * RenewFraction)
				r.mu.Lock()
				r.current = c
				r.mu.Unlock()
			}
		}
		switch {
		case err == nil:
		case Permanent(err):
			r.drop(err)
			wait = refusedRetry
		default:
			// The CA may be back before the certificate expires: keep it
			// until then, and try again no later than that.
			if r.Current() != nil && !now.Before(expires) {
				r.drop(err)
			}
			wait = retry
			if left := expires.Sub(now); r.Current() != nil && left < wait {
				wait = left
			}
		}
		if r.Log != nil {
			r.Log(r.Current(), now.Add(wait), err)
		}
		firstDone()
		select {
		case <-ctx.Done():
			return
		case <-r.clock().After(wait):
		}
	}
}

// drop takes the certificate away.
func (r *Renewer) drop(why error) {
	r.mu.Lock()
	had := r.current != nil
	r.current = nil
	r.mu.Unlock()
	if had || why != nil {
		r.Drop(why)
	}
}
