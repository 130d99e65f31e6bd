/* lease_inspect: what one key's inspection reports (its bucket, what this
 * limiter holds and, with adaptive leasing, the rate it spends, the live
 * holders, its fallback rate and its demand) on the memory authority with a
 * manual clock and on a real redis-server (QL_REDIS_URL, started by
 * scripts/test-c.sh through tests/harness/redisctl), and every bad input. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"

#define U(x) ((unsigned long long)(x))

static const char *redis_url;

/* An adaptive limiter (lease_size LEASE_AUTO, the default) of 100 tokens per
 * second on `url` under key prefix `prefix`, with a manual clock. */
/* The figures below are those of a 2 % budget, set by name: the default,
 * "auto", lets a lone holder lease up to half a second's refill ahead. */
static lease_limiter *adaptive_in(const char *url, const char *prefix) {
  lease_options *o = NULL;
  lease_limiter *l = NULL;
  EXPECT(lease_options_new(&o), LEASE_OK);
  EXPECT(lease_options_set_str(o, "url", url), LEASE_OK);
  EXPECT(lease_options_set_str(o, "key_prefix", prefix), LEASE_OK);
  EXPECT(lease_options_set_int(o, "limit", 100), LEASE_OK);
  EXPECT(lease_options_set_int(o, "window_ms", 1000), LEASE_OK);
  EXPECT(lease_options_set_int(o, "backend_timeout_ms", 2000), LEASE_OK);
  EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
  EXPECT(lease_options_set_str(o, "overshoot_budget", "2%"), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_options_free(o);
  if (l == NULL) exit(1);
  return l;
}

/* A key prefix no other test uses (Redis keys outlive a test). */
static const char *unique_prefix(void) {
  static char prefix[64];
  static int n;
  snprintf(prefix, sizeof prefix, "c%d-inspect-%d", (int)getpid(), n++);
  return prefix;
}

static lease_limiter *adaptive(const char *url) { return adaptive_in(url, unique_prefix()); }

/* Acquire one token and wait for any lease request it started. */
static lease_decision take(lease_limiter *l, const char *key) {
  lease_decision d;
  memset(&d, 0, sizeof d);
  EXPECT(lease_acquire(l, KEY(key), 1, &d), LEASE_OK);
  EXPECT(lease_settle(l), LEASE_OK);
  return d;
}

static lease_inspection inspect(lease_limiter *l, const char *key) {
  lease_inspection i;
  memset(&i, 0xA5, sizeof i);
  EXPECT(lease_inspect(l, KEY(key), &i), LEASE_OK);
  return i;
}

static void a_key_never_seen_reads_as_a_full_bucket(void) {
  lease_limiter *l = adaptive("memory://");
  lease_inspection i = inspect(l, "never-seen");
  CHECK(i.limit == 100 && i.window_ms == 1000, "policy %llu/%llu", U(i.limit), U(i.window_ms));
  CHECK(!i.has_authority_tokens && i.authority_tokens == 0, "no bucket stored: %d %llu", i.has_authority_tokens,
        U(i.authority_tokens));
  CHECK(!i.has_authority_refilled_at_ms && !i.has_authority_ttl_ms, "refilled_at / ttl flags");
  CHECK(i.local_tokens == 0 && i.admitted == 0 && i.denied == 0 && !i.lease_in_flight, "local figures");
  CHECK(i.holders == 0 && i.fallback_per_window == 0 && i.demand_per_s == 0, "no answer yet: holders %llu",
        U(i.holders));
  CHECK(i.rate_per_window == 0 && !i.rate_mode, "no rate");
  lease_limiter_free(l);
}

/* A lone holder on memory://: chunks sized by its demand under the budget,
 * then a rate once the bucket is dry. Every figure is exact on the manual
 * clock. */
static void memory_adaptive_figures(void) {
  lease_limiter *l = adaptive("memory://");
  lease_inspection i;
  lease_decision d;
  uint64_t rate, admitted_before;
  int n;
  /* Five requests at t0: demand is not measured yet (the first estimate
   * waits for 100 ms of traffic), so each lease is the request plus as many
   * as the key has seen here: 1, 2, then 3 tokens; one of them is held. */
  for (n = 0; n < 5; n++) CHECK(take(l, "k").allowed, "request %d denied", n);
  i = inspect(l, "k");
  CHECK(i.admitted == 5 && i.denied == 0, "admitted %llu denied %llu", U(i.admitted), U(i.denied));
  CHECK(i.holders == 1, "holders %llu", U(i.holders));
  CHECK(i.fallback_per_window == 100, "a lone holder's fallback is the key's whole rate: %llu",
        U(i.fallback_per_window));
  CHECK(i.demand_per_s == 0 && i.local_tokens == 1, "demand %llu local %llu", U(i.demand_per_s), U(i.local_tokens));
  CHECK(i.has_authority_tokens && i.authority_tokens == 94, "authority %d %llu", i.has_authority_tokens,
        U(i.authority_tokens));
  CHECK(i.has_authority_refilled_at_ms && i.authority_refilled_at_ms == 1000000, "refilled at %llu",
        U(i.authority_refilled_at_ms));
  CHECK(!i.has_authority_ttl_ms, "memory:// stores no TTL");
  CHECK(!i.rate_mode && i.rate_per_window == 0, "chunk mode: rate %llu", U(i.rate_per_window));

  /* 100 ms later, two more: the first spends the held token; the second
   * asks, and 6 requests in 100 ms is 60 per second: the lease is the
   * request plus the budget (2 % of 100 = 2 tokens held). */
  EXPECT(lease_advance_clock(l, 100), LEASE_OK);
  CHECK(take(l, "k").allowed, "request at +100 ms denied");
  CHECK(take(l, "k").allowed, "second request at +100 ms denied");
  i = inspect(l, "k");
  CHECK(i.demand_per_s == 60, "demand %llu, want 60", U(i.demand_per_s));
  CHECK(i.local_tokens == 2, "local %llu, want the budget of 2", U(i.local_tokens));
  /* 94 refilled by 10, capped at the capacity less the 2 tokens still
   * committed to this holder (98), less the lease of 3 */
  CHECK(i.authority_tokens == 95 && i.authority_refilled_at_ms == 1000100, "authority %llu at %llu",
        U(i.authority_tokens), U(i.authority_refilled_at_ms));
  CHECK(i.holders == 1 && i.fallback_per_window == 100 && !i.rate_mode, "holders %llu fallback %llu rate %llu",
        U(i.holders), U(i.fallback_per_window), U(i.rate_per_window));

  /* Spend the bucket: the first denial finds it dry (a lone holder at 60 per
   * second is not saturated: no rate). */
  for (n = 0; n < 200; n++) {
    d = take(l, "k");
    if (!d.allowed) break;
  }
  CHECK(!d.allowed && d.reason == LEASE_REASON_EXHAUSTED, "after %d: allowed %d reason %s", n, d.allowed,
        lease_reason_name(d.reason));
  CHECK(n == 97, "admitted %d more, want the 95 in the bucket and the 2 held", n);
  CHECK(d.remaining == 0, "a denial's remaining is what the caller can have: %llu", U(d.remaining));
  i = inspect(l, "k");
  CHECK(i.authority_tokens == 0 && i.local_tokens == 0, "authority %llu local %llu", U(i.authority_tokens),
        U(i.local_tokens));
  CHECK(i.holders == 1 && i.fallback_per_window == 100, "holders %llu fallback %llu", U(i.holders),
        U(i.fallback_per_window));
  CHECK(i.denied == 1 && i.admitted == 104, "admitted %llu denied %llu", U(i.admitted), U(i.denied));

  /* 100 ms later the instance admits exactly the refill: one bucket's worth. */
  admitted_before = i.admitted;
  EXPECT(lease_advance_clock(l, 100), LEASE_OK);
  for (n = 0; n < 200; n++) {
    d = take(l, "k");
    if (!d.allowed) break;
  }
  i = inspect(l, "k");
  rate = i.admitted - admitted_before;
  CHECK(rate == 10, "admitted %llu in 100 ms, want the refill of 10", U(rate));
  lease_limiter_free(l);
}

/* Two limiters on one authority: each answer counts the live holders, and
 * their valid fallback shares never sum above the key's rate (I4): a joiner
 * gets what the others' shares leave until they call again. */
static void two_holders_share_the_fallback(const char *url) {
  const char *prefix = unique_prefix();
  lease_limiter *a = adaptive_in(url, prefix), *b = adaptive_in(url, prefix);
  lease_inspection ia, ib;
  CHECK(take(a, "k").allowed, "a denied");
  ia = inspect(a, "k");
  CHECK(ia.holders == 1 && ia.fallback_per_window == 100, "a alone: holders %llu fallback %llu", U(ia.holders),
        U(ia.fallback_per_window));
  CHECK(take(b, "k").allowed, "b denied");
  ib = inspect(b, "k");
  CHECK(ib.holders == 2 && ib.fallback_per_window == 0, "b: holders %llu fallback %llu (a holds the whole rate)",
        U(ib.holders), U(ib.fallback_per_window));
  /* a's next lease request (after giving back what it holds) takes its half,
   * then b's takes the other. */
  EXPECT(lease_flush(a), LEASE_OK);
  CHECK(take(a, "k").allowed, "a denied");
  ia = inspect(a, "k");
  CHECK(ia.holders == 2 && ia.fallback_per_window == 50, "a: holders %llu fallback %llu", U(ia.holders),
        U(ia.fallback_per_window));
  EXPECT(lease_flush(b), LEASE_OK);
  CHECK(take(b, "k").allowed, "b denied");
  ib = inspect(b, "k");
  CHECK(ia.fallback_per_window + ib.fallback_per_window == 100, "fallback rates sum to %llu",
        U(ia.fallback_per_window + ib.fallback_per_window));
  lease_close(a);
  lease_close(b);
  lease_limiter_free(a);
  lease_limiter_free(b);
}

static void memory_two_holders(void) {
  char url[64];
  snprintf(url, sizeof url, "memory://c-inspect-%d", (int)getpid());
  two_holders_share_the_fallback(url);
}

static void redis_two_holders(void) { two_holders_share_the_fallback(redis_url); }

/* On Redis: the stored bucket with its TTL, a measured demand, and a rate
 * grant once the bucket is dry (Redis prefetches, so the chunks differ from
 * memory's; the adaptive figures mean the same). */
static void redis_adaptive_figures(void) {
  lease_limiter *l = adaptive(redis_url);
  lease_inspection i;
  lease_decision d;
  uint64_t offered, rate, admitted_before;
  int n;
  i = inspect(l, "k");
  CHECK(!i.has_authority_tokens && !i.has_authority_ttl_ms && i.holders == 0, "a fresh key: %d %d %llu",
        i.has_authority_tokens, i.has_authority_ttl_ms, U(i.holders));
  for (n = 0; n < 5; n++) CHECK(take(l, "k").allowed, "request %d denied", n);
  i = inspect(l, "k");
  CHECK(i.admitted == 5 && i.holders == 1 && i.fallback_per_window == 100, "admitted %llu holders %llu fallback %llu",
        U(i.admitted), U(i.holders), U(i.fallback_per_window));
  CHECK(i.has_authority_tokens && i.authority_tokens + i.local_tokens + 5 == 100,
        "authority %llu + local %llu + 5 spent != 100", U(i.authority_tokens), U(i.local_tokens));
  CHECK(i.has_authority_refilled_at_ms && i.authority_refilled_at_ms == 1000000, "refilled at %llu",
        U(i.authority_refilled_at_ms));
  CHECK(i.has_authority_ttl_ms && i.authority_ttl_ms > 0, "Redis reports the bucket's TTL: %d %llu",
        i.has_authority_ttl_ms, U(i.authority_ttl_ms));
  CHECK(!i.rate_mode && i.demand_per_s == 0, "rate %llu demand %llu", U(i.rate_per_window), U(i.demand_per_s));

  /* 100 ms later: requests the held tokens serve make no call; the first
   * that asks measures the demand. */
  EXPECT(lease_advance_clock(l, 100), LEASE_OK);
  for (n = 0; n < 10; n++) {
    CHECK(take(l, "k").allowed, "request %d at +100 ms denied", n);
    i = inspect(l, "k");
    if (i.demand_per_s > 0) break;
  }
  offered = i.admitted + i.denied;
  /* at most everything offered, over the 100 ms measured */
  CHECK(i.demand_per_s > 0 && i.demand_per_s <= offered * 10, "demand %llu per s, %llu offered", U(i.demand_per_s),
        U(offered));

  for (n = 0; n < 200; n++) {
    d = take(l, "k");
    if (!d.allowed) break;
  }
  CHECK(!d.allowed && d.reason == LEASE_REASON_EXHAUSTED, "after %d: reason %s", n, lease_reason_name(d.reason));
  i = inspect(l, "k");
  CHECK(i.authority_tokens == 0 && i.holders == 1, "authority %llu holders %llu", U(i.authority_tokens),
        U(i.holders));
  CHECK(i.admitted + i.denied == offered + (uint64_t)n + 1, "counts %llu + %llu", U(i.admitted), U(i.denied));

  /* 100 ms later: the refill (10), with what a prefetch holds at most. */
  admitted_before = i.admitted;
  EXPECT(lease_advance_clock(l, 100), LEASE_OK);
  for (n = 0; n < 200; n++) {
    d = take(l, "k");
    if (!d.allowed) break;
  }
  i = inspect(l, "k");
  rate = i.admitted - admitted_before;
  CHECK(rate <= 10 + 2, "admitted %llu in 100 ms, the refill is 10 (and 2 the budget held)", U(rate));
  EXPECT(lease_close(l), LEASE_OK);
  lease_limiter_free(l);
}

/* ---- bad input: a status and a message, *out untouched ---- */

static int untouched(const lease_inspection *i) {
  const unsigned char *p = (const unsigned char *)i;
  size_t k;
  for (k = 0; k < sizeof *i; k++)
    if (p[k] != 0x5A) return 0;
  return 1;
}

static void bad_input(void) {
  lease_limiter *l = adaptive("memory://");
  lease_inspection i;
  char long_key[600];
  memset(long_key, 'x', sizeof long_key);
  memset(&i, 0x5A, sizeof i);
  EXPECT_ERR(lease_inspect(NULL, KEY("k"), &i), LEASE_ERR_NULL, "limiter");
  CHECK(strstr(lease_last_error(), "lease_inspect") != NULL, "message names the function: %s", lease_last_error());
  EXPECT_ERR(lease_inspect(l, KEY("k"), NULL), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_inspect(l, NULL, 3, &i), LEASE_ERR_NULL, "key");
  EXPECT_ERR(lease_inspect(l, NULL, 0, &i), LEASE_ERR_INVALID_KEY, "empty");
  EXPECT_ERR(lease_inspect(l, (const uint8_t *)"", 0, &i), LEASE_ERR_INVALID_KEY, "empty");
  EXPECT_ERR(lease_inspect(l, (const uint8_t *)long_key, 513, &i), LEASE_ERR_INVALID_KEY, "512");
  EXPECT_ERR(lease_inspect(l, (const uint8_t *)"ab\xff", 3, &i), LEASE_ERR_UTF8, "UTF-8");
  CHECK(untouched(&i), "*out written on failure");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_INVALID_KEY), "invalid_key") == 0, "kind");
  /* The longest key is fine, and so is a key that is not NUL-terminated. */
  EXPECT(lease_inspect(l, (const uint8_t *)long_key, 512, &i), LEASE_OK);
  EXPECT(lease_inspect(l, (const uint8_t *)"kXYZ", 1, &i), LEASE_OK);
  CHECK(i.limit == 100, "limit %llu", U(i.limit));
  /* Closed: LEASE_ERR_CLOSED, as for every call but the metrics. */
  take(l, "k");
  EXPECT(lease_close(l), LEASE_OK);
  memset(&i, 0x5A, sizeof i);
  EXPECT_ERR(lease_inspect(l, KEY("k"), &i), LEASE_ERR_CLOSED, "closed");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_CLOSED), "closed") == 0, "kind");
  CHECK(untouched(&i), "*out written on failure");
  lease_limiter_free(l);
}

