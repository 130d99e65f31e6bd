/* API coverage and every bad input of liblease, on the in-memory authority. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static lease_limiter *manual_limiter(uint64_t limit, uint64_t window_ms, uint64_t lease_size) {
  lease_config c;
  lease_config_init(&c);
  c.limit = limit;
  c.window_ms = window_ms;
  c.lease_size = lease_size;
  c.clock = LEASE_CLOCK_MANUAL;
  c.clock_start_ms = 1000000;
  return new_limiter_or_exit(&c);
}

static void version_matches_header(void) {
  char expect[64];
  snprintf(expect, sizeof expect, "%d.%d.%d", LEASE_VERSION_MAJOR, LEASE_VERSION_MINOR, LEASE_VERSION_PATCH);
  CHECK(strcmp(lease_version(), LEASE_VERSION_STRING) == 0, "library %s, header %s", lease_version(),
        LEASE_VERSION_STRING);
  CHECK(strcmp(expect, LEASE_VERSION_STRING) == 0, "%s vs %s", expect, LEASE_VERSION_STRING);
#ifdef EXPECT_VERSION
  /* The test script passes the version from ffi/Cargo.toml's workspace. */
  CHECK(strcmp(lease_version(), EXPECT_VERSION) == 0, "library %s, Cargo.toml %s", lease_version(), EXPECT_VERSION);
#endif
}

static void config_init_fills_documented_defaults(void) {
  lease_config c;
  memset(&c, 0xAB, sizeof c);
  EXPECT(lease_config_init(&c), LEASE_OK);
  CHECK(strcmp(c.url, "memory://") == 0, "url %s", c.url);
  CHECK(c.limit == 0, "limit %llu", (unsigned long long)c.limit);
  CHECK(c.window_ms == 60000, "window");
  CHECK(c.lease_size == LEASE_AUTO, "lease_size");
  CHECK(c.refill_threshold == LEASE_AUTO, "refill_threshold");
  CHECK(c.lease_ttl_ms == 2000, "lease_ttl_ms");
  CHECK(c.on_backend_failure == LEASE_FAILURE_STATIC_SHARE, "policy");
  CHECK(c.mode == LEASE_MODE_LEASE, "mode");
  CHECK(c.expected_replicas == 1, "expected_replicas");
  CHECK(c.backend_timeout_ms == 250, "backend_timeout_ms");
  CHECK(strcmp(c.key_prefix, "ql") == 0, "key_prefix %s", c.key_prefix);
  CHECK(c.max_keys == 100000, "max_keys");
  CHECK(c.clock == LEASE_CLOCK_SYSTEM, "clock");
  /* Where every language's manual clock starts. */
  CHECK(c.clock_start_ms == 1000000, "clock_start_ms %llu", (unsigned long long)c.clock_start_ms);
}

static void acquire_until_exhausted(void) {
  lease_limiter *l = manual_limiter(10, 1000, 4);
  lease_decision d;
  int i, admitted = 0;
  for (i = 0; i < 10; i++) {
    EXPECT(lease_acquire(l, KEY("user:1"), 1, &d), LEASE_OK);
    admitted += d.allowed;
    CHECK(d.limit == 10 && d.window_ms == 1000, "limit %llu window %llu", (unsigned long long)d.limit,
          (unsigned long long)d.window_ms);
    CHECK(d.reason == LEASE_REASON_LEASE, "reason %s", lease_reason_name(d.reason));
    CHECK(d.retry_after_ms == 0, "retry_after_ms %llu", (unsigned long long)d.retry_after_ms);
    CHECK(d.remaining == (uint64_t)(9 - i), "remaining %llu at %d", (unsigned long long)d.remaining, i);
  }
  CHECK(admitted == 10, "admitted %d", admitted);
  EXPECT(lease_acquire(l, KEY("user:1"), 1, &d), LEASE_OK);
  CHECK(!d.allowed, "11th admitted");
  CHECK(d.reason == LEASE_REASON_EXHAUSTED, "reason %s", lease_reason_name(d.reason));
  CHECK(d.retry_after_ms > 0 && d.retry_after_ms <= 1000, "retry_after_ms %llu", (unsigned long long)d.retry_after_ms);
  /* Another key is independent. */
  EXPECT(lease_acquire(l, KEY("user:2"), 3, &d), LEASE_OK);
  CHECK(d.allowed && d.remaining == 7, "user:2 remaining %llu", (unsigned long long)d.remaining);
  /* Time refills. */
  EXPECT(lease_advance_clock(l, 1000), LEASE_OK);
  EXPECT(lease_settle(l), LEASE_OK);
  EXPECT(lease_acquire(l, KEY("user:1"), 1, &d), LEASE_OK);
  CHECK(d.allowed, "refilled key denied");
  lease_limiter_free(l);
}

static void keys_are_bytes_not_c_strings(void) {
  /* Same bytes, no NUL terminator needed: "abc" inside a larger buffer. */
  lease_limiter *l = manual_limiter(5, 60000, 1);
  const char buf[] = {'a', 'b', 'c', 'X', 'Y'};
  lease_decision d;
  EXPECT(lease_acquire(l, (const uint8_t *)buf, 3, 2, &d), LEASE_OK);
  EXPECT(lease_acquire(l, KEY("abc"), 1, &d), LEASE_OK);
  CHECK(d.remaining == 2, "remaining %llu: both calls must hit key \"abc\"", (unsigned long long)d.remaining);
  /* Multi-byte UTF-8 keys work. */
  EXPECT(lease_acquire(l, KEY("clé-ключ-鍵"), 1, &d), LEASE_OK);
  CHECK(d.allowed, "utf-8 key denied");
  lease_limiter_free(l);
}

