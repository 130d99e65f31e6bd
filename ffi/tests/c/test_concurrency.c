/* Concurrency limits (the `concurrency` option, lease_acquire_concurrent,
 * lease_permit_release, lease_permit_free): at most N permits of a key in
 * flight across the limiters of one authority, a release frees one, long
 * requests keep theirs, and every bad input. Each fleet case runs on the
 * memory authority (memory://NAME shared by two limiters) and on a real
 * redis-server (QL_REDIS_URL, started by scripts/test-c.sh), with manual
 * clocks moved in 500 ms steps, each followed by lease_settle (what the
 * broker's ticker does on a system clock). */
#include <stdint.h>
#include <unistd.h>

#include "check.h"

#define U(x) ((unsigned long long)(x))
#define LIMIT 3
#define MAX_HELD 16

static const char *redis_url;

static lease_options *new_options(void) {
  lease_options *o = NULL;
  if (lease_options_new(&o) != LEASE_OK) {
    fprintf(stderr, "lease_options_new: %s\n", lease_last_error());
    exit(2);
  }
  return o;
}

/* A name no other case uses (memory://NAME, and the Redis key prefix:
 * Redis keys outlive a case). */
static const char *unique(const char *what) {
  static char name[64];
  static int n;
  snprintf(name, sizeof name, "c%d-%s-%d", (int)getpid(), what, n++);
  return name;
}

/* A limiter of 1000 tokens a minute and `concurrency` LIMIT on `url` under
 * `prefix`, with a manual clock: exit(2) if it cannot be built. */
static lease_limiter *concurrent_limiter(const char *url, const char *prefix) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  EXPECT(lease_options_set_str(o, "url", url), LEASE_OK);
  EXPECT(lease_options_set_str(o, "key_prefix", prefix), LEASE_OK);
  EXPECT(lease_options_set_int(o, "limit", 1000), LEASE_OK);
  EXPECT(lease_options_set_int(o, "concurrency", LIMIT), LEASE_OK);
  EXPECT(lease_options_set_int(o, "backend_timeout_ms", 2000), LEASE_OK);
  EXPECT(lease_options_set_str(o, "clock", "manual"), LEASE_OK);
  if (lease_limiter_new_from_options(o, &l) != LEASE_OK) {
    fprintf(stderr, "lease_limiter_new_from_options(%s): %s\n", url, lease_last_error());
    exit(2);
  }
  lease_options_free(o);
  return l;
}

/* Two limiters on one authority: the same memory://NAME, or the same Redis
 * and key prefix. */
static void pair(int on_redis, lease_limiter **a, lease_limiter **b) {
  char url[128], prefix[64];
  if (on_redis) {
    snprintf(url, sizeof url, "%s", redis_url);
  } else {
    snprintf(url, sizeof url, "memory://%s", unique("inflight"));
  }
  snprintf(prefix, sizeof prefix, "%s", unique("p"));
  *a = concurrent_limiter(url, prefix);
  *b = concurrent_limiter(url, prefix);
}

/* Permits of `key` taken at once until the first denial, into held[]
 * (the denial is checked and freed); returns how many. */
static int take_all(lease_limiter *l, const char *key, lease_permit **held) {
  int n = 0;
  for (;;) {
    lease_decision d;
    lease_permit *p = NULL;
    lease_status s = lease_acquire_concurrent(l, KEY(key), &d, &p);
    CHECK(s == LEASE_OK && p != NULL, "acquire %d returned %d", n, (int)s);
    if (s != LEASE_OK) return n;
    CHECK(d.limit == LIMIT, "limit %llu is the concurrency", U(d.limit));
    if (!d.allowed) {
      CHECK(d.reason == LEASE_REASON_EXHAUSTED, "denial's reason %s", lease_reason_name(d.reason));
      /* a permit denial stays local recheck_ms (250) from when it was decided */
      CHECK(d.retry_after_ms >= 1 && d.retry_after_ms <= 250, "denial's retry_after_ms %llu", U(d.retry_after_ms));
      CHECK(d.remaining == 0, "denial's remaining %llu", U(d.remaining));
      lease_permit_free(p);
      return n;
    }
    CHECK(d.reason == LEASE_REASON_LEASE, "reason %s", lease_reason_name(d.reason));
    if (n >= MAX_HELD) {
      CHECK(0, "never denied");
      lease_permit_free(p);
      return n;
    }
    held[n++] = p;
  }
}