/* A per-key policy shows, and a fixed-lease limiter reports no adaptive figures. */
static void set_limit_and_fixed_leases(void) {
  lease_config c;
  lease_limiter *l;
  lease_inspection i;
  lease_config_init(&c);
  c.limit = 10;
  c.window_ms = 1000;
  c.lease_size = 5;
  c.clock = LEASE_CLOCK_MANUAL;
  l = new_limiter_or_exit(&c);
  EXPECT(lease_set_limit(l, KEY("vip"), 100, 2000), LEASE_OK);
  take(l, "vip");
  i = inspect(l, "vip");
  CHECK(i.limit == 100 && i.window_ms == 2000, "vip policy %llu/%llu", U(i.limit), U(i.window_ms));
  CHECK(i.local_tokens == 4 && i.authority_tokens == 95 && i.admitted == 1, "a lease of 5, one spent: local %llu "
        "authority %llu", U(i.local_tokens), U(i.authority_tokens));
  CHECK(i.holders == 0 && i.fallback_per_window == 0 && i.demand_per_s == 0 && !i.rate_mode,
        "fixed leases carry no adaptive answer: holders %llu fallback %llu", U(i.holders), U(i.fallback_per_window));
  lease_limiter_free(l);
}

int main(void) {
  redis_url = getenv("QL_REDIS_URL");
  if (!redis_url) {
    fprintf(stderr, "set QL_REDIS_URL (scripts/test-c.sh does)\n");
    return 2;
  }
  RUN(a_key_never_seen_reads_as_a_full_bucket);
  RUN(memory_adaptive_figures);
  RUN(memory_two_holders);
  RUN(set_limit_and_fixed_leases);
  RUN(bad_input);
  RUN(redis_adaptive_figures);
  RUN(redis_two_holders);
  SUMMARY();
}