static void try_acquire_and_reasons(void) {
  lease_limiter *l = manual_limiter(3, 1000, 3);
  lease_decision d;
  EXPECT(lease_try_acquire(l, KEY("k"), 3, &d), LEASE_OK);
  CHECK(d.allowed, "memory authority answers inline");
  EXPECT(lease_try_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(!d.allowed && d.reason == LEASE_REASON_EXHAUSTED, "reason %s", lease_reason_name(d.reason));
  CHECK(strcmp(lease_reason_name(LEASE_REASON_LEASE), "lease") == 0, "lease");
  CHECK(strcmp(lease_reason_name(LEASE_REASON_EXHAUSTED), "exhausted") == 0, "exhausted");
  CHECK(strcmp(lease_reason_name(LEASE_REASON_FALLBACK), "fallback") == 0, "fallback");
  CHECK(strcmp(lease_reason_name(LEASE_REASON_PENDING), "pending") == 0, "pending");
  CHECK(strcmp(lease_reason_name(LEASE_REASON_EXACT), "exact") == 0, "exact");
  CHECK(strcmp(lease_reason_name(LEASE_REASON_LOCAL), "local") == 0, "local");
  CHECK(strcmp(lease_reason_name(99), "unknown") == 0, "99");
  lease_limiter_free(l);
}

static void modes_by_config(void) {
  lease_config c;
  lease_limiter *l;
  lease_decision d;
  lease_config_init(&c);
  c.limit = 4;
  c.clock = LEASE_CLOCK_MANUAL;
  c.mode = LEASE_MODE_EXACT;
  EXPECT(lease_limiter_new(&c, &l), LEASE_OK);
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(d.allowed && d.reason == LEASE_REASON_EXACT && d.remaining == 3, "exact: %s %llu",
        lease_reason_name(d.reason), (unsigned long long)d.remaining);
  lease_limiter_free(l);
  c.mode = LEASE_MODE_LOCAL;
  c.expected_replicas = 2;
  EXPECT(lease_limiter_new(&c, &l), LEASE_OK);
  EXPECT(lease_acquire(l, KEY("k"), 2, &d), LEASE_OK);
  CHECK(d.allowed && d.reason == LEASE_REASON_LOCAL, "local: %s", lease_reason_name(d.reason));
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(!d.allowed, "local share is limit / expected_replicas = 2");
  lease_limiter_free(l);
}

static void set_limit_overrides_one_key(void) {
  lease_limiter *l = manual_limiter(10, 1000, 2);
  lease_decision d;
  EXPECT(lease_set_limit(l, KEY("vip"), 100, 1000), LEASE_OK);
  EXPECT(lease_acquire(l, KEY("vip"), 50, &d), LEASE_OK);
  CHECK(d.allowed && d.limit == 100, "vip limit %llu", (unsigned long long)d.limit);
  EXPECT(lease_acquire(l, KEY("other"), 1, &d), LEASE_OK);
  CHECK(d.limit == 10, "other limit %llu", (unsigned long long)d.limit);
  EXPECT_ERR(lease_set_limit(l, KEY("vip"), 0, 1000), LEASE_ERR_CONFIG, "limit");
  EXPECT_ERR(lease_set_limit(l, KEY("vip"), 10, 0), LEASE_ERR_CONFIG, "window_ms");
  EXPECT_ERR(lease_set_limit(l, KEY(""), 10, 10), LEASE_ERR_INVALID_KEY, "empty");
  lease_limiter_free(l);
}

static void metrics_count_decisions(void) {
  lease_limiter *l = manual_limiter(5, 60000, 5);
  lease_decision d;
  struct lease_metrics m;
  int i;
  for (i = 0; i < 7; i++) EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  memset(&m, 0xFF, sizeof m);
  EXPECT(lease_metrics(l, &m), LEASE_OK);
  CHECK(m.admitted == 5 && m.denied == 2, "admitted %llu denied %llu", (unsigned long long)m.admitted,
        (unsigned long long)m.denied);
  CHECK(m.tokens_leased == 5, "tokens_leased %llu", (unsigned long long)m.tokens_leased);
  CHECK(m.keys_tracked == 1, "keys_tracked %llu", (unsigned long long)m.keys_tracked);
  CHECK(m.backend_calls >= 1 && m.backend_errors == 0, "backend calls %llu errors %llu",
        (unsigned long long)m.backend_calls, (unsigned long long)m.backend_errors);
  CHECK(m.fallback_active == 0 && m.fallback_transitions == 0, "fallback");
  CHECK(m.overshoot_bound == 0, "overshoot_bound %llu", (unsigned long long)m.overshoot_bound);
  lease_limiter_free(l);
}

static void prometheus_into_caller_buffer(void) {
  lease_limiter *l = manual_limiter(5, 60000, 5);
  lease_decision d;
  size_t needed = 0, again = 0;
  char small[16];
  char *buf;
  int i;
  for (i = 0; i < 3; i++) lease_acquire(l, KEY("k"), 1, &d);
  /* Size query. */
  EXPECT(lease_metrics_prometheus(l, NULL, 0, &needed), LEASE_ERR_BUFFER_TOO_SMALL);
  CHECK(needed > 100, "needed %zu", needed);
  /* Too small: "" and the size. */
  memset(small, 'x', sizeof small);
  EXPECT_ERR(lease_metrics_prometheus(l, small, sizeof small, &again), LEASE_ERR_BUFFER_TOO_SMALL, "needed");
  CHECK(small[0] == '\0', "short buffer not emptied");
  CHECK(again == needed, "needed %zu then %zu", needed, again);
  /* One byte short of the NUL. */
  buf = malloc(needed);
  EXPECT(lease_metrics_prometheus(l, buf, needed - 1, NULL), LEASE_ERR_BUFFER_TOO_SMALL);
  /* Exactly enough. */
  EXPECT(lease_metrics_prometheus(l, buf, needed, &again), LEASE_OK);
  CHECK(strlen(buf) + 1 == needed, "strlen %zu needed %zu", strlen(buf), needed);
  CHECK(strstr(buf, "\nquotalease_admitted_total 3\n") != NULL, "text:\n%s", buf);
  CHECK(strstr(buf, "# TYPE quotalease_overshoot_bound gauge\n") != NULL, "text:\n%s", buf);
  /* NULL buffer with a capacity is a NULL argument, not a crash. */
  EXPECT_ERR(lease_metrics_prometheus(l, NULL, 64, &again), LEASE_ERR_NULL, "buf");
  free(buf);
  lease_limiter_free(l);
}

/* Two limiters in one exposition: each family's TYPE once, one labelled
 * sample per limiter; a bad label name or equal labels: LEASE_ERR_CONFIG. */
static void prometheus_of_two_limiters(void) {
  lease_limiter *a = manual_limiter(5, 60000, 5), *b = manual_limiter(5, 60000, 5);
  const lease_limiter *both[2];
  const char *names[] = {"limiter"};
  const char *values[] = {"api", "per-route"};
  const char *same[] = {"x", "x"};
  const char *bad[] = {"1limiter"};
  const char *text;
  lease_decision d;
  char buf[8192];
  size_t needed = 0;
  both[0] = a;
  both[1] = b;
  lease_acquire(a, KEY("k"), 1, &d);
  EXPECT(lease_metrics_prometheus_many(both, 2, names, 1, values, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strstr(buf, "quotalease_admitted_total{limiter=\"api\"} 1\n") != NULL, "text:\n%s", buf);
  CHECK(strstr(buf, "quotalease_admitted_total{limiter=\"per-route\"} 0\n") != NULL, "text:\n%s", buf);
  text = strstr(buf, "# TYPE quotalease_admitted_total counter");
  CHECK(text != NULL && strstr(text + 1, "# TYPE quotalease_admitted_total counter") == NULL, "a family twice:\n%s", buf);
  EXPECT_ERR(lease_metrics_prometheus_many(both, 2, names, 1, same, buf, sizeof buf, NULL), LEASE_ERR_CONFIG,
             "same labels");
  EXPECT_ERR(lease_metrics_prometheus_labeled(a, bad, values, 1, buf, sizeof buf, NULL), LEASE_ERR_CONFIG,
             "not a Prometheus label name");
  EXPECT(lease_metrics_prometheus_labeled(a, names, values, 1, buf, sizeof buf, NULL), LEASE_OK);
  CHECK(strstr(buf, "quotalease_admitted_total{limiter=\"api\"} 1\n") != NULL, "text:\n%s", buf);
  EXPECT_ERR(lease_metrics_prometheus_labeled(a, NULL, values, 1, buf, sizeof buf, NULL), LEASE_ERR_NULL,
             "label_names");
  /* memory:// always passes the check */
  EXPECT(lease_limiter_check(a), LEASE_OK);
  EXPECT_ERR(lease_limiter_check(NULL), LEASE_ERR_NULL, "limiter");
  lease_limiter_free(a);
  lease_limiter_free(b);
}

static void decision_headers_follow_the_draft(void) {
  lease_decision d;
  char buf[256];
  size_t needed = 0;
  memset(&d, 0, sizeof d);
  d.allowed = false;
  d.limit = 100;
  d.remaining = 0;
  d.retry_after_ms = 1200;
  d.reset_after_ms = 30500;
  d.window_ms = 60000;
  d.reason = LEASE_REASON_EXHAUSTED;
  EXPECT(lease_decision_headers(&d, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf,
               "RateLimit-Policy: \"default\";q=100;w=60\r\n"
               "RateLimit: \"default\";r=0;t=31\r\n"
               "Retry-After: 2\r\n") == 0,
        "got %s", buf);
  CHECK(needed == strlen(buf) + 1, "needed %zu", needed);
  d.allowed = true;
  d.retry_after_ms = 0;
  EXPECT(lease_decision_headers(&d, buf, sizeof buf, NULL), LEASE_OK);
  CHECK(strstr(buf, "Retry-After") == NULL, "allowed has no Retry-After: %s", buf);
  EXPECT(lease_decision_headers(&d, buf, 10, &needed), LEASE_ERR_BUFFER_TOO_SMALL);
  CHECK(buf[0] == '\0' && needed > 10, "needed %zu", needed);
  EXPECT_ERR(lease_decision_headers(NULL, buf, sizeof buf, NULL), LEASE_ERR_NULL, "decision");
}

static void flush_and_close(void) {
  lease_limiter *l = manual_limiter(10, 60000, 4);
  lease_decision d;
  struct lease_metrics m;
  size_t needed;
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  EXPECT(lease_flush(l), LEASE_OK);
  EXPECT(lease_metrics(l, &m), LEASE_OK);
  CHECK(m.tokens_returned == 3, "tokens_returned %llu", (unsigned long long)m.tokens_returned);
  EXPECT(lease_close(l), LEASE_OK);
  EXPECT(lease_close(l), LEASE_OK); /* idempotent */
  memset(&d, 0x5A, sizeof d);
  EXPECT_ERR(lease_acquire(l, KEY("k"), 1, &d), LEASE_ERR_CLOSED, "closed");
  CHECK(((unsigned char *)&d)[0] == 0x5A, "out written on failure");
  EXPECT_ERR(lease_try_acquire(l, KEY("k"), 1, &d), LEASE_ERR_CLOSED, "closed");
  EXPECT_ERR(lease_set_limit(l, KEY("k"), 5, 1000), LEASE_ERR_CLOSED, "closed");
  EXPECT_ERR(lease_flush(l), LEASE_ERR_CLOSED, "closed");
  EXPECT_ERR(lease_settle(l), LEASE_ERR_CLOSED, "closed");
  /* Metrics stay readable. */
  EXPECT(lease_metrics(l, &m), LEASE_OK);
  CHECK(m.admitted == 1, "admitted %llu", (unsigned long long)m.admitted);
  EXPECT(lease_metrics_prometheus(l, NULL, 0, &needed), LEASE_ERR_BUFFER_TOO_SMALL);
  lease_limiter_free(l);
}

static void memory_name_shares_one_authority(void) {
  lease_config c;
  lease_limiter *a, *b;
  lease_decision d;
  int i, admitted = 0;
  lease_config_init(&c);
  c.url = "memory://c-shared-test";
  c.limit = 10;
  c.lease_size = 3;
  c.clock = LEASE_CLOCK_MANUAL;
  EXPECT(lease_limiter_new(&c, &a), LEASE_OK);
  EXPECT(lease_limiter_new(&c, &b), LEASE_OK);
  for (i = 0; i < 20; i++) {
    lease_limiter *l = (i % 2) ? a : b;
    EXPECT(lease_acquire(l, KEY("shared"), 1, &d), LEASE_OK);
    admitted += d.allowed;
  }
  CHECK(admitted == 10, "two limiters on one authority admitted %d of limit 10", admitted);
  lease_limiter_free(a);
  lease_limiter_free(b);
}

static void parse_helpers(void) {
  lease_mode m = 99;
  lease_failure_policy p = 99;
  uint64_t limit = 0, window = 0;
  EXPECT(lease_mode_parse("exact", &m), LEASE_OK);
  CHECK(m == LEASE_MODE_EXACT, "mode %u", m);
  EXPECT(lease_mode_parse("local", &m), LEASE_OK);
  CHECK(m == LEASE_MODE_LOCAL, "mode %u", m);
  EXPECT_ERR(lease_mode_parse("fast", &m), LEASE_ERR_CONFIG, "\"lease\"");
  EXPECT(lease_failure_policy_parse("deny", &p), LEASE_OK);
  CHECK(p == LEASE_FAILURE_DENY, "policy %u", p);
  EXPECT(lease_failure_policy_parse("static-share", &p), LEASE_OK);
  CHECK(p == LEASE_FAILURE_STATIC_SHARE, "policy %u", p);
  EXPECT_ERR(lease_failure_policy_parse("panic", &p), LEASE_ERR_CONFIG, "on_backend_failure");
  EXPECT(lease_parse_rate("600/min", &limit, &window), LEASE_OK);
  CHECK(limit == 600 && window == 60000, "%llu/%llu", (unsigned long long)limit, (unsigned long long)window);
  EXPECT(lease_parse_rate("100/30s", &limit, &window), LEASE_OK);
  CHECK(limit == 100 && window == 30000, "%llu/%llu", (unsigned long long)limit, (unsigned long long)window);
  EXPECT_ERR(lease_parse_rate("10/fortnight", &limit, &window), LEASE_ERR_CONFIG, "rate");
  EXPECT_ERR(lease_parse_rate(NULL, &limit, &window), LEASE_ERR_NULL, "rate");
  EXPECT_ERR(lease_parse_rate("1/s", NULL, &window), LEASE_ERR_NULL, "limit");
  EXPECT_ERR(lease_mode_parse(NULL, &m), LEASE_ERR_NULL, "name");
  EXPECT_ERR(lease_mode_parse("lease", NULL), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_failure_policy_parse("allow", NULL), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_mode_parse("\xff\xfe", &m), LEASE_ERR_UTF8, "UTF-8");
}

/* ---- bad input ---- */

static void null_handle_everywhere(void) {
  lease_decision d;
  struct lease_metrics m;
  size_t needed;
  char buf[8];
  EXPECT_ERR(lease_acquire(NULL, KEY("k"), 1, &d), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_try_acquire(NULL, KEY("k"), 1, &d), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_set_limit(NULL, KEY("k"), 1, 1), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_metrics(NULL, &m), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_metrics_prometheus(NULL, buf, sizeof buf, &needed), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_flush(NULL), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_close(NULL), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_set_event_callback(NULL, NULL, NULL), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_advance_clock(NULL, 1), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_settle(NULL), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_config_init(NULL), LEASE_ERR_NULL, "config");
  lease_limiter_free(NULL); /* a no-op */
}

static void null_out_params(void) {
  lease_limiter *l = manual_limiter(10, 1000, 2);
  lease_config c;
  EXPECT_ERR(lease_acquire(l, KEY("k"), 1, NULL), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_try_acquire(l, KEY("k"), 1, NULL), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_metrics(l, NULL), LEASE_ERR_NULL, "out");
  lease_config_init(&c);
  c.limit = 5;
  EXPECT_ERR(lease_limiter_new(&c, NULL), LEASE_ERR_NULL, "out");
  lease_limiter_free(l);
}

static void bad_keys(void) {
  lease_limiter *l = manual_limiter(10, 1000, 2);
  lease_decision d;
  char long_key[600];
  memset(long_key, 'x', sizeof long_key);
  EXPECT_ERR(lease_acquire(l, NULL, 3, 1, &d), LEASE_ERR_NULL, "key");
  EXPECT_ERR(lease_try_acquire(l, NULL, 1, 1, &d), LEASE_ERR_NULL, "key");
  EXPECT_ERR(lease_set_limit(l, NULL, 4, 1, 1), LEASE_ERR_NULL, "key");
  EXPECT_ERR(lease_acquire(l, NULL, 0, 1, &d), LEASE_ERR_INVALID_KEY, "empty");
  EXPECT_ERR(lease_acquire(l, (const uint8_t *)"", 0, 1, &d), LEASE_ERR_INVALID_KEY, "empty");
  EXPECT_ERR(lease_acquire(l, (const uint8_t *)long_key, 513, 1, &d), LEASE_ERR_INVALID_KEY, "512");
  EXPECT(lease_acquire(l, (const uint8_t *)long_key, 512, 1, &d), LEASE_OK);
  EXPECT_ERR(lease_acquire(l, (const uint8_t *)"ab\xff", 3, 1, &d), LEASE_ERR_UTF8, "UTF-8");
  EXPECT_ERR(lease_set_limit(l, (const uint8_t *)"\xc3", 1, 5, 5), LEASE_ERR_UTF8, "UTF-8");
  lease_limiter_free(l);
}

static void bad_costs(void) {
  lease_limiter *l = manual_limiter(10, 1000, 2);
  lease_decision d;
  /* Cold key, then warm key: both checked. */
  EXPECT_ERR(lease_acquire(l, KEY("k"), 0, &d), LEASE_ERR_INVALID_COST, "cost 0");
  EXPECT_ERR(lease_acquire(l, KEY("k"), 11, &d), LEASE_ERR_INVALID_COST, "limit (10)");
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  EXPECT_ERR(lease_acquire(l, KEY("k"), 0, &d), LEASE_ERR_INVALID_COST, "cost 0");
  EXPECT_ERR(lease_acquire(l, KEY("k"), 11, &d), LEASE_ERR_INVALID_COST, "cost 11");
  EXPECT_ERR(lease_try_acquire(l, KEY("k"), 0, &d), LEASE_ERR_INVALID_COST, "cost 0");
  EXPECT_ERR(lease_acquire(l, KEY("k"), UINT64_MAX, &d), LEASE_ERR_INVALID_COST, "cost");
  lease_limiter_free(l);
}

static lease_status new_with(lease_config *c, lease_limiter **out) {
  *out = (lease_limiter *)0x1; /* must be reset to NULL on failure */
  return lease_limiter_new(c, out);
}

static void bad_configs(void) {
  lease_config c;
  lease_limiter *l;
#define BAD(field_set, status, needle) \
  do { \
    lease_config_init(&c); \
    c.limit = 10; \
    field_set; \
    EXPECT_ERR(new_with(&c, &l), status, needle); \
    CHECK(l == NULL, "out not NULL after a failure"); \
  } while (0)
  BAD((void)0; c.limit = 0, LEASE_ERR_CONFIG, "`limit`");
  BAD(c.window_ms = 0, LEASE_ERR_CONFIG, "`window_ms`");
  BAD(c.lease_size = 0, LEASE_ERR_CONFIG, "`lease_size`");
  BAD(c.lease_size = 11, LEASE_ERR_CONFIG, "`lease_size`");
  BAD(c.lease_size = 4; c.refill_threshold = 5, LEASE_ERR_CONFIG, "`refill_threshold`");
  BAD(c.lease_ttl_ms = 0, LEASE_ERR_CONFIG, "`lease_ttl_ms`");
  BAD(c.expected_replicas = 0, LEASE_ERR_CONFIG, "`expected_replicas`");
  BAD(c.backend_timeout_ms = 0, LEASE_ERR_CONFIG, "`backend_timeout_ms`");
  BAD(c.max_keys = 0, LEASE_ERR_CONFIG, "`max_keys`");
  BAD(c.key_prefix = "a{b", LEASE_ERR_CONFIG, "`key_prefix`");
  BAD(c.url = "http://localhost", LEASE_ERR_CONFIG, "unknown scheme");
  BAD(c.url = "redis://:99999999", LEASE_ERR_CONFIG, "`url`");
  BAD(c.url = "", LEASE_ERR_CONFIG, "`url`");
  BAD(c.url = "memory:/x", LEASE_ERR_CONFIG, "`url`");
  BAD(c.url = "redis+cluster://", LEASE_ERR_CONFIG, "`url`");
  BAD(c.url = NULL, LEASE_ERR_NULL, "url");
  BAD(c.key_prefix = NULL, LEASE_ERR_NULL, "key_prefix");
  BAD(c.url = "redis://h\xff", LEASE_ERR_UTF8, "url");
  BAD(c.mode = 7, LEASE_ERR_CONFIG, "`mode`");
  BAD(c.on_backend_failure = 3, LEASE_ERR_CONFIG, "`on_backend_failure`");
  BAD(c.clock = 2, LEASE_ERR_CONFIG, "`clock`");
  /* The core's rule: a start needs the manual clock. */
  BAD(c.clock_start_ms = 5, LEASE_ERR_CONFIG, "`clock_start_ms`");
  BAD(c.limit = 1000000000000ULL; c.window_ms = 10000000, LEASE_ERR_CONFIG, "2^52");
#undef BAD
  EXPECT_ERR(new_with(NULL, &l), LEASE_ERR_NULL, "config");
  CHECK(l == NULL, "out not NULL after a NULL config");
}

/* ---- options by name ---- */

/* Options with a failing set reported; the caller frees them. */
static lease_options *new_options(void) {
  lease_options *o = NULL;
  if (lease_options_new(&o) != LEASE_OK) {
    fprintf(stderr, "lease_options_new: %s\n", lease_last_error());
    exit(2);
  }
  return o;
}

/* lease_acquire_wait: admitted once the refill covers the request, denied
 * at once with the hint when it cannot come in time; each request counted
 * once; bad arguments are errors, never a wait. */
static void acquire_wait_waits_for_the_refill(void) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  lease_decision d;
  struct lease_metrics m;
  EXPECT(lease_options_set_int(o, "limit", 2), LEASE_OK);
  EXPECT(lease_options_set_int(o, "window_ms", 1000), LEASE_OK);
  EXPECT(lease_options_set_int(o, "lease_size", 1), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_options_free(o);
  if (!l) return;
  EXPECT(lease_acquire(l, KEY("k"), 2, &d), LEASE_OK);
  CHECK(d.allowed, "the first two");
  EXPECT(lease_acquire_wait(l, KEY("k"), 2, NULL, 0, 10, &d), LEASE_OK);
  CHECK(!d.allowed && d.retry_after_ms > 10, "two tokens take a second: allowed %d retry %llu", d.allowed,
        (unsigned long long)d.retry_after_ms);
  EXPECT(lease_acquire_wait(l, KEY("k"), 1, NULL, 0, 30000, &d), LEASE_OK);
  CHECK(d.allowed, "the refill came: %s", lease_reason_name(d.reason));
  EXPECT(lease_metrics(l, &m), LEASE_OK);
  CHECK(m.admitted == 2 && m.denied == 1, "one count per request: admitted %llu denied %llu",
        (unsigned long long)m.admitted, (unsigned long long)m.denied);
  EXPECT_ERR(lease_acquire_wait(l, KEY("k"), 0, NULL, 0, 30000, &d), LEASE_ERR_INVALID_COST, "cost");
  EXPECT(lease_acquire_wait(l, KEY("k"), 1, NULL, 0, 30000, NULL), LEASE_ERR_NULL);
  EXPECT(lease_acquire_wait(l, KEY("k"), 1, NULL, 3, 30000, &d), LEASE_ERR_NULL);
  {
    uint64_t n = 99;
    EXPECT(lease_waiters(l, KEY("k"), &n), LEASE_OK);
    CHECK(n == 0, "no waiter left: %llu", (unsigned long long)n);
    EXPECT(lease_waiters(l, KEY("k"), NULL), LEASE_ERR_NULL);
  }
  EXPECT_ERR(lease_acquire_wait(l, KEY("k"), 1, (const uint8_t *)"gold", 4, 30000, &d), LEASE_ERR_CONFIG, "gold");
  lease_limiter_free(l);
}

/* Reserve, then settle: below the estimate the rest goes back, above it
 * the key owes it; settling twice, a denied reservation or a negative
 * actual is LEASE_ERR_RESERVATION; NULLs are LEASE_ERR_NULL. */
static void reserve_then_settle(void) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  lease_reservation *r = NULL, *denied = NULL;
  lease_decision d;
  struct lease_metrics m;
  int admitted = 0;
  EXPECT(lease_options_set_int(o, "limit", 100), LEASE_OK);
  EXPECT(lease_options_set_int(o, "window_ms", 3600000), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_options_free(o);
  if (!l) return;
  EXPECT(lease_reserve(l, KEY("k"), 40, NULL, 0, &d, &r), LEASE_OK);
  CHECK(d.allowed && r != NULL, "reserved 40 of 100");
  EXPECT(lease_reservation_settle(r, 10), LEASE_OK);
  EXPECT_ERR(lease_reservation_settle(r, 10), LEASE_ERR_RESERVATION, "settled already");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_RESERVATION), "reservation") == 0, "kind name");
  lease_reservation_free(r);
  r = NULL;
  while (admitted < 1000) {
    EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
    if (!d.allowed) break;
    admitted++;
  }
  CHECK(admitted == 90, "the key spent what was used (10): %d admitted after", admitted);
  EXPECT(lease_reserve(l, KEY("k"), 5, NULL, 0, &d, &denied), LEASE_OK);
  CHECK(!d.allowed && denied != NULL, "a denial is a handle too");
  EXPECT_ERR(lease_reservation_settle(denied, 0), LEASE_ERR_RESERVATION, "denied");
  lease_reservation_free(denied);
  EXPECT(lease_reserve(l, KEY("o"), 10, NULL, 0, &d, &r), LEASE_OK);
  EXPECT_ERR(lease_reservation_settle(r, -1), LEASE_ERR_RESERVATION, "got -1");
  EXPECT(lease_reservation_settle(r, 150), LEASE_OK);
  lease_reservation_free(r);
  EXPECT(lease_metrics(l, &m), LEASE_OK);
  CHECK(m.tokens_debited == 140, "the overage is counted: %llu", (unsigned long long)m.tokens_debited);
  EXPECT(lease_acquire(l, KEY("o"), 1, &d), LEASE_OK);
  CHECK(!d.allowed, "the key owes 50 tokens");
  EXPECT_ERR(lease_reserve(l, KEY("k"), 0, NULL, 0, &d, &r), LEASE_ERR_INVALID_COST, "cost");
  EXPECT(lease_reserve(l, KEY("k"), 1, NULL, 0, &d, NULL), LEASE_ERR_NULL);
  EXPECT(lease_reserve(l, KEY("k"), 1, NULL, 0, NULL, &r), LEASE_ERR_NULL);
  EXPECT(lease_reserve(NULL, KEY("k"), 1, NULL, 0, &d, &r), LEASE_ERR_NULL);
  EXPECT(lease_reservation_settle(NULL, 1), LEASE_ERR_NULL);
  lease_reservation_free(NULL);
  lease_limiter_free(l);
}