static void release_all(lease_permit **held, int n) {
  int i;
  for (i = 0; i < n; i++) {
    EXPECT(lease_permit_release(held[i]), LEASE_OK);
    lease_permit_free(held[i]);
  }
}

static void free_all(lease_permit **held, int n) {
  int i;
  for (i = 0; i < n; i++) lease_permit_free(held[i]);
}

/* Every clock of ls moves `ms`, in steps of 500 ms, each followed by the
 * limiter's maintenance (lease_settle). */
static void advance(lease_limiter **ls, int n, uint64_t ms) {
  while (ms > 0) {
    uint64_t step = ms < 500 ? ms : 500;
    int i;
    for (i = 0; i < n; i++) {
      EXPECT(lease_advance_clock(ls[i], step), LEASE_OK);
      EXPECT(lease_settle(ls[i]), LEASE_OK);
    }
    ms -= step;
  }
}

static const char *where(int on_redis) { return on_redis ? "redis" : "memory"; }

/* At most LIMIT in flight, counted down in `remaining`; a release frees
 * exactly one, which is taken again; another key has its own permits. */
static void at_most_the_limit_and_a_release_frees_one(int on_redis) {
  lease_limiter *l, *unused;
  lease_permit *held[MAX_HELD], *other[MAX_HELD], *again = NULL, *denied = NULL;
  lease_decision d;
  int n, i;
  pair(on_redis, &l, &unused);
  for (i = 0; i < LIMIT; i++) {
    memset(&d, 0, sizeof d);
    EXPECT(lease_acquire_concurrent(l, KEY("k"), &d, &held[i]), LEASE_OK);
    CHECK(d.allowed && d.limit == LIMIT && d.remaining == (uint64_t)(LIMIT - 1 - i), "%s: permit %d: %d, %llu left",
          where(on_redis), i, d.allowed, U(d.remaining));
  }
  n = i;
  CHECK(take_all(l, "k", held + n) == 0, "%s: a permit past the limit", where(on_redis));
  EXPECT(lease_permit_release(held[0]), LEASE_OK);
  EXPECT(lease_acquire_concurrent(l, KEY("k"), &d, &again), LEASE_OK);
  CHECK(d.allowed, "%s: the released permit is taken again", where(on_redis));
  EXPECT(lease_acquire_concurrent(l, KEY("k"), &d, &denied), LEASE_OK);
  CHECK(!d.allowed, "%s: one release frees one", where(on_redis));
  lease_permit_free(denied);
  CHECK(take_all(l, "other", other) == LIMIT, "%s: another key has its own permits", where(on_redis));
  free_all(other, LIMIT);
  lease_permit_free(again);
  free_all(held, n);
  lease_limiter_free(l);
  lease_limiter_free(unused);
}

/* Permits are the fleet's: while one limiter holds them all the other gets
 * none; released (each goes back to the authority at once) the other takes
 * all of them once its denial's recheck has passed. */
static void two_limiters_share_the_permits(int on_redis) {
  lease_limiter *ls[2];
  lease_permit *mine[MAX_HELD], *theirs[MAX_HELD];
  int n, m;
  pair(on_redis, &ls[0], &ls[1]);
  n = take_all(ls[0], "k", mine);
  CHECK(n == LIMIT, "%s: the first limiter took %d", where(on_redis), n);
  m = take_all(ls[1], "k", theirs);
  CHECK(m == 0, "%s: the second took %d while the first holds all", where(on_redis), m);
  free_all(theirs, m);
  release_all(mine, n);
  advance(ls, 2, 1000);
  m = take_all(ls[1], "k", theirs);
  CHECK(m == LIMIT, "%s: the second took %d after the release", where(on_redis), m);
  release_all(theirs, m);
  lease_limiter_free(ls[0]);
  lease_limiter_free(ls[1]);
}

