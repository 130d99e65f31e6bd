package quotalease

// #include "cshim.h"
import "C"

import (
	"runtime"
	"unsafe"
)

// Inspection is what Inspect reports for one key: its policy, the
// authoritative bucket, what this limiter holds and its counts and, with
// adaptive leasing, the rate this limiter spends, the key's live holders,
// its fallback rate and its demand. The figures are those of every
// language's inspect (Python's names in snake_case, Node's in camelCase).
//
// The three Authority fields are nil when the figure is unknown: no bucket
// is stored (which reads as a full bucket), or, for AuthorityTTLMs, an
// authority that keeps no expiry (memory://).
type Inspection struct {
	// Limit is the key's limit (tokens per window; a SetLimit override included).
	Limit uint64
	// WindowMs is the key's window in milliseconds.
	WindowMs uint64
	// AuthorityTokens is the whole tokens stored in the authoritative bucket
	// as of its last refill (nil: none stored, which reads as full).
	AuthorityTokens *uint64
	// AuthorityRefilledAtMs is the clock reading (ms) of the bucket's last
	// refill (Redis TIME; with ManualClock, the limiter's clock).
	AuthorityRefilledAtMs *uint64
	// AuthorityTTLMs is the time until the stored bucket expires (Redis only).
	AuthorityTTLMs *uint64
	// LocalTokens is the tokens this limiter holds for the key now.
	LocalTokens uint64
	// LeaseInFlight: a lease request for the key is in flight.
	LeaseInFlight bool
	// ExhaustedForMs: denials stay local for this long (the authority said
	// the bucket is empty); 0 when not.
	ExhaustedForMs uint64
	// Admitted and Denied count this limiter's decisions on the key.
	Admitted uint64
	Denied   uint64
	// RatePerWindow is the rate this limiter spends on the key now, in
	// tokens per window (adaptive leasing; 0: no rate grant runs, it leases
	// chunks). See RateMode.
	RatePerWindow uint64
	// Holders is the key's live holders (limiter instances, this one
	// included) at the authority's last answer; 0 before any answer (and
	// with fixed leases).
	Holders uint64
	// FallbackPerWindow is this limiter's fallback rate at the last answer,
	// in tokens per window: its share of the key's rate among the live
	// holders, what PolicyStaticShare admits while the backend is down.
	FallbackPerWindow uint64
	// DemandPerS is the key's offered load on this limiter (admitted +
	// denied per second, a moving average); 0 until measured.
	DemandPerS uint64
	// Rules is every rule the key is held to, for the tier its calls name
	// ("10/s, 10000/day"); Limit and WindowMs are the first rule's.
	Rules string
	// Tier is the key's tier, if its rules are a tier's ("" if not).
	Tier string
	// PolicySource says why the key has these rules: "tier pro (assigned by
	// store, defined in config)", "own rules (from set_limit)".
	PolicySource string
}

// RateMode reports whether the key is in rate mode here (adaptive leasing
// at saturation: RatePerWindow > 0) rather than leasing chunks.
func (i Inspection) RateMode() bool { return i.RatePerWindow > 0 }

// Inspect reports what the limiter and the authority know about key ("why
// was this denied?"). It reads the authority without changing it: one round
// trip with Redis, so it may block (at most 5 x max(BackendTimeoutMs, 1 s)).
// It is for diagnostics, not for every request. Errors: KindInvalidKey,
// KindClosed, KindBackend (the authority did not answer).
func (l *Limiter) Inspect(key string) (Inspection, error) {
	if l == nil {
		return Inspection{}, errNil
	}
	var buf [512]byte // always enough (lease.h)
	r := C.ql_inspect(l.ptr, key, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	runtime.KeepAlive(l)
	if r.status != C.LEASE_OK {
		return Inspection{}, newError(r.status, r.err, ctxKey)
	}
	c := &r.i
	known := func(has C.bool, v C.uint64_t) *uint64 {
		if !has {
			return nil
		}
		x := uint64(v)
		return &x
	}
	p := policyOf(C.GoString((*C.char)(unsafe.Pointer(&buf[0]))))
	return Inspection{
		Limit:                 uint64(c.limit),
		WindowMs:              uint64(c.window_ms),
		AuthorityTokens:       known(c.has_authority_tokens, c.authority_tokens),
		AuthorityRefilledAtMs: known(c.has_authority_refilled_at_ms, c.authority_refilled_at_ms),
		AuthorityTTLMs:        known(c.has_authority_ttl_ms, c.authority_ttl_ms),
		LocalTokens:           uint64(c.local_tokens),
		LeaseInFlight:         bool(c.lease_in_flight),
		ExhaustedForMs:        uint64(c.exhausted_for_ms),
		Admitted:              uint64(c.admitted),
		Denied:                uint64(c.denied),
		RatePerWindow:         uint64(c.rate_per_window),
		Holders:               uint64(c.holders),
		FallbackPerWindow:     uint64(c.fallback_per_window),
		DemandPerS:            uint64(c.demand_per_s),
		Rules:                 p.Rules,
		Tier:                  p.Tier,
		PolicySource:          p.Source,
	}, nil
}