/* Shadow mode (the `shadow` option, 1 by integer or "true" by string):
 * every request the rules deny is admitted with LEASE_REASON_SHADOW and
 * counted in shadow_denied; 2 or "yes" is LEASE_ERR_CONFIG naming it. */
static void shadow_mode_admits_what_the_rules_deny(void) {
  int by_string;
  for (by_string = 0; by_string < 2; by_string++) {
    lease_options *o = new_options();
    lease_limiter *l = NULL;
    lease_decision d;
    struct lease_metrics m;
    int i, shadowed = 0;
    EXPECT(lease_options_set_int(o, "limit", 3), LEASE_OK);
    EXPECT(lease_options_set_int(o, "window_ms", 60000), LEASE_OK);
    EXPECT_ERR(lease_options_set_int(o, "shadow", 2), LEASE_ERR_CONFIG, "`shadow` must be true or false");
    EXPECT_ERR(lease_options_set_str(o, "shadow", "yes"), LEASE_ERR_CONFIG, "`shadow` must be true or false");
    if (by_string)
      EXPECT(lease_options_set_str(o, "shadow", "true"), LEASE_OK);
    else
      EXPECT(lease_options_set_int(o, "shadow", 1), LEASE_OK);
    EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
    lease_options_free(o);
    if (!l) return;
    for (i = 0; i < 5; i++) {
      EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
      CHECK(d.allowed, "request %d: shadow mode admits everything", i);
      if (d.reason == LEASE_REASON_SHADOW) {
        shadowed++;
        CHECK(d.remaining == 0 && d.retry_after_ms > 0, "the denial's figures: %llu %llu",
              (unsigned long long)d.remaining, (unsigned long long)d.retry_after_ms);
      }
    }
    CHECK(shadowed == 2, "3 of 5 fit a 3/min bucket: %d shadowed", shadowed);
    CHECK(strcmp(lease_reason_name(LEASE_REASON_SHADOW), "shadow") == 0, "%s", lease_reason_name(LEASE_REASON_SHADOW));
    EXPECT(lease_metrics(l, &m), LEASE_OK);
    CHECK(m.shadow_denied == 2 && m.denied == 2 && m.admitted == 3, "shadow_denied %llu denied %llu admitted %llu",
          (unsigned long long)m.shadow_denied, (unsigned long long)m.denied, (unsigned long long)m.admitted);
    lease_limiter_free(l);
  }
}