/* Held for 30 s, far past a commitment's life (7 s): the holder renews it
 * at every maintenance, so the other limiter still gets none. */
static void a_long_held_permit_is_kept(int on_redis) {
  lease_limiter *ls[2];
  lease_permit *mine[MAX_HELD], *theirs[MAX_HELD];
  int n, m;
  pair(on_redis, &ls[0], &ls[1]);
  n = take_all(ls[0], "k", mine);
  CHECK(n == LIMIT, "%s: took %d", where(on_redis), n);
  advance(ls, 2, 30000);
  m = take_all(ls[1], "k", theirs);
  CHECK(m == 0, "%s: the other limiter took %d of permits still in flight", where(on_redis), m);
  free_all(theirs, m);
  release_all(mine, n);
  lease_limiter_free(ls[0]);
  lease_limiter_free(ls[1]);
}

/* lease_permit_free of an admitted permit not released releases it: the
 * same limiter takes it again, and (given back) so does the other one. A
 * permit may outlive its limiter. */
static void free_without_release_releases(int on_redis) {
  lease_limiter *ls[2];
  lease_permit *mine[MAX_HELD], *theirs[MAX_HELD], *again = NULL;
  lease_decision d;
  int n, m;
  pair(on_redis, &ls[0], &ls[1]);
  n = take_all(ls[0], "k", mine);
  CHECK(n == LIMIT, "%s: took %d", where(on_redis), n);
  lease_permit_free(mine[0]);
  EXPECT(lease_acquire_concurrent(ls[0], KEY("k"), &d, &again), LEASE_OK);
  CHECK(d.allowed, "%s: the freed permit is free again", where(on_redis));
  EXPECT(lease_permit_release(again), LEASE_OK);
  lease_permit_free(again);
  free_all(mine + 1, n - 1);
  EXPECT(lease_flush(ls[0]), LEASE_OK);
  advance(ls, 2, 1000);
  m = take_all(ls[1], "k", theirs);
  CHECK(m == LIMIT, "%s: the other limiter took %d after the frees", where(on_redis), m);
  /* Its limiter freed first: the permits are still freed cleanly. */
  lease_limiter_free(ls[1]);
  free_all(theirs, m);
  lease_limiter_free(ls[0]);
}

/* A limiter of 10 tokens a minute with `concurrency` (and `mode`,
 * `lease_size` when given) into *out: the status of the first call that
 * failed (lease_last_error() says why), else LEASE_OK. */
static lease_status build(int64_t concurrency, const char *mode, int64_t lease_size, lease_limiter **out) {
  lease_options *o = new_options();
  lease_status s;
  *out = NULL;
  EXPECT(lease_options_set_int(o, "limit", 10), LEASE_OK);
  s = lease_options_set_int(o, "concurrency", concurrency);
  if (s == LEASE_OK && mode) s = lease_options_set_str(o, "mode", mode);
  if (s == LEASE_OK && lease_size) s = lease_options_set_int(o, "lease_size", lease_size);
  if (s == LEASE_OK) s = lease_limiter_new_from_options(o, out);
  lease_options_free(o);
  return s;
}

