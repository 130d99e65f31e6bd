package quotalease

// #include "cshim.h"
import "C"

import (
	"net/http"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Reason says why a decision came out the way it did.
type Reason string

// The reasons, named as in every binding.
const (
	ReasonLease     Reason = "lease"     // admitted from (or denied with) a local lease
	ReasonExhausted Reason = "exhausted" // denied: the authoritative bucket is empty until RetryAfterMs
	ReasonFallback  Reason = "fallback"  // decided by the failure policy while the backend is unreachable
	ReasonPending   Reason = "pending"   // denied by TryAcquire: a lease request is in flight
	ReasonExact     Reason = "exact"     // decided by one authority call (ModeExact)
	ReasonLocal     Reason = "local"     // decided by the in-process bucket (ModeLocal)
	// ReasonShadow: admitted although the key's rules deny it, because they
	// are in shadow mode (Config.Shadow, or "shadow ..." rules of a tier or
	// key). Remaining and RetryAfterMs are what the denial said; counted in
	// Metrics.ShadowDenied; Headers is empty.
	ReasonShadow Reason = "shadow"
	// ReasonBlocked: denied, the key has a deny entry ("blocked") in the
	// policy store or file; Headers has Retry-After only.
	ReasonBlocked Reason = "blocked"
	// ReasonUnlimited: admitted, the key has an allow entry ("unlimited");
	// no token spent, Headers is empty.
	ReasonUnlimited Reason = "unlimited"
)

// reasonOf is the Reason of a C reason code (TestReasonsAreTheCABIs checks
// every code against lease_reason_name).
func reasonOf(r uint32) Reason {
	switch r {
	case C.LEASE_REASON_LEASE:
		return ReasonLease
	case C.LEASE_REASON_EXHAUSTED:
		return ReasonExhausted
	case C.LEASE_REASON_FALLBACK:
		return ReasonFallback
	case C.LEASE_REASON_PENDING:
		return ReasonPending
	case C.LEASE_REASON_EXACT:
		return ReasonExact
	case C.LEASE_REASON_LOCAL:
		return ReasonLocal
	case C.LEASE_REASON_SHADOW:
		return ReasonShadow
	case C.LEASE_REASON_BLOCKED:
		return ReasonBlocked
	case C.LEASE_REASON_UNLIMITED:
		return ReasonUnlimited
	}
	return Reason("unknown")
}

func (r Reason) code() uint32 {
	switch r {
	case ReasonExhausted:
		return C.LEASE_REASON_EXHAUSTED
	case ReasonFallback:
		return C.LEASE_REASON_FALLBACK
	case ReasonPending:
		return C.LEASE_REASON_PENDING
	case ReasonExact:
		return C.LEASE_REASON_EXACT
	case ReasonLocal:
		return C.LEASE_REASON_LOCAL
	case ReasonShadow:
		return C.LEASE_REASON_SHADOW
	case ReasonBlocked:
		return C.LEASE_REASON_BLOCKED
	case ReasonUnlimited:
		return C.LEASE_REASON_UNLIMITED
	}
	return C.LEASE_REASON_LEASE
}

// cReasonName is the C ABI's (the engine's) name of a reason code.
func cReasonName(code uint32) string {
	return C.GoString(C.lease_reason_name(C.lease_reason(code)))
}

// Decision is the outcome of one Acquire. A denial is a Decision with
// Allowed false, not an error.
type Decision struct {
	// Allowed reports whether the request is admitted.
	Allowed bool
	// Limit is the key's limit (tokens per window).
	Limit uint64
	// Remaining is the best estimate of tokens left for the key across the
	// fleet when admitted; when denied, what this caller can have now.
	Remaining uint64
	// RetryAfterMs: when denied, milliseconds until a retry can succeed (0 when allowed).
	RetryAfterMs uint64
	// ResetAfterMs: milliseconds until the key's bucket would be full again
	// (a calendar quota's: until its period ends).
	ResetAfterMs uint64
	// WindowMs is the key's window in milliseconds (a calendar quota's
	// nominal period: a day, 7 days, 30 days or 365 days).
	WindowMs uint64
	// Reason says why.
	Reason Reason
	// Rule is the index in Rules of the binding rule: the rule that denied
	// or, when admitted, the one with the fewest tokens left. Limit,
	// Remaining, WindowMs and the two times above are that rule's. 0 for a
	// key with one rule.
	Rule int
	// Rules is every rule the key is held to (one unless its tier or policy
	// has several, at most four); a request is admitted only when every
	// rule admits it. Decisions with the same rules share one slice: read
	// it, do not modify it.
	Rules []Rule
}

// Rule is one of a key's rules: Limit tokens per WindowMs (for a calendar
// quota, Limit per calendar period; WindowMs is its nominal length).
type Rule struct {
	Limit    uint64
	WindowMs uint64
}

// maxRules is the C ABI's LEASE_MAX_RULES.
const maxRules = C.LEASE_MAX_RULES

// ruleKey is a decision's rules as a comparable value.
type ruleKey struct {
	n     int
	rules [maxRules]Rule
}

// ruleSlices interns the Rules slice of each set of rules seen, so a
// decision costs no allocation: keys share a handful of rule sets (the
// configured limit, each tier). Bounded: past maxRuleSets distinct sets, a
// new set gets a slice of its own.
var ruleSlices = struct {
	sync.RWMutex
	m map[ruleKey][]Rule
}{m: make(map[ruleKey][]Rule)}

const maxRuleSets = 4096

// lastRules is the limiter's most recent rule set (checked before the map).
type lastRules struct {
	key   ruleKey
	rules []Rule
}

func rulesOf(l *Limiter, d *C.lease_decision) []Rule {
	if d.rule_count == 1 {
		// The common case, first: one rule, as on the limiter's last
		// decision (no key to build: 10 ns of a 98 ns Acquire).
		one := Rule{Limit: uint64(d.rule_limits[0]), WindowMs: uint64(d.rule_window_ms[0])}
		if last := l.lastRules.Load(); last != nil && last.key.n == 1 && last.key.rules[0] == one {
			return last.rules
		}
	}
	var k ruleKey
	k.n = int(d.rule_count)
	if k.n < 1 || k.n > maxRules { // not from liblease 0.1+: the decision's own rule
		k.n = 1
		k.rules[0] = Rule{Limit: uint64(d.limit), WindowMs: uint64(d.window_ms)}
	} else {
		for i := 0; i < k.n; i++ {
			k.rules[i] = Rule{Limit: uint64(d.rule_limits[i]), WindowMs: uint64(d.rule_window_ms[i])}
		}
	}
	if last := l.lastRules.Load(); last != nil && last.key == k {
		return last.rules
	}
	ruleSlices.RLock()
	s, ok := ruleSlices.m[k]
	ruleSlices.RUnlock()
	if !ok {
		s = append([]Rule(nil), k.rules[:k.n]...)
		ruleSlices.Lock()
		if old, found := ruleSlices.m[k]; found {
			s = old
		} else if len(ruleSlices.m) < maxRuleSets {
			ruleSlices.m[k] = s
		}
		ruleSlices.Unlock()
	}
	l.lastRules.Store(&lastRules{key: k, rules: s})
	return s
}

// fill sets every field of d from the C decision c. Acquire fills its
// named result in place: returning decisionOf's value copied the 96-byte
// Decision twice more (about 10 ns of a warm Acquire).
func (d *Decision) fill(l *Limiter, c *C.lease_decision) {
	d.Allowed = bool(c.allowed)
	d.Limit = uint64(c.limit)
	d.Remaining = uint64(c.remaining)
	d.RetryAfterMs = uint64(c.retry_after_ms)
	d.ResetAfterMs = uint64(c.reset_after_ms)
	d.WindowMs = uint64(c.window_ms)
	d.Reason = reasonOf(uint32(c.reason))
	d.Rule = int(c.rule)
	d.Rules = rulesOf(l, c)
}

func decisionOf(l *Limiter, c *C.lease_decision) Decision {
	var d Decision
	d.fill(l, c)
	return d
}

// RetryAfter is RetryAfterMs as a time.Duration.
func (d Decision) RetryAfter() time.Duration { return time.Duration(d.RetryAfterMs) * time.Millisecond }

// ResetAfter is ResetAfterMs as a time.Duration.
func (d Decision) ResetAfter() time.Duration { return time.Duration(d.ResetAfterMs) * time.Millisecond }

// Headers returns the HTTP response headers for this decision: the IETF
// RateLimit-Policy and RateLimit fields (draft-ietf-httpapi-ratelimit-headers)
// plus Retry-After in whole seconds when denied. RateLimit-Policy lists
// every rule of Rules ("default" for a key with one rule, else named by
// window: "1s", "1day"); RateLimit reports the binding one. A Decision
// with no Rules is one rule, Limit per WindowMs. The text comes from the
// engine, identical in every language.
func (d Decision) Headers() http.Header {
	var buf [512]byte
	var needed C.size_t
	c := C.lease_decision{
		allowed:        C.bool(d.Allowed),
		reason:         C.lease_reason(d.Reason.code()),
		limit:          C.uint64_t(d.Limit),
		remaining:      C.uint64_t(d.Remaining),
		retry_after_ms: C.uint64_t(d.RetryAfterMs),
		reset_after_ms: C.uint64_t(d.ResetAfterMs),
		window_ms:      C.uint64_t(d.WindowMs),
	}
	if n := len(d.Rules); n > 0 {
		c.rule = C.uint32_t(d.Rule)
		c.rule_count = C.uint32_t(n)
		for i := 0; i < n && i < maxRules; i++ {
			c.rule_limits[i] = C.uint64_t(d.Rules[i].Limit)
			c.rule_window_ms[i] = C.uint64_t(d.Rules[i].WindowMs)
		}
	}
	r := C.ql_headers(c, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &needed)
	h := make(http.Header, 3)
	if r.status != C.LEASE_OK {
		// 512 bytes always suffice (lease.h): only Rules a key cannot have
		// (a zero limit, two rules of one window, Rule out of range) get here.
		_ = newError(r.status, r.err, ctxKey)
		return h
	}
	text := string(buf[:needed-1])
	for _, line := range strings.Split(text, "\r\n") {
		if name, value, ok := strings.Cut(line, ": "); ok {
			h.Set(name, value)
		}
	}
	return h
}