/* Every option set by name, in snake_case and in camelCase, then checked
 * through what the limiter does. */
static void options_by_name_every_option(void) {
  static const char *const names[2][19] = {
      {"url", "limit", "window_ms", "lease_size", "refill_threshold", "lease_ttl_ms", "on_backend_failure",
       "expected_replicas", "backend_timeout_ms", "key_prefix", "max_keys", "mode", "clock", "clock_start_ms",
       "rate", "tiers", "default_tier", "policy_file", "policy_refresh_ms"},
      {"url", "limit", "windowMs", "leaseSize", "refillThreshold", "leaseTtlMs", "onBackendFailure",
       "expectedReplicas", "backendTimeoutMs", "keyPrefix", "maxKeys", "mode", "clock", "clockStartMs", "rate",
       "tiers", "defaultTier", "policyFile", "policyRefreshMs"},
  };
  int spelling;
  for (spelling = 0; spelling < 2; spelling++) {
    const char *const *n = names[spelling];
    lease_options *o = new_options();
    lease_limiter *l = NULL;
    lease_decision d;
    struct lease_metrics m;
    char url[64];
    snprintf(url, sizeof url, "memory://c-options-%d", spelling);
    EXPECT(lease_options_set_str(o, n[0], url), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[1], 10), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[2], 1000), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[3], 4), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[4], 1), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[5], 500), LEASE_OK);
    EXPECT(lease_options_set_str(o, n[6], "deny"), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[7], 2), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[8], 100), LEASE_OK);
    EXPECT(lease_options_set_str(o, n[9], "p"), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[10], 7), LEASE_OK);
    EXPECT(lease_options_set_str(o, n[11], "lease"), LEASE_OK);
    EXPECT(lease_options_set_str(o, n[12], "manual"), LEASE_OK);
    EXPECT(lease_options_set_int(o, n[13], 0), LEASE_OK);
    EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
    if (!l) {
      lease_options_free(o);
      return;
    }
    EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
    CHECK(d.allowed && d.reason == LEASE_REASON_LEASE, "reason %s", lease_reason_name(d.reason));
    CHECK(d.limit == 10 && d.window_ms == 1000, "limit %llu window %llu", (unsigned long long)d.limit,
          (unsigned long long)d.window_ms);
    EXPECT(lease_metrics(l, &m), LEASE_OK);
    CHECK(m.tokens_leased == 4, "lease_size: leased %llu", (unsigned long long)m.tokens_leased);
    EXPECT(lease_advance_clock(l, 10), LEASE_OK); /* the manual clock */
    lease_limiter_free(l);
    /* rate, alone: the options above name limit and window_ms, so a fresh set. */
    lease_options_free(o);
    o = new_options();
    EXPECT(lease_options_set_str(o, n[14], "600/min"), LEASE_OK);
    EXPECT(lease_options_set_str(o, n[11], "local"), LEASE_OK);
    EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
    if (l) {
      EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
      CHECK(d.limit == 600 && d.window_ms == 60000 && d.reason == LEASE_REASON_LOCAL, "rate: %llu/%llu %s",
            (unsigned long long)d.limit, (unsigned long long)d.window_ms, lease_reason_name(d.reason));
      lease_limiter_free(l);
    }
    lease_options_free(o);
    /* The policy options: tiers, a default tier, a policy file (which gives
     * key "vip" its own rules) and the store's refresh period. */
    {
      char path[64];
      FILE *f;
      char text[512];
      size_t needed = 0;
      snprintf(path, sizeof path, "/tmp/ql-c-policy-%d-%d.toml", (int)getpid(), spelling);
      f = fopen(path, "w");
      CHECK(f != NULL, "cannot write %s", path);
      if (!f) return;
      fputs("[keys]\n\"vip\" = \"7/s, 70/min\"\n", f);
      fclose(f);
      o = new_options();
      snprintf(url, sizeof url, "memory://c-options-tiers-%d", spelling);
      EXPECT(lease_options_set_str(o, n[0], url), LEASE_OK);
      EXPECT(lease_options_set_str(o, n[12], "manual"), LEASE_OK);
      EXPECT(lease_options_set_str(o, n[15], "free=2/s; pro=5/s, 50/min"), LEASE_OK);
      EXPECT(lease_options_set_str(o, n[16], "free"), LEASE_OK);
      EXPECT(lease_options_set_str(o, n[17], path), LEASE_OK);
      EXPECT(lease_options_set_int(o, n[18], 0), LEASE_OK);
      EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
      lease_options_free(o);
      if (l) {
        EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
        CHECK(d.limit == 2 && d.window_ms == 1000 && d.rule_count == 1, "default tier: %llu/%llu (%u rules)",
              (unsigned long long)d.limit, (unsigned long long)d.window_ms, d.rule_count);
        EXPECT(lease_acquire_tier(l, KEY("p"), 1, KEY("pro"), &d), LEASE_OK);
        CHECK(d.rule_count == 2 && d.rule_limits[0] == 5 && d.rule_window_ms[1] == 60000, "pro: %u rules",
              d.rule_count);
        EXPECT(lease_acquire_tier(l, KEY("vip"), 1, KEY("pro"), &d), LEASE_OK);
        CHECK(d.rule_count == 2 && d.rule_limits[0] == 7 && d.rule_limits[1] == 70, "vip: %u rules %llu",
              d.rule_count, (unsigned long long)d.rule_limits[0]);
        EXPECT(lease_policy_describe(l, KEY("vip"), NULL, 0, text, sizeof text, &needed), LEASE_OK);
        CHECK(strcmp(text, "rules: 7/s, 70/min\nsource: own rules (from file)\n") == 0, "vip: %s", text);
        /* policy_refresh_ms 0 (the default): no store to write to. */
        EXPECT_ERR(lease_policy_set_tier(l, "gold", "1/s", NULL), LEASE_ERR_CONFIG, "policy_refresh_ms");
        lease_limiter_free(l);
      }
      remove(path);
    }
  }
}

/* Plan tiers by name: the tier a call names picks the key's rules, no tier
 * is the default tier, and an unknown or unreadable tier is a clear
 * LEASE_ERR_CONFIG naming it (never a crash, never unlimited). */
static void tiers_pick_the_rules(void) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  lease_decision d;
  char text[512];
  size_t needed = 0;
  EXPECT(lease_options_set_str(o, "url", "memory://c-tiers"), LEASE_OK);
  EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
  EXPECT(lease_options_set_int(o, "lease_size", 1), LEASE_OK);
  EXPECT(lease_options_set_str(o, "tiers", "free=2/s; pro=5/s"), LEASE_OK);
  EXPECT(lease_options_set_str(o, "default_tier", "free"), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_options_free(o);
  if (!l) return;
  EXPECT(lease_acquire_tier(l, KEY("a"), 1, NULL, 0, &d), LEASE_OK);
  CHECK(d.allowed && d.limit == 2 && d.remaining == 1 && d.rule == 0 && d.rule_count == 1 &&
            d.rule_limits[0] == 2 && d.rule_window_ms[0] == 1000 && d.rule_limits[1] == 0,
        "no tier = default tier free: limit %llu remaining %llu", (unsigned long long)d.limit,
        (unsigned long long)d.remaining);
  EXPECT(lease_acquire(l, KEY("a"), 1, &d), LEASE_OK);
  CHECK(d.allowed && d.limit == 2 && d.remaining == 0, "lease_acquire is the default tier too");
  EXPECT(lease_try_acquire_tier(l, KEY("b"), 1, KEY("pro"), &d), LEASE_OK);
  CHECK(d.limit == 5 && d.window_ms == 1000, "pro: limit %llu", (unsigned long long)d.limit);
  EXPECT(lease_acquire_tier(l, KEY("b"), 1, KEY("pro"), &d), LEASE_OK);
  CHECK(d.allowed && d.limit == 5, "pro: limit %llu", (unsigned long long)d.limit);
  EXPECT(lease_policy_describe(l, KEY("b"), KEY("pro"), text, sizeof text, &needed), LEASE_OK);
  CHECK(strcmp(text, "rules: 5/s\ntier: pro\nsource: tier pro (assigned by caller, defined in config)\n") == 0,
        "describe: %s", text);
  CHECK(needed == strlen(text) + 1, "needed %zu", needed);
  EXPECT(lease_policy_describe(l, KEY("b"), KEY("pro"), text, 4, &needed), LEASE_ERR_BUFFER_TOO_SMALL);
  CHECK(text[0] == '\0' && needed > 4, "needed %zu", needed);

  /* Bad tiers: each a status with a message, *out untouched. */
  memset(&d, 0x5a, sizeof d);
  EXPECT_ERR(lease_acquire_tier(l, KEY("c"), 1, KEY("gold"), &d), LEASE_ERR_CONFIG, "gold");
  CHECK(strstr(lease_last_error(), "free") && strstr(lease_last_error(), "pro"), "names the known tiers: %s",
        lease_last_error());
  CHECK(d.limit == 0x5a5a5a5a5a5a5a5aULL, "out written on failure");
  EXPECT_ERR(lease_try_acquire_tier(l, KEY("c"), 1, KEY("gold"), &d), LEASE_ERR_CONFIG, "gold");
  EXPECT_ERR(lease_acquire_tier(l, KEY("c"), 1, (const uint8_t *)"pr\xffo", 4, &d), LEASE_ERR_CONFIG,
             "not valid UTF-8");
  EXPECT_ERR(lease_acquire_tier(l, KEY("c"), 1, (const uint8_t *)"", 0, &d), LEASE_ERR_CONFIG, "tier");
  EXPECT_ERR(lease_acquire_tier(l, KEY("c"), 1, NULL, 3, &d), LEASE_ERR_NULL, "tier");
  EXPECT_ERR(lease_acquire_tier(l, KEY("c"), 1, KEY("pro"), NULL), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_acquire_tier(NULL, KEY("c"), 1, KEY("pro"), &d), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_acquire_tier(l, KEY(""), 1, KEY("pro"), &d), LEASE_ERR_INVALID_KEY, "key");
  EXPECT_ERR(lease_acquire_tier(l, KEY("c"), 6, KEY("pro"), &d), LEASE_ERR_INVALID_COST, "cost");
  EXPECT_ERR(lease_policy_describe(l, KEY("c"), KEY("gold"), text, sizeof text, NULL), LEASE_ERR_CONFIG, "gold");
  EXPECT_ERR(lease_policy_describe(NULL, KEY("c"), NULL, 0, text, sizeof text, NULL), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_policy_describe(l, KEY("c"), NULL, 0, NULL, 8, NULL), LEASE_ERR_NULL, "buf");
  EXPECT(lease_close(l), LEASE_OK);
  EXPECT_ERR(lease_acquire_tier(l, KEY("a"), 1, KEY("pro"), &d), LEASE_ERR_CLOSED, "closed");
  lease_limiter_free(l);

  /* Malformed tiers are configuration errors when the limiter is built. */
  {
    static const char *const bad[] = {"x=1/fortnight", "x=1/s, 2/s", "b@d=1/s", "free", "x=1/s,1/2s,1/3s,1/4s,1/5s"};
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      o = new_options();
      EXPECT_ERR(lease_options_set_str(o, "tiers", bad[i]), LEASE_ERR_CONFIG, "`tiers`");
      lease_options_free(o);
    }
    o = new_options();
    EXPECT(lease_options_set_str(o, "tiers", "free=1/s"), LEASE_OK);
    EXPECT(lease_options_set_str(o, "default_tier", "gold"), LEASE_OK);
    l = NULL;
    EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "gold");
    CHECK(l == NULL, "no limiter on failure");
    lease_options_free(o);
  }
}

