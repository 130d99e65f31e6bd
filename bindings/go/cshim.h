/* C wrappers shared by the package's Go files (static inline: each cgo file
 * gets its own copy). Not part of liblease's ABI. */
#ifndef QL_CSHIM_H
#define QL_CSHIM_H
#include <stdlib.h>
#include <string.h>
#include <lease.h>

// liblease's last error is thread-local, and a goroutine may change OS
// threads between two cgo calls: every wrapper copies the message in the
// same C call that failed (err is malloc'd; the Go side frees it).
static inline char *ql_err(lease_status s) {
	return s == LEASE_OK ? NULL : strdup(lease_last_error());
}

typedef struct {
	lease_status status;
	lease_decision d;
	char *err;
} ql_decision_result;

typedef struct {
	lease_status status;
	char *err;
} ql_result;

// Acquire and AcquireTier: the decision is written into the caller's struct
// (on the Go stack: `#cgo noescape` in cgo.go), not returned by value and
// copied twice; the struct holds no pointer (the error message is the
// return value), so cgo's check of it is one type test. The limiter goes
// as an integer: it is C memory, nothing for cgo to check.
typedef struct {
	lease_decision d;
	lease_status status;
} ql_decided;

static inline char *ql_acquire_into(uintptr_t l, _GoString_ key, uint64_t cost, int wait, ql_decided *out) {
	const lease_limiter *lim = (const lease_limiter *)l;
	const uint8_t *p = (const uint8_t *)_GoStringPtr(key);
	size_t n = _GoStringLen(key);
	out->status = wait ? lease_acquire(lim, p, n, cost, &out->d) : lease_try_acquire(lim, p, n, cost, &out->d);
	return ql_err(out->status);
}

// AcquireTier's: a tier of "" (Go's "no tier") is NULL, length 0.
static inline char *ql_acquire_tier_into(uintptr_t l, _GoString_ key, uint64_t cost, _GoString_ tier, int wait,
                                         ql_decided *out) {
	const lease_limiter *lim = (const lease_limiter *)l;
	const uint8_t *p = (const uint8_t *)_GoStringPtr(key);
	size_t n = _GoStringLen(key);
	size_t tn = _GoStringLen(tier);
	const uint8_t *t = tn ? (const uint8_t *)_GoStringPtr(tier) : NULL;
	out->status = wait ? lease_acquire_tier(lim, p, n, cost, t, tn, &out->d)
	                   : lease_try_acquire_tier(lim, p, n, cost, t, tn, &out->d);
	return ql_err(out->status);
}

static inline ql_decision_result ql_acquire_wait(const lease_limiter *l, _GoString_ key, uint64_t cost,
                                                 _GoString_ tier, uint64_t wait_ms) {
	ql_decision_result r;
	size_t tn = _GoStringLen(tier);
	const uint8_t *t = tn ? (const uint8_t *)_GoStringPtr(tier) : NULL;
	r.status = lease_acquire_wait(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), cost, t, tn, wait_ms, &r.d);
	r.err = r.status == LEASE_OK ? NULL : ql_err(r.status);
	return r;
}

typedef struct {
	lease_status status;
	lease_decision d;
	lease_reservation *res;
	char *err;
} ql_reserve_result;

static inline ql_reserve_result ql_reserve(const lease_limiter *l, _GoString_ key, uint64_t estimate,
                                           _GoString_ tier) {
	ql_reserve_result r;
	size_t tn = _GoStringLen(tier);
	const uint8_t *t = tn ? (const uint8_t *)_GoStringPtr(tier) : NULL;
	r.res = NULL;
	r.status = lease_reserve(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), estimate, t, tn, &r.d, &r.res);
	r.err = r.status == LEASE_OK ? NULL : ql_err(r.status);
	return r;
}