static void bad_input(void) {
  lease_limiter *l = NULL, *none = NULL;
  lease_permit *p = (lease_permit *)0x1, *held = NULL, *denied = NULL, *open = NULL;
  lease_decision d, before;
  char long_key[LEASE_MAX_KEY_LEN + 1];

  /* Needs adaptive leasing; a negative concurrency names the option. */
  EXPECT_ERR(build(2, "exact", 0, &l), LEASE_ERR_CONFIG, "needs adaptive leasing");
  CHECK(l == NULL, "a limiter after a failure");
  EXPECT_ERR(build(2, "local", 0, &l), LEASE_ERR_CONFIG, "needs adaptive leasing");
  EXPECT_ERR(build(2, NULL, 2, &l), LEASE_ERR_CONFIG, "needs adaptive leasing");
  EXPECT_ERR(build(-1, NULL, 0, &l), LEASE_ERR_CONFIG, "`concurrency`");
  /* Concurrency 0 (the default): no permits, a config error. */
  EXPECT(build(0, NULL, 0, &none), LEASE_OK);
  memset(&d, 0xA5, sizeof d);
  memcpy(&before, &d, sizeof d);
  EXPECT_ERR(lease_acquire_concurrent(none, KEY("k"), &d, &p), LEASE_ERR_CONFIG, "`concurrency` is 0");
  CHECK(p == (lease_permit *)0x1 && memcmp(&d, &before, sizeof d) == 0, "out-params written on a failure");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_CONFIG), "config") == 0, "kind name");
  lease_limiter_free(none);

  EXPECT(build(1, NULL, 0, &l), LEASE_OK);
  if (!l) return;
  /* NULLs. */
  EXPECT_ERR(lease_acquire_concurrent(NULL, KEY("k"), &d, &p), LEASE_ERR_NULL, "limiter");
  EXPECT_ERR(lease_acquire_concurrent(l, KEY("k"), NULL, &p), LEASE_ERR_NULL, "out");
  EXPECT_ERR(lease_acquire_concurrent(l, KEY("k"), &d, NULL), LEASE_ERR_NULL, "permit");
  EXPECT_ERR(lease_acquire_concurrent(l, NULL, 3, &d, &p), LEASE_ERR_NULL, "key");
  EXPECT_ERR(lease_permit_release(NULL), LEASE_ERR_NULL, "permit");
  lease_permit_free(NULL);
  CHECK(p == (lease_permit *)0x1, "permit written on a failure");
  /* Bad keys: empty, the reserved U+001F, not UTF-8, too long. */
  EXPECT(lease_acquire_concurrent(l, NULL, 0, &d, &p), LEASE_ERR_INVALID_KEY);
  EXPECT(lease_acquire_concurrent(l, KEY(""), &d, &p), LEASE_ERR_INVALID_KEY);
  EXPECT(lease_acquire_concurrent(l, KEY("a\x1f" "b"), &d, &p), LEASE_ERR_INVALID_KEY);
  EXPECT(lease_acquire_concurrent(l, KEY("a\xff" "b"), &d, &p), LEASE_ERR_UTF8);
  memset(long_key, 'x', sizeof long_key);
  EXPECT(lease_acquire_concurrent(l, (const uint8_t *)long_key, sizeof long_key, &d, &p), LEASE_ERR_INVALID_KEY);
  CHECK(p == (lease_permit *)0x1, "permit written on a failure");
  /* The longest key takes permits as it takes tokens. */
  EXPECT(lease_acquire_concurrent(l, (const uint8_t *)long_key, sizeof long_key - 1, &d, &held), LEASE_OK);
  CHECK(d.allowed, "the longest key is admitted");
  lease_permit_free(held);
  /* Release twice; release a denial. */
  EXPECT(lease_acquire_concurrent(l, KEY("k"), &d, &held), LEASE_OK);
  CHECK(d.allowed && held != NULL, "admitted");
  EXPECT(lease_permit_release(held), LEASE_OK);
  EXPECT_ERR(lease_permit_release(held), LEASE_ERR_RESERVATION, "released already");
  CHECK(strcmp(lease_error_kind_name(LEASE_ERR_RESERVATION), "reservation") == 0, "kind name");
  lease_permit_free(held);
  EXPECT(lease_acquire_concurrent(l, KEY("k"), &d, &held), LEASE_OK);
  EXPECT(lease_acquire_concurrent(l, KEY("k"), &d, &denied), LEASE_OK);
  CHECK(!d.allowed && denied != NULL, "a denial is a handle too");
  EXPECT_ERR(lease_permit_release(denied), LEASE_ERR_RESERVATION, "no permit was taken");
  lease_permit_free(denied);
  lease_permit_free(held);
  /* A closed limiter: no new permits; a release is LEASE_ERR_CLOSED. */
  EXPECT(lease_acquire_concurrent(l, KEY("o"), &d, &open), LEASE_OK);
  CHECK(d.allowed, "admitted");
  EXPECT(lease_close(l), LEASE_OK);
  EXPECT_ERR(lease_acquire_concurrent(l, KEY("k"), &d, &p), LEASE_ERR_CLOSED, "closed");
  EXPECT_ERR(lease_permit_release(open), LEASE_ERR_CLOSED, "closed");
  lease_permit_free(open);
  lease_limiter_free(l);
}