/* A tier of two rules: admitted only when both admit; when the second
 * denies, the first rule's token goes back (it admits again at once). The
 * decision names the binding rule and lists both, and the headers list
 * both policies. */
static void two_rules_with_a_refund(void) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  lease_decision d;
  char buf[512];
  size_t needed = 0;
  int i;
  EXPECT(lease_options_set_str(o, "url", "memory://c-two-rules"), LEASE_OK);
  EXPECT(lease_options_set_str(o, "rate", "100/s"), LEASE_OK);
  EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
  EXPECT(lease_options_set_int(o, "lease_size", 1), LEASE_OK);
  EXPECT(lease_options_set_int(o, "refill_threshold", 0), LEASE_OK);
  EXPECT(lease_options_set_str(o, "tiers", "burst=2/s, 3/10s"), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_options_free(o);
  if (!l) return;
  EXPECT(lease_acquire_tier(l, KEY("k"), 1, KEY("burst"), &d), LEASE_OK);
  CHECK(d.allowed && d.rule == 0 && d.limit == 2 && d.remaining == 1, "first: rule %u limit %llu remaining %llu",
        d.rule, (unsigned long long)d.limit, (unsigned long long)d.remaining);
  CHECK(d.rule_count == 2 && d.rule_limits[0] == 2 && d.rule_window_ms[0] == 1000 && d.rule_limits[1] == 3 &&
            d.rule_window_ms[1] == 10000 && d.rule_limits[2] == 0 && d.rule_window_ms[3] == 0,
        "rules: %u", d.rule_count);
  EXPECT(lease_acquire_tier(l, KEY("k"), 1, KEY("burst"), &d), LEASE_OK);
  CHECK(d.allowed && d.remaining == 0, "second admitted");
  EXPECT(lease_acquire_tier(l, KEY("k"), 1, KEY("burst"), &d), LEASE_OK);
  CHECK(!d.allowed && d.rule == 0 && d.reason == LEASE_REASON_EXHAUSTED, "third: the 1 s rule denies");
  EXPECT(lease_advance_clock(l, 1000), LEASE_OK);
  EXPECT(lease_settle(l), LEASE_OK);
  EXPECT(lease_acquire_tier(l, KEY("k"), 1, KEY("burst"), &d), LEASE_OK);
  CHECK(d.allowed && d.rule == 1 && d.limit == 3 && d.window_ms == 10000 && d.remaining == 0,
        "the 10 s rule binds: rule %u limit %llu remaining %llu", d.rule, (unsigned long long)d.limit,
        (unsigned long long)d.remaining);
  EXPECT(lease_decision_headers(&d, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strstr(buf, "RateLimit-Policy: \"1s\";q=2;w=1, \"10s\";q=3;w=10\r\nRateLimit: \"10s\";r=0;") == buf,
        "headers: %s", buf);
  /* Now the 1 s rule has a token and the 10 s rule none: the 10 s rule
   * denies, and the token the 1 s rule took for this request goes back. */
  EXPECT(lease_acquire_tier(l, KEY("k"), 1, KEY("burst"), &d), LEASE_OK);
  CHECK(!d.allowed && d.rule == 1 && d.reason == LEASE_REASON_EXHAUSTED, "the 10 s rule denies: rule %u allowed %d",
        d.rule, d.allowed);
  EXPECT(lease_decision_headers(&d, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strstr(buf, "Retry-After: ") != NULL && strstr(buf, "RateLimit: \"10s\"") != NULL, "denied: %s", buf);
  {
    struct lease_metrics m;
    EXPECT(lease_metrics(l, &m), LEASE_OK);
    /* 3 admitted, 2 denied, each request counted once; the refunded token
     * is held locally for the 1 s rule: the overshoot bound shows it. */
    CHECK(m.admitted == 3 && m.denied == 2, "admitted %llu denied %llu", (unsigned long long)m.admitted,
          (unsigned long long)m.denied);
    CHECK(m.overshoot_bound == 1, "overshoot_bound %llu (the refunded token)", (unsigned long long)m.overshoot_bound);
  }
  for (i = 0; i < 2; i++) EXPECT(lease_advance_clock(l, 3500), LEASE_OK);
  EXPECT(lease_settle(l), LEASE_OK);
  EXPECT(lease_acquire_tier(l, KEY("k"), 1, KEY("burst"), &d), LEASE_OK);
  CHECK(d.allowed, "admitted again once the 10 s rule refilled");
  lease_limiter_free(l);
}

/* The headers of a hand-made decision: rule_count 0 is one rule; bad rule
 * fields are LEASE_ERR_CONFIG, not a crash. */
static void decision_headers_of_several_rules(void) {
  lease_decision d;
  char buf[512];
  size_t needed = 0;
  memset(&d, 0, sizeof d);
  d.allowed = false;
  d.reason = LEASE_REASON_EXHAUSTED;
  d.limit = 10000;
  d.window_ms = 86400000;
  d.retry_after_ms = 8640;
  d.reset_after_ms = 86400000;
  d.rule = 1;
  d.rule_count = 2;
  d.rule_limits[0] = 10;
  d.rule_window_ms[0] = 1000;
  d.rule_limits[1] = 10000;
  d.rule_window_ms[1] = 86400000;
  EXPECT(lease_decision_headers(&d, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf,
               "RateLimit-Policy: \"1s\";q=10;w=1, \"1day\";q=10000;w=86400\r\n"
               "RateLimit: \"1day\";r=0;t=86400\r\n"
               "Retry-After: 9\r\n") == 0,
        "got %s", buf);
  d.rule = 2;
  EXPECT_ERR(lease_decision_headers(&d, buf, sizeof buf, NULL), LEASE_ERR_CONFIG, "rule");
  d.rule = 0;
  d.rule_count = LEASE_MAX_RULES + 1;
  EXPECT_ERR(lease_decision_headers(&d, buf, sizeof buf, NULL), LEASE_ERR_CONFIG, "rule_count");
  d.rule_count = 2;
  d.rule_window_ms[1] = 1000;
  EXPECT_ERR(lease_decision_headers(&d, buf, sizeof buf, NULL), LEASE_ERR_CONFIG, "window");
  d.rule_window_ms[1] = 0;
  EXPECT_ERR(lease_decision_headers(&d, buf, sizeof buf, NULL), LEASE_ERR_CONFIG, "decision");
}

/* ---- calendar quotas ("50/day@Europe/Berlin") ---- */

/* 2026-12-04T22:00:00Z and 2026-12-04T12:00:00Z as Unix ms: a manual
 * clock's readings are Unix ms, so clock_start_ms sets the date. */
#define DEC_4_2026_22H 1796421600000ULL
#define DEC_4_2026_12H 1796385600000ULL

/* A limiter on its own memory authority with a manual clock set to
 * `start_ms`, from `rate` or from `tiers` with `default_tier` "pro"; NULL
 * (and a failed check) if it cannot be built. */
static lease_limiter *calendar_limiter(const char *url, const char *rate, const char *tiers, uint64_t start_ms) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  EXPECT(lease_options_set_str(o, "url", url), LEASE_OK);
  EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
  EXPECT(lease_options_set_int(o, "clock_start_ms", (int64_t)start_ms), LEASE_OK);
  if (rate) EXPECT(lease_options_set_str(o, "rate", rate), LEASE_OK);
  if (tiers) {
    EXPECT(lease_options_set_str(o, "tiers", tiers), LEASE_OK);
    EXPECT(lease_options_set_str(o, "default_tier", "pro"), LEASE_OK);
  }
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_options_free(o);
  return l;
}

/* Requests of cost 1 admitted on `key` at this instant until the first
 * denial, which is left in *last. At most 1000 (then it stops: a failure). */
static int drain(lease_limiter *l, const char *key, lease_decision *last) {
  int n = 0;
  for (;;) {
    lease_status s = lease_acquire(l, KEY(key), 1, last);
    CHECK(s == LEASE_OK, "acquire %d returned %d", n, (int)s);
    if (s != LEASE_OK || !last->allowed || n >= 1000) return n;
    n++;
  }
}

/* At 22:00 UTC on 2026-12-04 it is 23:00 in Berlin: a daily quota there
 * gives 50, then denies until Berlin's midnight an hour away (not a token
 * bucket's refill: nothing comes back within the day), and the whole quota
 * returns at that instant. The reset and Retry-After are the true ones. */
static void calendar_day_in_berlin_across_midnight(void) {
  lease_limiter *l = calendar_limiter("memory://c-cal-berlin", "50/day@Europe/Berlin", NULL, DEC_4_2026_22H);
  lease_decision d;
  char buf[512];
  char text[512];
  size_t needed = 0;
  if (!l) return;
  CHECK(drain(l, "k", &d) == 50, "the day's quota is 50");
  CHECK(!d.allowed && d.reason == LEASE_REASON_EXHAUSTED, "denied, exhausted: reason %u", d.reason);
  CHECK(d.retry_after_ms == 3600000 && d.reset_after_ms == 3600000, "until Berlin's midnight: retry %llu reset %llu",
        (unsigned long long)d.retry_after_ms, (unsigned long long)d.reset_after_ms);
  CHECK(d.limit == 50 && d.window_ms == 86400000 && d.remaining == 0, "limit %llu window %llu remaining %llu",
        (unsigned long long)d.limit, (unsigned long long)d.window_ms, (unsigned long long)d.remaining);
  CHECK(d.rule == 0 && d.rule_count == 1 && d.rule_limits[0] == 50 && d.rule_window_ms[0] == 86400000,
        "one rule: rule %u of %u", d.rule, d.rule_count);
  EXPECT(lease_decision_headers(&d, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf,
               "RateLimit-Policy: \"default\";q=50;w=86400\r\n"
               "RateLimit: \"default\";r=0;t=3600\r\n"
               "Retry-After: 3600\r\n") == 0,
        "headers: %s", buf);
  EXPECT(lease_policy_describe(l, KEY("k"), NULL, 0, text, sizeof text, NULL), LEASE_OK);
  CHECK(strncmp(text, "rules: 50/day@Europe/Berlin\n", 28) == 0, "describe: %s", text);

  /* One ms before midnight: still the same day, still denied. */
  EXPECT(lease_advance_clock(l, 3600000 - 1), LEASE_OK);
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(!d.allowed && d.retry_after_ms == 1 && d.reset_after_ms == 1,
        "a token bucket would have refilled: allowed %d retry %llu reset %llu", d.allowed,
        (unsigned long long)d.retry_after_ms, (unsigned long long)d.reset_after_ms);
  /* Midnight in Berlin: the next day's whole quota, reset a day away. */
  EXPECT(lease_advance_clock(l, 1), LEASE_OK);
  CHECK(drain(l, "k", &d) == 50, "the next day's quota");
  CHECK(!d.allowed && d.retry_after_ms == 86400000 && d.reset_after_ms == 86400000, "retry %llu reset %llu",
        (unsigned long long)d.retry_after_ms, (unsigned long long)d.reset_after_ms);
  lease_limiter_free(l);
}

/* A calendar quota as one rule of a tier ("10/s, 25/day@UTC"): ten seconds
 * of 10/s are held to 25 for the day; the daily rule binds the denial with
 * the time to UTC midnight, and the headers name it "1day". */
static void calendar_rule_in_a_tier(void) {
  lease_limiter *l = calendar_limiter("memory://c-cal-tier", NULL, "pro=10/s, 25/day@UTC", DEC_4_2026_12H);
  lease_decision d;
  char buf[512];
  char text[512];
  size_t needed = 0;
  int i, total = 0;
  static const int per_second[10] = {10, 10, 5, 0, 0, 0, 0, 0, 0, 0};
  if (!l) return;
  for (i = 0; i < 10; i++) {
    int n = drain(l, "k", &d);
    CHECK(n == per_second[i], "second %d: %d admitted, expected %d", i, n, per_second[i]);
    CHECK(d.rule == (i < 2 ? 0u : 1u), "second %d: rule %u binds", i, d.rule);
    total += n;
    EXPECT(lease_advance_clock(l, 1000), LEASE_OK);
  }
  CHECK(total == 25, "ten seconds of 10/s held to 25 a day: %d", total);
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(!d.allowed && d.reason == LEASE_REASON_EXHAUSTED && d.rule == 1, "the daily rule denies: rule %u", d.rule);
  CHECK(d.rule_count == 2 && d.rule_limits[0] == 10 && d.rule_window_ms[0] == 1000 && d.rule_limits[1] == 25 &&
            d.rule_window_ms[1] == 86400000 && d.rule_limits[2] == 0,
        "rules: %u", d.rule_count);
  CHECK(d.limit == 25 && d.window_ms == 86400000 && d.remaining == 0, "the binding rule's fields: limit %llu",
        (unsigned long long)d.limit);
  /* 12:00:10 UTC: midnight is 12 h - 10 s away. */
  CHECK(d.retry_after_ms == 43190000 && d.reset_after_ms == 43190000, "retry %llu reset %llu",
        (unsigned long long)d.retry_after_ms, (unsigned long long)d.reset_after_ms);
  EXPECT(lease_decision_headers(&d, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf,
               "RateLimit-Policy: \"1s\";q=10;w=1, \"1day\";q=25;w=86400\r\n"
               "RateLimit: \"1day\";r=0;t=43190\r\n"
               "Retry-After: 43190\r\n") == 0,
        "headers: %s", buf);
  EXPECT(lease_policy_describe(l, KEY("k"), NULL, 0, text, sizeof text, NULL), LEASE_OK);
  CHECK(strcmp(text, "rules: 10/s, 25/day@UTC\ntier: pro\nsource: tier pro (assigned by default_tier, defined in config)\n") ==
            0,
        "describe: %s", text);
  /* UTC midnight: the day's quota is back, and the 1 s rule binds again. */
  EXPECT(lease_advance_clock(l, d.retry_after_ms), LEASE_OK);
  CHECK(drain(l, "k", &d) == 10, "the next day: 10/s again");
  CHECK(!d.allowed && d.rule == 0, "the 1 s rule denies: rule %u", d.rule);
  lease_limiter_free(l);
}

/* Bad calendar rules are LEASE_ERR_CONFIG with the core's message, when
 * the option is set or at the latest when the limiter is built; calendar
 * quotas need adaptive leasing. */
static lease_status calendar_build(const char *rate, const char *tiers, const char *mode, int64_t lease_size) {
  lease_options *o = new_options();
  lease_limiter *l = (lease_limiter *)0x1;
  lease_status s = LEASE_OK;
  if (rate) s = lease_options_set_str(o, "rate", rate);
  if (s == LEASE_OK && tiers) s = lease_options_set_str(o, "tiers", tiers);
  if (s == LEASE_OK && tiers && !rate) s = lease_options_set_int(o, "limit", 5);
  if (s == LEASE_OK && mode) s = lease_options_set_str(o, "mode", mode);
  if (s == LEASE_OK && lease_size) s = lease_options_set_int(o, "lease_size", lease_size);
  if (s == LEASE_OK) {
    s = lease_limiter_new_from_options(o, &l);
    if (s == LEASE_OK) lease_limiter_free(l);
    else CHECK(l == NULL, "out not NULL after a failure");
  }
  lease_options_free(o);
  return s;
}

static void calendar_bad_input(void) {
  static const struct {
    const char *rate, *tiers, *mode;
    int64_t lease_size;
    const char *want;
  } bad[] = {
      {"10/month@Mars/Olympus", NULL, NULL, 0, "does not know"},
      {"10/month", NULL, NULL, 0, "needs a time zone"},
      {"10/day@billing-day-3", NULL, NULL, 0, "only months have one"},
      {"10/month@billing-day-40", NULL, NULL, 0, "1 to 31"},
      {"9999999/month@UTC", NULL, NULL, 0, "at most 1737499 per month"},
      {NULL, "pro=10/s, 25/day@Mars/Olympus", NULL, 0, "does not know"},
      {"10/day@UTC", NULL, "exact", 0, "needs adaptive leasing"},
      {"10/day@UTC", NULL, "local", 0, "needs adaptive leasing"},
      {"10/day@UTC", NULL, NULL, 2, "needs adaptive leasing"},
      {NULL, "t=10/day@UTC", "local", 0, "needs adaptive leasing"},
  };
  uint64_t limit = 0, window = 0;
  size_t i;
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lease_status s = calendar_build(bad[i].rate, bad[i].tiers, bad[i].mode, bad[i].lease_size);
    CHECK(s == LEASE_ERR_CONFIG, "%s / %s: status %d", bad[i].rate ? bad[i].rate : "", bad[i].tiers ? bad[i].tiers : "",
          (int)s);
    CHECK(strstr(lease_last_error(), bad[i].want) != NULL, "%s / %s: message lacks \"%s\"",
          bad[i].rate ? bad[i].rate : "", bad[i].tiers ? bad[i].tiers : "", bad[i].want);
  }
  /* The good forms build. */
  EXPECT(calendar_build("1737499/month@UTC", NULL, NULL, 0), LEASE_OK);
  EXPECT(calendar_build("30/month@billing-day-31 America/New_York", NULL, NULL, 0), LEASE_OK);
  EXPECT(calendar_build(NULL, "pro=10/s, 100/week@Europe/Berlin, 1000/year@Asia/Tokyo", NULL, 0), LEASE_OK);
  /* lease_parse_rate answers a limit and a window, which cannot carry a
   * calendar: a calendar quota is an error there, never a fixed window. */
  EXPECT_ERR(lease_parse_rate("10/day@UTC", &limit, &window), LEASE_ERR_CONFIG, "rate");
  CHECK(limit == 0 && window == 0, "written on failure: %llu/%llu", (unsigned long long)limit,
        (unsigned long long)window);
  /* With no "@", a day is a fixed window of 24 hours (a token bucket). */
  EXPECT(lease_parse_rate("1000/day", &limit, &window), LEASE_OK);
  CHECK(limit == 1000 && window == 86400000, "%llu/%llu", (unsigned long long)limit, (unsigned long long)window);
}

