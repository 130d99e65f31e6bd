package quotalease

// #include "cshim.h"
import "C"

import (
	"fmt"
	"runtime"
	"runtime/cgo"
	"sort"
	"sync/atomic"
	"time"
	"unsafe"
)

// Limiter is a distributed rate limiter. It is safe for concurrent use by
// many goroutines. Close it when done; one dropped without Close is freed by
// a finalizer (without giving its leased tokens back: the authority refills
// them).
type Limiter struct {
	ptr       *C.lease_limiter
	events    cgo.Handle
	closed    atomic.Bool
	lastRules atomic.Pointer[lastRules]
}

var errNil = &Error{Kind: KindClosed, Message: "the *Limiter is nil; create one with quotalease.New"}

// New validates cfg and creates a limiter. Nothing starts until first use: no
// goroutine, thread or connection. Errors are KindConfig, and name the option.
func New(cfg Config) (*Limiter, error) { return newLimiter(cfg.options(), cfg.OnEvent) }

// newLimiter builds a limiter from options by name: a Config's set fields,
// or (in tests) names as the vectors spell them.
func newLimiter(opts []option, onEvent func(Event)) (*Limiter, error) {
	p, err := newFromOptions(opts)
	if err != nil {
		return nil, err
	}
	l := &Limiter{ptr: p}
	if onEvent != nil {
		l.events = cgo.NewHandle(onEvent)
		setEventHandle(p, l.events)
	}
	runtime.SetFinalizer(l, (*Limiter).finalize)
	return l, nil
}

func (l *Limiter) finalize() {
	l.dropEvents()
	C.lease_limiter_free(l.ptr)
	l.ptr = nil
}

func (l *Limiter) dropEvents() {
	if l.events != 0 {
		setEventHandle(l.ptr, 0)
		l.events.Delete()
		l.events = 0
	}
}

// Acquire takes one token for key. A denial is a Decision with Allowed
// false; errors are bad input (KindInvalidKey) or a closed limiter. With
// local tokens it costs one cgo call and no allocation; a key's first call
// may wait for a lease (at most BackendTimeoutMs).
func (l *Limiter) Acquire(key string) (Decision, error) { return l.acquire(key, 1, 1) }

// AcquireN takes cost tokens for key (cost between 1 and the key's limit).
func (l *Limiter) AcquireN(key string, cost uint64) (Decision, error) { return l.acquire(key, cost, 1) }

// TryAcquire is Acquire that never waits: with no local tokens and a lease
// request needed, it starts one and denies with ReasonPending.
func (l *Limiter) TryAcquire(key string) (Decision, error) { return l.acquire(key, 1, 0) }

// TryAcquireN is TryAcquire for cost tokens.
func (l *Limiter) TryAcquireN(key string, cost uint64) (Decision, error) {
	return l.acquire(key, cost, 0)
}

// AcquireTier takes one token for key in plan tier tier ("": no tier, as
// Acquire): the key is held to the tier's rules (Config.Tiers, the policy
// file, the shared store), unless it has its own entry in the store or
// file, or a SetLimit override, which win whatever tier is named. A key
// with several rules is admitted only when every rule admits; tokens the
// others took are given back when one denies. An unknown tier is a
// KindConfig error naming it and the known ones.
func (l *Limiter) AcquireTier(key, tier string) (Decision, error) {
	return l.acquireTier(key, 1, tier, 1)
}

// AcquireTierN is AcquireTier for cost tokens.
func (l *Limiter) AcquireTierN(key string, cost uint64, tier string) (Decision, error) {
	return l.acquireTier(key, cost, tier, 1)
}

// TryAcquireTier is AcquireTier that never waits (see TryAcquire).
func (l *Limiter) TryAcquireTier(key, tier string) (Decision, error) {
	return l.acquireTier(key, 1, tier, 0)
}

// TryAcquireTierN is TryAcquireTier for cost tokens.
func (l *Limiter) TryAcquireTierN(key string, cost uint64, tier string) (Decision, error) {
	return l.acquireTier(key, cost, tier, 0)
}

func (l *Limiter) acquire(key string, cost uint64, wait C.int) (d Decision, err error) {
	if l == nil {
		return Decision{}, errNil
	}
	var r C.ql_decided
	msg := C.ql_acquire_into(C.uintptr_t(uintptr(unsafe.Pointer(l.ptr))), key, C.uint64_t(cost), wait, &r)
	runtime.KeepAlive(l)
	if r.status != C.LEASE_OK {
		return Decision{}, newError(r.status, msg, ctxKey)
	}
	d.fill(l, &r.d)
	return d, nil
}