#define ON_BOTH(fn)                                     \
  static void fn##_memory(void) { fn(0); }              \
  static void fn##_redis(void) { fn(1); }
ON_BOTH(at_most_the_limit_and_a_release_frees_one)
ON_BOTH(two_limiters_share_the_permits)
ON_BOTH(a_long_held_permit_is_kept)
ON_BOTH(free_without_release_releases)

/* A call's tier sets its concurrency; an unknown or unreadable tier is a
 * clear error that takes nothing. */
static void a_calls_tier_sets_its_concurrency(void) {
  lease_options *o = new_options();
  lease_limiter *l = NULL;
  lease_permit *a = NULL, *b = NULL, *c = NULL, *p = (lease_permit *)0x1;
  lease_decision d;
  EXPECT(lease_options_set_str(o, "url", "memory://c-concurrency-tiers"), LEASE_OK);
  EXPECT(lease_options_set_int(o, "limit", 100), LEASE_OK);
  EXPECT(lease_options_set_int(o, "concurrency", 3), LEASE_OK);
  EXPECT(lease_options_set_str(o, "tiers", "free=100/min, 1 concurrent; pro=100/min, 2 concurrent"), LEASE_OK);
  EXPECT(lease_limiter_new_from_options(o, &l), LEASE_OK);
  lease_options_free(o);
  if (!l) return;
  EXPECT(lease_acquire_concurrent_tier(l, KEY("a"), KEY("free"), &d, &a), LEASE_OK);
  CHECK(d.allowed && d.limit == 1, "free: allowed %d limit %llu", d.allowed, U(d.limit));
  EXPECT(lease_acquire_concurrent_tier(l, KEY("a"), KEY("free"), &d, &b), LEASE_OK);
  CHECK(!d.allowed, "free's one permit is held");
  lease_permit_free(b);
  b = NULL;
  EXPECT(lease_acquire_concurrent_tier(l, KEY("b"), KEY("pro"), &d, &b), LEASE_OK);
  CHECK(d.allowed && d.limit == 2, "pro: limit %llu", U(d.limit));
  EXPECT(lease_acquire_concurrent(l, KEY("c"), &d, &c), LEASE_OK);
  CHECK(d.allowed && d.limit == 3, "no tier: the limiter's concurrency, limit %llu", U(d.limit));
  EXPECT_ERR(lease_acquire_concurrent_tier(l, KEY("d"), KEY("gold"), &d, &p), LEASE_ERR_CONFIG, "gold");
  EXPECT_ERR(lease_acquire_concurrent_tier(l, KEY("d"), KEY("fr\xff"), &d, &p), LEASE_ERR_CONFIG, "UTF-8");
  EXPECT_ERR(lease_acquire_concurrent_tier(l, KEY("d"), NULL, 4, &d, &p), LEASE_ERR_NULL, "tier");
  CHECK(p == (lease_permit *)0x1, "permit written on a failure");
  lease_permit_free(a);
  lease_permit_free(b);
  lease_permit_free(c);
  lease_limiter_free(l);
}

int main(void) {
  redis_url = getenv("QL_REDIS_URL");
  if (!redis_url) {
    fprintf(stderr, "set QL_REDIS_URL (scripts/test-c.sh does)\n");
    return 2;
  }
  RUN(at_most_the_limit_and_a_release_frees_one_memory);
  RUN(two_limiters_share_the_permits_memory);
  RUN(a_long_held_permit_is_kept_memory);
  RUN(free_without_release_releases_memory);
  RUN(bad_input);
  RUN(a_calls_tier_sets_its_concurrency);
  RUN(at_most_the_limit_and_a_release_frees_one_redis);
  RUN(two_limiters_share_the_permits_redis);
  RUN(a_long_held_permit_is_kept_redis);
  RUN(free_without_release_releases_redis);
  SUMMARY();
}