/* The shared store: one limiter writes (a tier, a key's assignment), a
 * second one on the same memory:// store sees it after
 * lease_refresh_policies, and bad input is a clear status. */
static void store_is_shared_after_refresh(void) {
  lease_limiter *ls[2] = {NULL, NULL};
  lease_decision d;
  char text[512];
  size_t needed = 0;
  uint64_t v1 = 0, v2 = 0;
  int i;
  for (i = 0; i < 2; i++) {
    lease_options *o = new_options();
    EXPECT(lease_options_set_str(o, "url", "memory://c-store"), LEASE_OK);
    EXPECT(lease_options_set_str(o, "rate", "100/s"), LEASE_OK);
    EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
    EXPECT(lease_options_set_int(o, "lease_size", 1), LEASE_OK);
    EXPECT(lease_options_set_str(o, "tiers", "free=2/s; pro=4/s"), LEASE_OK);
    EXPECT(lease_options_set_int(o, "policy_refresh_ms", 1000), LEASE_OK);
    EXPECT(lease_limiter_new_from_options(o, &ls[i]), LEASE_OK);
    lease_options_free(o);
    if (!ls[i]) return;
  }
  EXPECT(lease_acquire_tier(ls[1], KEY("k"), 1, KEY("free"), &d), LEASE_OK);
  CHECK(d.limit == 2, "before: free, limit %llu", (unsigned long long)d.limit);
  EXPECT(lease_policy_get(ls[0], KEY("k"), text, sizeof text, &needed), LEASE_OK);
  CHECK(text[0] == '\0' && needed == 1, "no entry: \"%s\"", text);

  EXPECT(lease_policy_assign(ls[0], KEY("k"), "tier:pro", &v1), LEASE_OK);
  EXPECT(lease_policy_set_tier(ls[0], "gold", "3/s, 20/min", &v2), LEASE_OK);
  CHECK(v2 > v1 && v1 > 0, "versions grow: %llu then %llu", (unsigned long long)v1, (unsigned long long)v2);
  EXPECT(lease_policy_get(ls[1], KEY("k"), text, sizeof text, &needed), LEASE_OK);
  CHECK(strcmp(text, "tier:pro") == 0 && needed == 9, "entry: %s", text);
  EXPECT(lease_refresh_policies(ls[1]), LEASE_OK);
  EXPECT(lease_acquire_tier(ls[1], KEY("k"), 1, KEY("free"), &d), LEASE_OK);
  CHECK(d.limit == 4, "after: the store's tier:pro wins over the free named, limit %llu", (unsigned long long)d.limit);
  EXPECT(lease_policy_describe(ls[1], KEY("k"), KEY("free"), text, sizeof text, NULL), LEASE_OK);
  CHECK(strcmp(text, "rules: 4/s\ntier: pro\nsource: tier pro (assigned by store, defined in config)\n") == 0,
        "describe: %s", text);
  EXPECT(lease_acquire_tier(ls[1], KEY("g"), 1, KEY("gold"), &d), LEASE_OK);
  CHECK(d.rule_count == 2 && d.rule_limits[0] == 3 && d.rule_limits[1] == 20, "gold from the store: %u rules",
        d.rule_count);
  /* allow and deny entries: reasons of their own, nothing spent or admitted */
  EXPECT(lease_policy_assign(ls[0], KEY("bot"), "blocked", NULL), LEASE_OK);
  EXPECT(lease_policy_assign(ls[0], KEY("ops"), "unlimited", NULL), LEASE_OK);
  EXPECT(lease_refresh_policies(ls[1]), LEASE_OK);
  for (i = 0; i < 3; i++) {
    EXPECT(lease_acquire(ls[1], KEY("bot"), 1, &d), LEASE_OK);
    CHECK(!d.allowed && d.reason == LEASE_REASON_BLOCKED, "bot: %s", lease_reason_name(d.reason));
  }
  for (i = 0; i < 300; i++) {
    EXPECT(lease_acquire(ls[1], KEY("ops"), 1, &d), LEASE_OK);
    CHECK(d.allowed && d.reason == LEASE_REASON_UNLIMITED, "ops: %s", lease_reason_name(d.reason));
  }
  CHECK(strcmp(lease_reason_name(LEASE_REASON_BLOCKED), "blocked") == 0 &&
            strcmp(lease_reason_name(LEASE_REASON_UNLIMITED), "unlimited") == 0,
        "names");
  EXPECT(lease_policy_describe(ls[1], KEY("bot"), NULL, 0, text, sizeof text, NULL), LEASE_OK);
  CHECK(strstr(text, "source: blocked (from store)") != NULL, "describe: %s", text);
  {
    struct lease_inspection in;
    memset(&in, 0, sizeof in);
    EXPECT(lease_inspect_policy(ls[1], KEY("g"), &in, text, sizeof text, &needed), LEASE_OK);
    CHECK(strcmp(text, "rules: 3/s, 20/min\ntier: gold\nsource: tier gold (assigned by caller, defined in store)\n") ==
              0,
          "inspect: %s", text);
    CHECK(in.limit == 3 && in.window_ms == 1000 && in.admitted == 1, "inspection: limit %llu admitted %llu",
          (unsigned long long)in.limit, (unsigned long long)in.admitted);
    memset(&in, 0x5a, sizeof in);
    EXPECT(lease_inspect_policy(ls[1], KEY("g"), &in, text, 4, &needed), LEASE_ERR_BUFFER_TOO_SMALL);
    CHECK(in.limit == 0x5a5a5a5a5a5a5a5aULL && needed > 4, "out untouched when the buffer is small");
    EXPECT(lease_inspect_policy(ls[1], KEY("g"), NULL, text, sizeof text, NULL), LEASE_OK);
    EXPECT_ERR(lease_inspect_policy(ls[1], KEY(""), NULL, text, sizeof text, NULL), LEASE_ERR_INVALID_KEY, "key");
    EXPECT_ERR(lease_inspect_policy(ls[1], KEY("g"), NULL, NULL, 8, NULL), LEASE_ERR_NULL, "buf");
  }

  EXPECT(lease_policy_unassign(ls[1], KEY("k"), NULL), LEASE_OK);
  EXPECT(lease_policy_delete_tier(ls[1], "gold", NULL), LEASE_OK);
  EXPECT(lease_refresh_policies(ls[0]), LEASE_OK);
  EXPECT(lease_acquire_tier(ls[0], KEY("k"), 1, KEY("free"), &d), LEASE_OK);
  CHECK(d.limit == 2, "unassigned: free again, limit %llu", (unsigned long long)d.limit);
  EXPECT_ERR(lease_acquire_tier(ls[0], KEY("g"), 1, KEY("gold"), &d), LEASE_ERR_CONFIG, "gold");
  EXPECT(lease_policy_get(ls[0], KEY("k"), text, sizeof text, NULL), LEASE_OK);
  CHECK(text[0] == '\0', "no entry after unassign: %s", text);

  /* Bad input: a clear status and message each, the store unchanged. */
  EXPECT_ERR(lease_policy_set_tier(ls[0], "b@d", "1/s", NULL), LEASE_ERR_CONFIG, "tier");
  EXPECT_ERR(lease_policy_set_tier(ls[0], "ok", "1/fortnight", NULL), LEASE_ERR_CONFIG, "rules");
  EXPECT_ERR(lease_policy_set_tier(ls[0], "ok", "1/s, 2/s", NULL), LEASE_ERR_CONFIG, "window");
  EXPECT_ERR(lease_policy_set_tier(ls[0], "ok", "1/s,1/2s,1/3s,1/4s,1/5s", NULL), LEASE_ERR_CONFIG, "at most 4");
  EXPECT_ERR(lease_policy_set_tier(ls[0], "ok", "", NULL), LEASE_ERR_CONFIG, "rules");
  EXPECT_ERR(lease_policy_set_tier(ls[0], NULL, "1/s", NULL), LEASE_ERR_NULL, "name");
  EXPECT_ERR(lease_policy_set_tier(ls[0], "ok", NULL, NULL), LEASE_ERR_NULL, "rules");
  EXPECT_ERR(lease_policy_set_tier(ls[0], "o\xffk", "1/s", NULL), LEASE_ERR_UTF8, "name");
  EXPECT_ERR(lease_policy_set_tier(NULL, "ok", "1/s", NULL), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_policy_delete_tier(ls[0], "", NULL), LEASE_ERR_CONFIG, "tier");
  EXPECT_ERR(lease_policy_delete_tier(ls[0], NULL, NULL), LEASE_ERR_NULL, "name");
  EXPECT_ERR(lease_policy_assign(ls[0], KEY("k"), "tier:", NULL), LEASE_ERR_CONFIG, "tier");
  EXPECT_ERR(lease_policy_assign(ls[0], KEY("k"), "garbage", NULL), LEASE_ERR_CONFIG, "policy");
  EXPECT_ERR(lease_policy_assign(ls[0], KEY(""), "1/s", NULL), LEASE_ERR_INVALID_KEY, "key");
  EXPECT_ERR(lease_policy_assign(ls[0], (const uint8_t *)"\xff", 1, "1/s", NULL), LEASE_ERR_UTF8, "UTF-8");
  EXPECT_ERR(lease_policy_assign(ls[0], KEY("k"), NULL, NULL), LEASE_ERR_NULL, "assignment");
  EXPECT_ERR(lease_policy_unassign(ls[0], NULL, 2, NULL), LEASE_ERR_NULL, "key");
  EXPECT_ERR(lease_policy_get(ls[0], KEY("k"), NULL, 4, NULL), LEASE_ERR_NULL, "buf");
  EXPECT_ERR(lease_policy_get(NULL, KEY("k"), text, sizeof text, NULL), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_refresh_policies(NULL), LEASE_ERR_NULL, "limiter");
  EXPECT(lease_policy_assign(ls[0], KEY("k"), "10/s, 1000/day", NULL), LEASE_OK);
  EXPECT(lease_policy_get(ls[0], KEY("k"), text, 4, &needed), LEASE_ERR_BUFFER_TOO_SMALL);
  CHECK(text[0] == '\0' && needed == strlen("10/s, 1000/day") + 1, "needed %zu", needed);
  EXPECT(lease_close(ls[0]), LEASE_OK);
  EXPECT_ERR(lease_policy_assign(ls[0], KEY("k"), "1/s", NULL), LEASE_ERR_CLOSED, "closed");
  EXPECT_ERR(lease_refresh_policies(ls[0]), LEASE_ERR_CLOSED, "closed");
  for (i = 0; i < 2; i++) lease_limiter_free(ls[i]);
}

