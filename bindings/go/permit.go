package quotalease

// #include "cshim.h"
import "C"

import (
	"runtime"
	"sync"
)

// Permit is one request of a key in flight, from AcquireConcurrent:
// admitted (Allowed) while fewer than Config.Concurrency requests of the
// key are in flight across the fleet. Release it when the request ends,
// then Close it; closed unreleased (or garbage-collected), an admitted
// permit is released then. A denied permit holds nothing: Close it.
type Permit struct {
	// Allowed reports whether a permit was taken (the request may go ahead).
	Allowed bool
	// Decision is the decision: Limit is the key's concurrency, Remaining
	// the permits left; a denial is ReasonExhausted with RetryAfterMs,
	// when to ask again.
	Decision Decision
	// Key is the key the permit is for.
	Key string

	mu  sync.Mutex
	ptr *C.lease_permit
}

// AcquireConcurrent takes a permit for one request of key in flight:
// admitted while fewer than the key's concurrency limit of its requests are
// in flight across every limiter on the authority (permits are leased in
// chunks, as tokens are), denied otherwise (Permit.Allowed false). The
// limit is the "N concurrent" of the key's rules (its own policy entry's,
// else its assigned or default tier's), else Config.Concurrency. It may
// wait for one lease call (at most BackendTimeoutMs), as Acquire does.
//
// At most that many permits of a key are held at once, plus those of an
// instance that died holding them, until its commitments expire at the
// authority (7 s after its last call). A released permit goes back to the
// authority at once, for any limiter to take.
//
// Errors: KindConfig when the key has no concurrency limit; KindInvalidKey;
// KindClosed.
//
//	p, err := lim.AcquireConcurrent("tenant:7")
//	if err != nil { ... }
//	defer p.Close()
//	if !p.Allowed { ... answer 429 ... }
func (l *Limiter) AcquireConcurrent(key string) (*Permit, error) {
	return l.AcquireConcurrentTier(key, "")
}

// AcquireConcurrentTier is AcquireConcurrent in plan tier tier ("" names
// none): the tier's "N concurrent" sets the key's limit unless the key has
// a policy entry of its own. An unknown tier is KindConfig.
func (l *Limiter) AcquireConcurrentTier(key, tier string) (*Permit, error) {
	if l == nil {
		return nil, errNil
	}
	r := C.ql_acquire_concurrent(l.ptr, key, tier)
	runtime.KeepAlive(l)
	if r.status != C.LEASE_OK {
		return nil, newError(r.status, r.err, ctxKey)
	}
	d := decisionOf(l, &r.d)
	p := &Permit{Allowed: d.Allowed, Decision: d, Key: key, ptr: r.permit}
	runtime.SetFinalizer(p, (*Permit).Close)
	return p, nil
}

// Release releases the permit: the key may have one more request in
// flight. Once only. Errors: KindReservation (released or closed already,
// or a denied permit: no permit was taken), KindClosed (the limiter was
// closed).
func (p *Permit) Release() error {
	if p == nil {
		return errNil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ptr == nil {
		return &Error{Kind: KindReservation, Message: "invalid release: this permit was closed (which releases it); release before Close"}
	}
	res := C.ql_permit_release(p.ptr)
	return newError(res.status, res.err, ctxKey)
}

// Close frees the permit, releasing it first if it was admitted and not
// released. Safe to call more than once.
func (p *Permit) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ptr != nil {
		C.lease_permit_free(p.ptr)
		p.ptr = nil
	}
	runtime.SetFinalizer(p, nil)
}