static inline ql_result ql_reservation_settle(const lease_reservation *res, int64_t actual) {
	ql_result r;
	r.status = lease_reservation_settle(res, actual);
	r.err = r.status == LEASE_OK ? NULL : ql_err(r.status);
	return r;
}

typedef struct {
	lease_status status;
	lease_decision d;
	lease_permit *permit;
	char *err;
} ql_permit_result;

static inline ql_permit_result ql_acquire_concurrent(const lease_limiter *l, _GoString_ key, _GoString_ tier) {
	ql_permit_result r;
	size_t tn = _GoStringLen(tier);
	const uint8_t *t = tn ? (const uint8_t *)_GoStringPtr(tier) : NULL;
	r.permit = NULL;
	r.status = lease_acquire_concurrent_tier(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), t, tn, &r.d,
	                                         &r.permit);
	r.err = r.status == LEASE_OK ? NULL : ql_err(r.status);
	return r;
}

static inline ql_result ql_permit_release(const lease_permit *p) {
	ql_result r;
	r.status = lease_permit_release(p);
	r.err = r.status == LEASE_OK ? NULL : ql_err(r.status);
	return r;
}

static inline uint64_t ql_waiters(const lease_limiter *l, _GoString_ key) {
	uint64_t n = 0;
	lease_waiters(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), &n);
	return n;
}

// The store calls (operator calls: the Go side passes C strings it checked
// for NUL bytes).
typedef struct {
	lease_status status;
	uint64_t version;
	char *err;
} ql_version_result;

static inline ql_version_result ql_policy_set_tier(const lease_limiter *l, const char *name, const char *rules) {
	ql_version_result r; r.version = 0;
	r.status = lease_policy_set_tier(l, name, rules, &r.version); r.err = ql_err(r.status); return r;
}
static inline ql_version_result ql_policy_delete_tier(const lease_limiter *l, const char *name) {
	ql_version_result r; r.version = 0;
	r.status = lease_policy_delete_tier(l, name, &r.version); r.err = ql_err(r.status); return r;
}
static inline ql_version_result ql_policy_assign(const lease_limiter *l, _GoString_ key, const char *assignment) {
	ql_version_result r; r.version = 0;
	r.status = lease_policy_assign(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), assignment, &r.version);
	r.err = ql_err(r.status); return r;
}
static inline ql_version_result ql_policy_unassign(const lease_limiter *l, _GoString_ key) {
	ql_version_result r; r.version = 0;
	r.status = lease_policy_unassign(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), &r.version);
	r.err = ql_err(r.status); return r;
}
static inline ql_result ql_refresh_policies(const lease_limiter *l) {
	ql_result r; r.status = lease_refresh_policies(l); r.err = ql_err(r.status); return r;
}

// Text results (a store entry, a policy description) into a Go-owned buffer;
// 512 bytes always suffice (lease.h).
typedef struct {
	lease_status status;
	size_t needed;
	char *err;
} ql_text_result;

static inline ql_text_result ql_policy_get(const lease_limiter *l, _GoString_ key, char *buf, size_t cap) {
	ql_text_result r; r.needed = 0;
	r.status = lease_policy_get(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), buf, cap, &r.needed);
	r.err = ql_err(r.status); return r;
}
static inline ql_text_result ql_policy_describe(const lease_limiter *l, _GoString_ key, _GoString_ tier, char *buf,
                                                size_t cap) {
	ql_text_result r; r.needed = 0;
	size_t tn = _GoStringLen(tier);
	r.status = lease_policy_describe(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key),
	                                 tn ? (const uint8_t *)_GoStringPtr(tier) : NULL, tn, buf, cap, &r.needed);
	r.err = ql_err(r.status); return r;
}

static inline ql_result ql_set_limit(const lease_limiter *l, _GoString_ key, uint64_t limit, uint64_t window_ms) {
	ql_result r;
	r.status = lease_set_limit(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), limit, window_ms);
	r.err = ql_err(r.status);
	return r;
}