/* The rules between options are the core's. */
static void options_rules_between_options(void) {
  lease_options *o = new_options();
  lease_limiter *l = (lease_limiter *)0x1;
  EXPECT(lease_options_set_str(o, "rate", "10/s"), LEASE_OK);
  EXPECT(lease_options_set_int(o, "limit", 5), LEASE_OK);
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "`rate`");
  CHECK(l == NULL, "out not NULL after a failure");
  lease_options_free(o);

  o = new_options();
  EXPECT(lease_options_set_int(o, "windowMs", 1000), LEASE_OK);
  EXPECT(lease_options_set_str(o, "rate", "10/s"), LEASE_OK);
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "cannot be combined with `limit` or `window_ms`");
  lease_options_free(o);

  o = new_options();
  EXPECT(lease_options_set_int(o, "limit", 5), LEASE_OK);
  EXPECT(lease_options_set_int(o, "clock_start_ms", 5), LEASE_OK);
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "`clock_start_ms`");
  EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_limiter_free(l);
  lease_options_free(o);

  /* The rate is read when the limiter is built. */
  o = new_options();
  EXPECT(lease_options_set_str(o, "rate", "5/fortnight"), LEASE_OK);
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "`rate` must look like");
  lease_options_free(o);

  /* No limit: the same message as every language. */
  o = new_options();
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "`limit` must be at least 1");
  /* Values are checked when built too (lease_size above limit). */
  EXPECT(lease_options_set_int(o, "limit", 3), LEASE_OK);
  EXPECT(lease_options_set_int(o, "lease_size", 4), LEASE_OK);
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "`lease_size`");
  lease_options_free(o);
}

static void options_unknown_names_and_bad_values(void) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  lease_decision d;
  EXPECT(lease_options_set_int(o, "limit", 5), LEASE_OK);
  EXPECT_ERR(lease_options_set_int(o, "lese_size", 2), LEASE_ERR_CONFIG, "did you mean `lease_size`?");
  CHECK(strcmp(lease_last_error(),
               "lease_options_set_int: invalid configuration: unknown option `lese_size`; did you mean "
               "`lease_size`?") == 0,
        "message");
  EXPECT_ERR(lease_options_set_int(o, "leaseSise", 2), LEASE_ERR_CONFIG, "did you mean `leaseSize`?");
  EXPECT_ERR(lease_options_set_str(o, "mdoe", "exact"), LEASE_ERR_CONFIG, "did you mean `mode`?");
  EXPECT_ERR(lease_options_set_str(o, "banana", "x"), LEASE_ERR_CONFIG, "the options are url, limit");
  EXPECT_ERR(lease_options_set_str(o, "limit", "10"), LEASE_ERR_CONFIG, "`limit`");
  EXPECT_ERR(lease_options_set_int(o, "url", 3), LEASE_ERR_CONFIG, "`url`");
  EXPECT_ERR(lease_options_set_int(o, "limit", -1), LEASE_ERR_CONFIG, "`limit`");
  EXPECT_ERR(lease_options_set_str(o, "mode", "fast"), LEASE_ERR_CONFIG, "`mode`");
  EXPECT_ERR(lease_options_set_str(o, "on_backend_failure", "panic"), LEASE_ERR_CONFIG, "`on_backend_failure`");
  EXPECT_ERR(lease_options_set_str(o, "clock", "sundial"), LEASE_ERR_CONFIG, "`clock`");
  /* Failed sets changed nothing: limit 5, the defaults for everything else. */
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  if (l) {
    EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
    CHECK(d.limit == 5 && d.window_ms == 60000 && d.reason == LEASE_REASON_LEASE, "%llu/%llu %s",
          (unsigned long long)d.limit, (unsigned long long)d.window_ms, lease_reason_name(d.reason));
    lease_limiter_free(l);
  }
  lease_options_free(o);
}

static void options_bad_input(void) {
  lease_options *o = new_options();
  lease_limiter *l = (lease_limiter *)0x1;
  EXPECT_ERR(lease_options_new(NULL), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_options_set_str(NULL, "url", "memory://"), LEASE_ERR_NULL, "options");
  EXPECT_ERR(lease_options_set_int(NULL, "limit", 1), LEASE_ERR_NULL, "options");
  EXPECT_ERR(lease_options_set_str(o, NULL, "memory://"), LEASE_ERR_NULL, "name");
  EXPECT_ERR(lease_options_set_int(o, NULL, 1), LEASE_ERR_NULL, "name");
  EXPECT_ERR(lease_options_set_str(o, "url", NULL), LEASE_ERR_NULL, "value");
  EXPECT_ERR(lease_options_set_str(o, "url", "redis://h\xff"), LEASE_ERR_UTF8, "option `url`");
  EXPECT_ERR(lease_options_set_int(o, "li\xffmit", 1), LEASE_ERR_UTF8, "name");
  EXPECT_ERR(lease_limiter_new_from_options(NULL, &l), LEASE_ERR_NULL, "options");
  CHECK(l == NULL, "out not NULL after a NULL options");
  EXPECT_ERR(lease_limiter_new_from_options(o, NULL), LEASE_ERR_NULL, "out");
  lease_options_free(o);
  lease_options_free(NULL); /* a no-op */
}

/* One set of options builds many limiters, and may be freed before them. */
static void options_build_many_limiters(void) {
  lease_options *o = new_options();
  lease_limiter *a = NULL, *b = NULL;
  lease_decision d;
  int i, admitted = 0;
  EXPECT(lease_options_set_str(o, "url", "memory://c-options-shared"), LEASE_OK);
  EXPECT(lease_options_set_int(o, "limit", 6), LEASE_OK);
  EXPECT(lease_options_set_int(o, "lease_size", 2), LEASE_OK);
  EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &a), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &b), LEASE_OK);
  lease_options_free(o);
  if (!a || !b) {
    lease_limiter_free(a);
    lease_limiter_free(b);
    return;
  }
  for (i = 0; i < 12; i++) {
    EXPECT(lease_acquire(i % 2 ? a : b, KEY("shared"), 1, &d), LEASE_OK);
    admitted += d.allowed;
  }
  CHECK(admitted == 6, "two limiters from one options admitted %d of limit 6", admitted);
  lease_limiter_free(a);
  lease_limiter_free(b);
}