func (l *Limiter) acquireTier(key string, cost uint64, tier string, wait C.int) (d Decision, err error) {
	if l == nil {
		return Decision{}, errNil
	}
	var r C.ql_decided
	msg := C.ql_acquire_tier_into(C.uintptr_t(uintptr(unsafe.Pointer(l.ptr))), key, C.uint64_t(cost), tier, wait, &r)
	runtime.KeepAlive(l)
	if r.status != C.LEASE_OK {
		// LEASE_ERR_UTF8 is about the key here: a tier that is not UTF-8 is
		// LEASE_ERR_CONFIG.
		return Decision{}, newError(r.status, msg, ctxKey)
	}
	d.fill(l, &r.d)
	return d, nil
}

// AcquireWait takes cost tokens for key in plan tier tier ("": no tier),
// waiting up to wait for them instead of denying: from the local lease, a
// rate grant or the bucket's refill, in arrival order among this process's
// waiters of the key. A denial whose RetryAfterMs falls past the deadline
// is returned at once; a deny entry (ReasonBlocked) is never waited on.
// Each request counts once in Metrics however often it was denied while
// waiting. It blocks the calling goroutine (and its OS thread, in cgo).
// A negative wait is a KindConfig error.
func (l *Limiter) AcquireWait(key string, cost uint64, tier string, wait time.Duration) (Decision, error) {
	if l == nil {
		return Decision{}, errNil
	}
	if wait < 0 {
		return Decision{}, &Error{Kind: KindConfig, Message: fmt.Sprintf("invalid configuration: `wait` must not be negative (got %v)", wait)}
	}
	r := C.ql_acquire_wait(l.ptr, key, C.uint64_t(cost), tier, C.uint64_t(wait.Milliseconds()))
	runtime.KeepAlive(l)
	if r.status != C.LEASE_OK {
		return Decision{}, newError(r.status, r.err, ctxKey)
	}
	return decisionOf(l, &r.d), nil
}

// Waiters is how many requests of key wait in AcquireWait in this process now.
func (l *Limiter) Waiters(key string) int {
	if l == nil {
		return 0
	}
	n := C.ql_waiters(l.ptr, key)
	runtime.KeepAlive(l)
	return int(n)
}

// SetLimit overrides the policy of one key: limit tokens per windowMs.
// Takes effect at once: lowering it gives the key's local tokens back and
// clamps its stored tokens to the new capacity.
func (l *Limiter) SetLimit(key string, limit, windowMs uint64) error {
	if l == nil {
		return errNil
	}
	r := C.ql_set_limit(l.ptr, key, C.uint64_t(limit), C.uint64_t(windowMs))
	runtime.KeepAlive(l)
	return newError(r.status, r.err, ctxKey)
}

// Metrics returns a snapshot of the counters (also after Close).
func (l *Limiter) Metrics() Metrics {
	var m C.struct_lease_metrics
	if l == nil {
		return Metrics{}
	}
	C.ql_metrics(l.ptr, &m)
	runtime.KeepAlive(l)
	return Metrics{
		Admitted:            uint64(m.admitted),
		Denied:              uint64(m.denied),
		BackendCalls:        uint64(m.backend_calls),
		BackendErrors:       uint64(m.backend_errors),
		TokensLeased:        uint64(m.tokens_leased),
		TokensReturned:      uint64(m.tokens_returned),
		TokensExpired:       uint64(m.tokens_expired),
		FallbackActive:      uint64(m.fallback_active),
		FallbackTransitions: uint64(m.fallback_transitions),
		KeysTracked:         uint64(m.keys_tracked),
		OvershootBound:      uint64(m.overshoot_bound),
		ShadowDenied:        uint64(m.shadow_denied),
		TokensDebited:       uint64(m.tokens_debited),
	}
}

// MetricsPrometheus returns the counters in Prometheus text format, every
// name prefixed quotalease_.
func (l *Limiter) MetricsPrometheus() string {
	if l == nil {
		return ""
	}
	buf := make([]byte, 2048)
	for {
		var needed C.size_t
		r := C.ql_prometheus(l.ptr, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &needed)
		runtime.KeepAlive(l)
		if r.status == C.LEASE_OK {
			return string(buf[:needed-1])
		}
		_ = newError(r.status, r.err, ctxKey) // frees the message
		if r.status != C.LEASE_ERR_BUFFER_TOO_SMALL {
			return ""
		}
		buf = make([]byte, int(needed)+256)
	}
}

// MetricsPrometheusLabeled is MetricsPrometheus with labels on every
// sample (map[string]string{"limiter": "api"} gives
// quotalease_admitted_total{limiter="api"} 7). Label names follow the
// Prometheus data model; a bad one is a KindConfig error. Several limiters
// in one exposition: PrometheusText.
func (l *Limiter) MetricsPrometheusLabeled(labels map[string]string) (string, error) {
	return PrometheusText(Labeled{Limiter: l, Labels: labels})
}

// Labeled is one limiter of PrometheusText and the labels that tell its
// samples apart.
type Labeled struct {
	Limiter *Limiter
	Labels  map[string]string
}

