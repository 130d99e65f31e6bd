package quotalease

// #include "cshim.h"
import "C"

import (
	"runtime"
	"sync"
)

// Reservation is a request admitted (or denied) at an estimate of its cost,
// to be settled once at its actual cost with Settle (an LLM response's
// tokens, bytes streamed). Close it when done; closed unsettled (or
// garbage-collected), it keeps the estimate.
type Reservation struct {
	mu       sync.Mutex
	ptr      *C.lease_reservation
	decision Decision
	estimate uint64
	key      string
}

// Reserve takes estimate tokens of key in plan tier tier ("": no tier) for
// a request whose cost is known only after it ran: decided as AcquireTier
// decides on estimate (Decision().Allowed). Settle it once with the actual
// cost: below the estimate the rest goes back, above it the key takes the
// difference even into debt (its later requests wait until the refill has
// paid it). Errors: as AcquireTier (KindInvalidCost for an estimate of 0 or
// above the key's limit).
func (l *Limiter) Reserve(key string, estimate uint64, tier string) (*Reservation, error) {
	if l == nil {
		return nil, errNil
	}
	r := C.ql_reserve(l.ptr, key, C.uint64_t(estimate), tier)
	runtime.KeepAlive(l)
	if r.status != C.LEASE_OK {
		return nil, newError(r.status, r.err, ctxKey)
	}
	res := &Reservation{ptr: r.res, decision: decisionOf(l, &r.d), estimate: estimate, key: key}
	runtime.SetFinalizer(res, (*Reservation).Close)
	return res, nil
}

// Decision is the decision on the estimate.
func (r *Reservation) Decision() Decision { return r.decision }

// Allowed reports whether the request was admitted at its estimate.
func (r *Reservation) Allowed() bool { return r.decision.Allowed }

// Estimate is the tokens reserved.
func (r *Reservation) Estimate() uint64 { return r.estimate }

// Key is the key reserved on.
func (r *Reservation) Key() string { return r.key }

// Settle settles the reservation at actual tokens (0 when the request used
// nothing). Once only. Errors: KindReservation (settled or closed already,
// a denied reservation, a negative actual), KindClosed (the limiter was
// closed; the estimate stands).
func (r *Reservation) Settle(actual int64) error {
	if r == nil {
		return errNil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ptr == nil {
		return &Error{Kind: KindReservation, Message: "invalid settle: this reservation was closed; settle before Close"}
	}
	res := C.ql_reservation_settle(r.ptr, C.int64_t(actual))
	return newError(res.status, res.err, ctxKey)
}

// Close releases the reservation; unsettled, it keeps its estimate. Safe
// to call more than once.
func (r *Reservation) Close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ptr != nil {
		C.lease_reservation_free(r.ptr)
		r.ptr = nil
	}
	runtime.SetFinalizer(r, nil)
}