/* ---- the middleware key rule ---- */

static void http_key_hashes_long_keys(void) {
  char raw[600], buf[LEASE_MAX_KEY_LEN + 1], small[16];
  size_t needed = 0;
  lease_limiter *l = manual_limiter(2, 60000, 1);
  lease_decision d;
  memset(raw, 'x', sizeof raw);
  /* Short keys come back unchanged. */
  EXPECT(lease_http_key(KEY("user:42"), buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf, "user:42") == 0 && needed == 8, "short: %s (%zu)", buf, needed);
  EXPECT(lease_http_key((const uint8_t *)raw, LEASE_MAX_KEY_LEN, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(needed == LEASE_MAX_KEY_LEN + 1 && memcmp(buf, raw, LEASE_MAX_KEY_LEN) == 0 && buf[LEASE_MAX_KEY_LEN] == 0,
        "512 bytes stay (needed %zu)", needed);
  /* 600 bytes of 'x': sha256 from python3 hashlib. */
  EXPECT(lease_http_key((const uint8_t *)raw, sizeof raw, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf, "sha256:5130b33e6b87fbf5316ed9049e98924eb110800bcbaaad8050f642fba6df37c9") == 0, "got %s",
        buf);
  CHECK(needed == 72, "needed %zu", needed);
  /* The hashed key is a valid limiter key; the raw one is not. */
  EXPECT(lease_acquire(l, (const uint8_t *)buf, needed - 1, 1, &d), LEASE_OK);
  CHECK(d.allowed, "hashed key denied");
  EXPECT(lease_acquire(l, (const uint8_t *)raw, sizeof raw, 1, &d), LEASE_ERR_INVALID_KEY);
  /* Buffer too small: "" and the size; NULL/0 asks for the size. */
  memset(small, 'z', sizeof small);
  EXPECT_ERR(lease_http_key((const uint8_t *)raw, sizeof raw, small, sizeof small, &needed),
             LEASE_ERR_BUFFER_TOO_SMALL, "needed");
  CHECK(small[0] == '\0' && needed == 72, "small: needed %zu", needed);
  EXPECT(lease_http_key((const uint8_t *)raw, sizeof raw, buf, 71, NULL), LEASE_ERR_BUFFER_TOO_SMALL);
  needed = 0;
  EXPECT(lease_http_key(KEY("abc"), NULL, 0, &needed), LEASE_ERR_BUFFER_TOO_SMALL);
  CHECK(needed == 4, "size query %zu", needed);
  EXPECT(lease_http_key(KEY("abc"), small, 4, NULL), LEASE_OK);
  CHECK(strcmp(small, "abc") == 0, "exact fit %s", small);
  /* Bad input. */
  EXPECT_ERR(lease_http_key(KEY("abc"), NULL, 8, &needed), LEASE_ERR_NULL, "buf");
  EXPECT_ERR(lease_http_key(NULL, 3, buf, sizeof buf, &needed), LEASE_ERR_NULL, "key");
  EXPECT_ERR(lease_http_key((const uint8_t *)"ab\xff", 3, buf, sizeof buf, &needed), LEASE_ERR_UTF8, "UTF-8");
  EXPECT(lease_http_key(NULL, 0, buf, sizeof buf, &needed), LEASE_OK);
  CHECK(buf[0] == '\0' && needed == 1, "empty key");
  lease_limiter_free(l);
}

/* ---- credentials in URLs ---- */

#define SECRET_USER "alice-user-QRS"
#define SECRET_PW "s3cret-pw-XYZ"
#define NO_SECRET(text) \
  CHECK(strstr((text), SECRET_PW) == NULL && strstr((text), SECRET_USER) == NULL, "a credential shows: %s", (text))

static void urls_are_redacted(void) {
  char buf[128], small[8];
  size_t needed = 0;
  lease_config c;
  lease_limiter *l = NULL;
  lease_options *o;
  /* The core's rule, for callers that log a URL themselves. */
  EXPECT(lease_redact_url("redis://" SECRET_USER ":" SECRET_PW "@h:6379/0", buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf, "redis://***@h:6379/0") == 0 && needed == 21, "got %s (%zu)", buf, needed);
  EXPECT(lease_redact_url("redis+cluster://:" SECRET_PW "@a:1,b:2", buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf, "redis+cluster://***@a:1,b:2") == 0, "got %s", buf);
  EXPECT(lease_redact_url("redis://127.0.0.1:6379", buf, sizeof buf, &needed), LEASE_OK);
  CHECK(strcmp(buf, "redis://127.0.0.1:6379") == 0, "got %s", buf);
  EXPECT_ERR(lease_redact_url("redis://:" SECRET_PW "@h", small, sizeof small, &needed), LEASE_ERR_BUFFER_TOO_SMALL,
             "needed");
  CHECK(small[0] == '\0' && needed == 14, "small: needed %zu", needed);
  EXPECT_ERR(lease_redact_url(NULL, buf, sizeof buf, &needed), LEASE_ERR_NULL, "url");
  EXPECT_ERR(lease_redact_url("redis://h", NULL, 8, &needed), LEASE_ERR_NULL, "buf");
  EXPECT(lease_redact_url("a\xff", buf, sizeof buf, &needed), LEASE_ERR_UTF8);
  /* Config errors name the URL redacted, through lease_config and by name. */
  lease_config_init(&c);
  c.limit = 10;
  c.url = "redis://" SECRET_USER ":" SECRET_PW "@127.0.0.1:notaport";
  EXPECT_ERR(new_with(&c, &l), LEASE_ERR_CONFIG, "redis://***@");
  NO_SECRET(lease_last_error());
  c.url = "unix:///run/redis.sock?user=" SECRET_USER "&pass=" SECRET_PW;
  EXPECT_ERR(new_with(&c, &l), LEASE_ERR_CONFIG, "unix:///run/redis.sock?user=***&pass=***");
  NO_SECRET(lease_last_error());
  o = new_options();
  EXPECT(lease_options_set_str(o, "url", "redis://" SECRET_USER ":" SECRET_PW "@127.0.0.1:6379/x"), LEASE_OK);
  EXPECT(lease_options_set_int(o, "limit", 10), LEASE_OK);
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "`url`");
  NO_SECRET(lease_last_error());
  /* A URL given to a number option. */
  EXPECT_ERR(lease_options_set_str(o, "limit", "redis://" SECRET_USER ":" SECRET_PW "@h:1"), LEASE_ERR_CONFIG,
             "`limit`");
  NO_SECRET(lease_last_error());
  lease_options_free(o);
  /* One without its scheme given to a string option the engine echoes back. */
  o = new_options();
  EXPECT(lease_options_set_str(o, "rate", SECRET_USER ":" SECRET_PW "@db.example:1"), LEASE_OK);
  EXPECT_ERR(lease_limiter_new_from_options(o, &l), LEASE_ERR_CONFIG, "\"***@db.example:1\"");
  NO_SECRET(lease_last_error());
  lease_options_free(o);
}

static void error_kind_names_are_the_cores(void) {
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_CONFIG), "config") == 0, "config");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_INVALID_KEY), "invalid_key") == 0, "invalid_key");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_INVALID_COST), "invalid_cost") == 0, "invalid_cost");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_CLOSED), "closed") == 0, "closed");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_BACKEND), "backend") == 0, "backend");
  CHECK(strcmp(lease_error_kind_name(LEASE_OK), "") == 0, "ok");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_NULL), "") == 0, "null");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_UTF8), "") == 0, "utf8");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_PANIC), "") == 0, "panic");
  CHECK(strcmp(lease_error_kind_name(12345), "") == 0, "unknown");
}

static void advance_clock_needs_manual_clock(void) {
  lease_config c;
  lease_limiter *l;
  lease_config_init(&c);
  c.limit = 5;
  EXPECT(lease_limiter_new(&c, &l), LEASE_OK);
  EXPECT_ERR(lease_advance_clock(l, 10), LEASE_ERR_CONFIG, "manual");
  lease_limiter_free(l);
}

static void *fail_in_thread(void *arg) {
  static char seen[256];
  (void)arg;
  /* A fresh thread has no last error, whatever the main thread did. */
  snprintf(seen, sizeof seen, "%s", lease_last_error());
  lease_config_init(NULL);
  return seen;
}

static void last_error_is_thread_local(void) {
  pthread_t t;
  void *seen = NULL;
  const char *mine;
  lease_acquire(NULL, KEY("k"), 1, NULL);
  mine = lease_last_error();
  CHECK(strstr(mine, "lease_acquire") != NULL, "main thread's error %s", mine);
  CHECK(pthread_create(&t, NULL, fail_in_thread, NULL) == 0, "pthread_create");
  pthread_join(t, &seen);
  CHECK(seen && ((char *)seen)[0] == '\0', "new thread saw \"%s\"", (char *)seen);
  /* The other thread's failure did not touch this thread's message. */
  CHECK(strstr(lease_last_error(), "lease_acquire") != NULL, "main thread's error became %s", lease_last_error());
  /* Successful calls leave it unchanged. */
  {
    lease_config c;
    lease_config_init(&c);
    CHECK(strstr(lease_last_error(), "lease_acquire") != NULL, "a success cleared the error");
  }
}

static void works_after_fork(void) {
  lease_limiter *l = manual_limiter(10, 60000, 4);
  lease_decision d;
  pid_t pid;
  int status = 0;
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    struct lease_metrics m;
    int ok = lease_acquire(l, KEY("k"), 1, &d) == LEASE_OK && d.allowed && lease_metrics(l, &m) == LEASE_OK &&
             m.tokens_expired == 3; /* the child dropped the parent's 3 leased tokens */
    lease_limiter_free(l);
    _exit(ok ? 0 : 1);
  }
  CHECK(pid > 0, "fork");
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d",
        status);
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(d.allowed, "parent denied after fork");
  lease_limiter_free(l);
}

int main(void) {
  RUN(version_matches_header);
  RUN(config_init_fills_documented_defaults);
  RUN(acquire_until_exhausted);
  RUN(keys_are_bytes_not_c_strings);
  RUN(try_acquire_and_reasons);
  RUN(modes_by_config);
  RUN(set_limit_overrides_one_key);
  RUN(metrics_count_decisions);
  RUN(prometheus_into_caller_buffer);
  RUN(prometheus_of_two_limiters);
  RUN(decision_headers_follow_the_draft);
  RUN(flush_and_close);
  RUN(memory_name_shares_one_authority);
  RUN(parse_helpers);
  RUN(null_handle_everywhere);
  RUN(null_out_params);
  RUN(bad_keys);
  RUN(bad_costs);
  RUN(bad_configs);
  RUN(options_by_name_every_option);
  RUN(tiers_pick_the_rules);
  RUN(two_rules_with_a_refund);
  RUN(decision_headers_of_several_rules);
  RUN(calendar_day_in_berlin_across_midnight);
  RUN(calendar_rule_in_a_tier);
  RUN(calendar_bad_input);
  RUN(store_is_shared_after_refresh);
  RUN(options_rules_between_options);
  RUN(options_unknown_names_and_bad_values);
  RUN(options_bad_input);
  RUN(options_build_many_limiters);
  RUN(http_key_hashes_long_keys);
  RUN(shadow_mode_admits_what_the_rules_deny);
  RUN(acquire_wait_waits_for_the_refill);
  RUN(reserve_then_settle);
  RUN(urls_are_redacted);
  RUN(error_kind_names_are_the_cores);
  RUN(advance_clock_needs_manual_clock);
  RUN(last_error_is_thread_local);
  RUN(works_after_fork);
  SUMMARY();
}