// PrometheusText renders several limiters' counters as ONE Prometheus
// exposition: each family's # HELP and # TYPE once, then one sample per
// limiter (concatenating MetricsPrometheus texts repeats the families,
// which Prometheus rejects). Every limiter needs the same label names with
// different values. Errors (KindConfig): a bad or missing label name, two
// limiters with the same labels; KindInternal for a nil limiter.
func PrometheusText(limiters ...Labeled) (string, error) {
	var names []string
	if len(limiters) > 0 {
		for name := range limiters[0].Labels {
			names = append(names, name)
		}
		sort.Strings(names)
	}
	ptrs := make([]*C.lease_limiter, len(limiters))
	cNames := make([]*C.char, len(names))
	cValues := make([]*C.char, 0, len(limiters)*len(names))
	defer func() {
		for _, p := range cNames {
			C.free(unsafe.Pointer(p))
		}
		for _, p := range cValues {
			C.free(unsafe.Pointer(p))
		}
	}()
	for i, name := range names {
		cNames[i] = C.CString(name)
	}
	for i, x := range limiters {
		if x.Limiter == nil {
			return "", errNil
		}
		ptrs[i] = x.Limiter.ptr
		if len(x.Labels) != len(names) {
			return "", &Error{Kind: KindConfig, Message: "invalid configuration: `labels` every limiter needs the same label names"}
		}
		for _, name := range names {
			v, ok := x.Labels[name]
			if !ok {
				return "", &Error{Kind: KindConfig, Message: fmt.Sprintf("invalid configuration: `labels` label %q is missing from a limiter (every limiter needs the same label names)", name)}
			}
			cValues = append(cValues, C.CString(v))
		}
	}
	var limPtr **C.lease_limiter
	if len(ptrs) > 0 {
		limPtr = &ptrs[0]
	}
	var namePtr, valuePtr **C.char
	if len(cNames) > 0 {
		namePtr = &cNames[0]
		valuePtr = &cValues[0]
	}
	buf := make([]byte, 2048*(len(limiters)+1))
	for {
		var needed C.size_t
		r := C.ql_prometheus_many(limPtr, C.size_t(len(ptrs)), namePtr, C.size_t(len(names)), valuePtr,
			(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &needed)
		for _, x := range limiters {
			runtime.KeepAlive(x.Limiter)
		}
		if r.status == C.LEASE_OK {
			return string(buf[:needed-1]), nil
		}
		if r.status != C.LEASE_ERR_BUFFER_TOO_SMALL {
			return "", newError(r.status, r.err, ctxConfig)
		}
		_ = newError(r.status, r.err, ctxConfig) // frees the message
		buf = make([]byte, int(needed)+256)
	}
}

// Check is a startup probe: it connects to the backend now and runs a
// script that reads (never writes) one key under the limiter's prefix, the
// path every lease takes. nil when leases can be taken; ErrMisconfigured
// (errors.Is) when the backend refuses the configuration (password,
// database, scheme, protocol, ACL); ErrBackend when it cannot be reached
// (connecting, then the server's silence, each bounded by
// BackendTimeoutMs). Always nil on memory://. New never connects, so call
// Check where the service decides it is ready; it changes nothing.
func (l *Limiter) Check() error {
	if l == nil {
		return errNil
	}
	r := C.ql_check(l.ptr)
	runtime.KeepAlive(l)
	return newError(r.status, r.err, ctxKey)
}

// Flush gives every leased token back now and waits for the authority to
// take them (graceful shutdown). Errors: KindClosed, KindBackend.
func (l *Limiter) Flush() error {
	if l == nil {
		return errNil
	}
	r := C.ql_flush(l.ptr)
	runtime.KeepAlive(l)
	return newError(r.status, r.err, ctxKey)
}

// Close flushes, stops the limiter's broker and unregisters OnEvent. Every
// later call returns ErrClosed (Metrics still work). Idempotent: later
// calls return nil. The error, if any, is KindBackend (the flush failed;
// the limiter is closed anyway).
func (l *Limiter) Close() error {
	if l == nil {
		return errNil
	}
	if l.closed.Swap(true) {
		return nil
	}
	r := C.ql_close(l.ptr)
	err := newError(r.status, r.err, ctxKey)
	l.dropEvents()
	runtime.KeepAlive(l)
	return err
}

// AdvanceClock moves a ManualClock limiter's clock forward (deterministic
// tests). KindConfig with the system clock.
func (l *Limiter) AdvanceClock(ms uint64) error {
	if l == nil {
		return errNil
	}
	r := C.ql_advance(l.ptr, C.uint64_t(ms))
	runtime.KeepAlive(l)
	return newError(r.status, r.err, ctxKey)
}

// Settle runs lease-TTL maintenance now and waits until no lease or
// give-back request is in flight (deterministic tests; at most 10 s).
func (l *Limiter) Settle() error {
	if l == nil {
		return errNil
	}
	r := C.ql_settle(l.ptr)
	runtime.KeepAlive(l)
	return newError(r.status, r.err, ctxKey)
}