typedef struct {
	lease_status status;
	lease_inspection i;
	char *err;
} ql_inspect_result;

// lease_inspect_policy: the figures and the policy text in one read of the
// authority (512 bytes of text always suffice).
static inline ql_inspect_result ql_inspect(const lease_limiter *l, _GoString_ key, char *buf, size_t cap) {
	ql_inspect_result r;
	memset(&r.i, 0, sizeof r.i);
	r.status = lease_inspect_policy(l, (const uint8_t *)_GoStringPtr(key), _GoStringLen(key), &r.i, buf, cap, NULL);
	r.err = ql_err(r.status);
	return r;
}

static inline ql_result ql_options_new(lease_options **out) {
	ql_result r; r.status = lease_options_new(out); r.err = ql_err(r.status); return r;
}
static inline ql_result ql_options_set_str(lease_options *o, const char *name, const char *value) {
	ql_result r; r.status = lease_options_set_str(o, name, value); r.err = ql_err(r.status); return r;
}
static inline ql_result ql_options_set_int(lease_options *o, const char *name, int64_t value) {
	ql_result r; r.status = lease_options_set_int(o, name, value); r.err = ql_err(r.status); return r;
}
static inline ql_result ql_new_from_options(const lease_options *o, lease_limiter **out) {
	ql_result r; r.status = lease_limiter_new_from_options(o, out); r.err = ql_err(r.status); return r;
}

// The middleware key of a raw value (lease_http_key), returned by value:
// LEASE_MAX_KEY_LEN + 1 bytes always suffice.
typedef struct {
	lease_status status;
	size_t len;
	char *err;
	char key[LEASE_MAX_KEY_LEN + 1];
} ql_key_result;

static inline ql_key_result ql_http_key(_GoString_ raw) {
	ql_key_result r;
	size_t needed = 0;
	r.status = lease_http_key((const uint8_t *)_GoStringPtr(raw), _GoStringLen(raw), r.key, sizeof r.key, &needed);
	r.len = r.status == LEASE_OK ? needed - 1 : 0;
	r.err = ql_err(r.status);
	return r;
}

static inline ql_result ql_flush(const lease_limiter *l) { ql_result r; r.status = lease_flush(l); r.err = ql_err(r.status); return r; }
static inline ql_result ql_close(const lease_limiter *l) { ql_result r; r.status = lease_close(l); r.err = ql_err(r.status); return r; }
static inline ql_result ql_settle(const lease_limiter *l) { ql_result r; r.status = lease_settle(l); r.err = ql_err(r.status); return r; }
static inline ql_result ql_advance(const lease_limiter *l, uint64_t ms) {
	ql_result r; r.status = lease_advance_clock(l, ms); r.err = ql_err(r.status); return r;
}
static inline ql_result ql_prometheus(const lease_limiter *l, char *buf, size_t cap, size_t *needed) {
	ql_result r; r.status = lease_metrics_prometheus(l, buf, cap, needed); r.err = ql_err(r.status); return r;
}
static inline ql_result ql_prometheus_many(const lease_limiter *const *ls, size_t n, const char *const *names,
                                           size_t n_names, const char *const *values, char *buf, size_t cap,
                                           size_t *needed) {
	ql_result r;
	r.status = lease_metrics_prometheus_many(ls, n, names, n_names, values, buf, cap, needed);
	r.err = ql_err(r.status);
	return r;
}
static inline ql_result ql_check(const lease_limiter *l) { ql_result r; r.status = lease_limiter_check(l); r.err = ql_err(r.status); return r; }
static inline ql_result ql_headers(lease_decision d, char *buf, size_t cap, size_t *needed) {
	ql_result r; r.status = lease_decision_headers(&d, buf, cap, needed); r.err = ql_err(r.status); return r;
}
static inline lease_status ql_metrics(const lease_limiter *l, struct lease_metrics *out) { return lease_metrics(l, out); }

static inline void ql_noop(void) {}

#endif
