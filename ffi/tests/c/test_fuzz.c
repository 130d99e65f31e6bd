/* Hostile input through the C ABI (issue 13): random bytes and lengths as
 * keys (NULL with a length, lengths above PTRDIFF_MAX, invalid UTF-8, the
 * 512-byte edge), random costs, random option names and values, random
 * configurations, rates and URLs, and buffers of every size down to zero.
 * Every call must return a status from its documented set (the exact one
 * where the header says which); a panic inside liblease (LEASE_ERR_PANIC)
 * or a crash fails; under AddressSanitizer a read past an allocation or a
 * leak fails too. Every buffer handed to liblease (keys, strings, output
 * buffers) has exactly the size passed and ends where an inaccessible page
 * begins, so a read or write past it crashes the run, in plain builds and
 * under ASan alike (liblease's own Rust code is not ASan-instrumented; its
 * allocations are still tracked for leaks).
 *
 * The loop is deterministic: a fixed seed (QL_FUZZ_SEED and QL_FUZZ_ITERS
 * override it) drives a splitmix64 generator. A failed check prints the
 * iteration and the seed it ran with. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

#define S(st) (1u << (st))
#define OK S(LEASE_OK)
#define ERR_NULL S(LEASE_ERR_NULL)
#define ERR_CONFIG S(LEASE_ERR_CONFIG)
#define ERR_KEY S(LEASE_ERR_INVALID_KEY)
#define ERR_COST S(LEASE_ERR_INVALID_COST)
#define ERR_CLOSED S(LEASE_ERR_CLOSED)
#define ERR_UTF8 S(LEASE_ERR_UTF8)
#define ERR_SMALL S(LEASE_ERR_BUFFER_TOO_SMALL)

static const char *status_names[] = {"OK",   "NULL",   "CONFIG", "INVALID_KEY",      "INVALID_COST",
                                     "CLOSED", "BACKEND", "UTF8",  "BUFFER_TOO_SMALL", "PANIC"};

static uint64_t seed = 0x5eedf00dULL;
static long iterations = 10000;
static long iter;

static uint64_t state;
static uint64_t next_u64(void) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
static uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }
static int chance(unsigned pct) { return below(100) < pct; }
/* A number of random magnitude. (Each call to the generator is its own
 * statement here and below: C leaves the order of a call's arguments
 * unspecified, and the run must be the same under every compiler.) */
static uint64_t wide(void) {
  unsigned shift = (unsigned)below(64);
  return next_u64() >> shift;
}

/* How often each status came back (printed at the end: what the run covered). */
static long seen[16];

/* The status must be one of `allowed` (a mask of S(status)). */
#define CHECK_IN(call_status, allowed, what)                                                           \
  do {                                                                                                 \
    lease_status st_ = (call_status);                                                                 \
    seen[(unsigned)st_ < 16 ? (unsigned)st_ : 15]++;                                                  \
    CHECK((unsigned)st_ < 32 && ((allowed) & S(st_)), "iteration %ld: %s returned %d", iter, (what), \
          (int)st_);                                                                                   \
    CHECK(lease_last_error() != NULL, "iteration %ld: lease_last_error() is NULL", iter);            \
  } while (0)

/* Every buffer of the current action: `len` bytes that end where a
 * PROT_NONE page begins (a zero-length one points at that page). Released
 * after each action. */
static struct {
  void *base;
  size_t size;
} regions[64];
static int n_regions;

static void *fenced(size_t len) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t data = (len + page - 1) / page * page;
  if (n_regions == (int)(sizeof regions / sizeof *regions)) {
    fprintf(stderr, "too many buffers in one action\n");
    exit(2);
  }
  void *base = mmap(NULL, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED || mprotect((char *)base + data, page, PROT_NONE) != 0) {
    perror("mmap");
    exit(2);
  }
  regions[n_regions].base = base;
  regions[n_regions++].size = data + page;
  return (char *)base + data - len;
}

static void release_all(void) {
  while (n_regions > 0) {
    n_regions--;
    munmap(regions[n_regions].base, regions[n_regions].size);
  }
}

/* Strict UTF-8, as Rust's str::from_utf8 (no overlongs, no surrogates, at most U+10FFFF). */
static int valid_utf8(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return 0;
    }
    if (i + len > n) return 0;
    for (size_t j = 1; j < len; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return 0;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += len;
  }
  return 1;
}

/* A key: `len` bytes at `p` (fenced), or NULL. */
typedef struct {
  uint8_t *p;
  size_t len;
} key_t_;

static const char *pool[] = {"a", "user:42", "{x}", "\xc3\xa9", " ", "k:1", "k:2", "k\x1f" "60000"};

static key_t_ random_key(void) {
  key_t_ k = {NULL, 0};
  unsigned kind = (unsigned)below(12);
  if (kind == 0) { /* NULL with a length, or with none (the empty key) */
    k.len = chance(50) ? 0 : (size_t)(1 + below(4000));
    return k;
  }
  if (kind == 1) { /* a length no object can have: refused before any read */
    static uint8_t one = 'x';
    k.p = &one;
    k.len = chance(50) ? SIZE_MAX : (size_t)PTRDIFF_MAX + 1 + (size_t)below(1000);
    return k;
  }
  if (kind <= 6) { /* a pool key, so keys repeat */
    const char *s = pool[below(sizeof pool / sizeof *pool)];
    k.len = strlen(s);
    k.p = fenced(k.len);
    memcpy(k.p, s, k.len);
    return k;
  }
  if (kind <= 8) { /* around the 512-byte limit, one- or two-byte characters */
    int two = chance(50);
    size_t chars = two ? 250 + below(12) : 505 + below(14);
    k.len = two ? 2 * chars : chars;
    k.p = fenced(k.len);
    for (size_t i = 0; i < chars; i++) {
      if (two) {
        k.p[2 * i] = 0xC3, k.p[2 * i + 1] = 0xA9;
      } else {
        k.p[i] = 'k';
      }
    }
    return k;
  }
  /* random bytes or printable ASCII, 0..2000 long */
  k.len = (size_t)below(chance(50) ? 40 : 2001);
  k.p = fenced(k.len);
  int ascii = chance(50);
  for (size_t i = 0; i < k.len; i++) k.p[i] = ascii ? (uint8_t)(0x20 + below(95)) : (uint8_t)next_u64();
  return k;
}

/* What liblease must answer for this key before looking at anything else:
 * LEASE_ERR_NULL, LEASE_ERR_UTF8, LEASE_ERR_INVALID_KEY, or LEASE_OK (a key
 * that passes; `empty` says it is ""). */
static lease_status key_status(const key_t_ *k, int *empty) {
  *empty = 0;
  if (!k->p) {
    if (k->len) return LEASE_ERR_NULL;
    *empty = 1;
    return LEASE_OK;
  }
  if (k->len > (size_t)PTRDIFF_MAX) return LEASE_ERR_INVALID_KEY;
  if (!valid_utf8(k->p, k->len)) return LEASE_ERR_UTF8;
  *empty = k->len == 0;
  return LEASE_OK;
}

/* What acquire/inspect/set_limit answer for a key on an open limiter:
 * the key's own status, INVALID_KEY for "", more than 512 bytes or a byte
 * 0x1f (U+001F names the buckets of a key's further rules), else OK. */
static lease_status key_use_status(const key_t_ *k) {
  int empty;
  lease_status st = key_status(k, &empty);
  if (st != LEASE_OK) return st;
  if (empty || k->len > LEASE_MAX_KEY_LEN || memchr(k->p, 0x1f, k->len)) return LEASE_ERR_INVALID_KEY;
  return LEASE_OK;
}

/* A NUL-terminated string in exactly strlen + 1 fenced bytes. */
static char *dup_exact(const char *s) {
  size_t n = strlen(s);
  char *p = fenced(n + 1);
  memcpy(p, s, n + 1);
  return p;
}

static const char *option_names[] = {
    "url", "limit", "window_ms", "rate", "lease_size", "overshoot_budget", "refill_threshold", "lease_ttl_ms",
    "on_backend_failure", "expected_replicas", "backend_timeout_ms", "key_prefix", "max_keys", "mode", "clock",
    "clock_start_ms", "leaseSize", "windowMs", "clockStartMs", "maxKeys", "lese_size", "timeout", "",
    "tiers", "default_tier", "policy_file", "policy_refresh_ms", "defaultTier", "policyFile", "policyRefreshMs",
    "tier",
};
static const char *values[] = {
    "memory://", "memory://fuzz", "600/min", "10/s", "0/s", "5/ms", "manual", "system", "lease", "exact", "local",
    "deny", "allow", "static-share", "2%", "0%", "101%", "NaN%", "40", "-1", "", "ql", "x{y", "redis://127.0.0.1:1",
    "redis://:pw-Zq81@127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/svc", "rediss://127.0.0.1:1?ssl_ca_certs=/no",
    "http://x", "18446744073709551616", "free=2/s; pro=5/s, 50/min", "x=1/s, 2/s", "b@d=1/s", "free",
    "x=1/s,1/2s,1/3s,1/4s,1/5s", "/nonexistent/policy.toml", "tier:pro", "tier:", "10/s, 1000/day", "pro",
};

/* A NUL-terminated string: a listed one, a listed one with a byte changed,
 * random bytes (maybe invalid UTF-8), or a URL with credentials. */
static char *random_string(const char **list, size_t n) {
  unsigned kind = (unsigned)below(4);
  if (kind == 0) return dup_exact(list[below(n)]);
  if (kind == 1) {
    char *s = dup_exact(list[below(n)]);
    size_t len = strlen(s);
    if (len) {
      size_t at = (size_t)below(len);
      s[at] = (char)(1 + below(255));
    }
    return s;
  }
  size_t len = (size_t)below(kind == 2 ? 24 : 300);
  char *s = fenced(len + 1);
  for (size_t i = 0; i < len; i++) s[i] = (char)(1 + below(255));
  s[len] = 0;
  return s;
}

/* A URL whose user name and password (and a query secret) are markers that
 * must never come back from lease_redact_url. */
static char *credential_url(void) {
  static const char *schemes[] = {"redis", "rediss", "redis+cluster", "redis+sentinel", "unix", "memory", "x"};
  static const char *junk[] = {"", "@", ":", "/", "?", "#", ",", "%"};
  char buf[256];
  unsigned v[9];
  for (int i = 0; i < 9; i++) v[i] = (unsigned)below(65536);
  snprintf(buf, sizeof buf, "%s://Uq%04x%s:Pq%04x%s@h%u:%u,[::1]:6379/%u?sentinel_password=Sq%04x&protocol=3#%s",
           schemes[v[0] % 7], v[1], junk[v[2] % 8], v[3], junk[v[4] % 8], v[5] % 10, v[6], v[7] % 20, v[8],
           v[0] & 1 ? "insecure" : "Fq");
  return dup_exact(buf);
}

/* A fenced buffer of exactly `cap` bytes (NULL when cap is 0, or on purpose). */
static char *random_buffer(size_t *cap, int *null_with_cap) {
  *cap = (size_t)(chance(20) ? 0 : below(chance(50) ? 16 : 800));
  *null_with_cap = *cap > 0 && chance(5);
  if (*cap == 0 || *null_with_cap) return NULL;
  char *b = fenced(*cap);
  memset(b, 'x', *cap);
  return b;
}

static uint64_t random_cost(uint64_t limit) {
  switch (below(7)) {
    case 0: return 0;
    case 1: return UINT64_MAX;
    case 2: return next_u64();
    case 3: return limit + 1;
    case 4: return limit;
    default: return 1 + below(3);
  }
}

/* Limiter 4 takes every set_limit (the others' limits stay known) and is
 * closed three quarters of the way through. */
enum { N_LIMITERS = 5, POLICY_LIMITER = 4, CLOSED_LIMITER = 4 };
static lease_limiter *limiters[N_LIMITERS];
static uint64_t limits[N_LIMITERS] = {50, 20, 10, 10, 30};
static const uint64_t window = 1000;
static int closed[N_LIMITERS];

static void make_limiters(void) {
  uint32_t modes[N_LIMITERS] = {LEASE_MODE_LEASE, LEASE_MODE_LEASE, LEASE_MODE_EXACT, LEASE_MODE_LOCAL,
                                LEASE_MODE_LEASE};
  for (int i = 0; i < N_LIMITERS; i++) {
    lease_config c;
    lease_config_init(&c);
    c.limit = limits[i];
    c.window_ms = window;
    c.mode = modes[i];
    c.lease_size = i == 1 ? 5 : LEASE_AUTO;
    c.max_keys = 4;
    c.clock = LEASE_CLOCK_MANUAL;
    limiters[i] = new_limiter_or_exit(&c);
  }
}

static void check_decision(const lease_decision *d, int li) {
  CHECK(d->reason <= LEASE_REASON_LOCAL && d->reason != LEASE_REASON_PENDING &&
            d->reason != LEASE_REASON_FALLBACK,
        "iteration %ld: reason %u", iter, (unsigned)d->reason);
  CHECK(d->allowed ? d->retry_after_ms == 0 : d->retry_after_ms >= 1, "iteration %ld: allowed %d retry %llu", iter,
        d->allowed, (unsigned long long)d->retry_after_ms);
  CHECK(d->remaining <= d->limit, "iteration %ld: remaining %llu of %llu", iter, (unsigned long long)d->remaining,
        (unsigned long long)d->limit);
  if (li != POLICY_LIMITER) {
    CHECK(d->limit == limits[li] && d->window_ms == window, "iteration %ld: limit %llu window %llu", iter,
          (unsigned long long)d->limit, (unsigned long long)d->window_ms);
  }
  size_t cap;
  int null_cap;
  char *buf = random_buffer(&cap, &null_cap);
  size_t needed = 0;
  lease_status st = lease_decision_headers(d, null_cap ? NULL : buf, cap, chance(80) ? &needed : NULL);
  CHECK_IN(st, OK | ERR_SMALL | ERR_NULL, "lease_decision_headers");
  if (st == LEASE_OK) CHECK(strstr(buf, "RateLimit-Policy: ") == buf, "iteration %ld: headers %s", iter, buf);
}

/* Counts per limiter, to check lease_metrics against the decisions given. */
static uint64_t admitted[N_LIMITERS], denied[N_LIMITERS];

static void fuzz_acquire(void) {
  int li = (int)below(N_LIMITERS);
  lease_limiter *l = chance(3) ? NULL : limiters[li];
  key_t_ k = random_key();
  uint64_t cost = random_cost(limits[li]);
  lease_decision d;
  int out_null = chance(3);
  int wait = chance(60);
  lease_status st = wait ? lease_acquire(l, k.p, k.len, cost, out_null ? NULL : &d)
                         : lease_try_acquire(l, k.p, k.len, cost, out_null ? NULL : &d);
  lease_status want;
  unsigned allowed;
  if (!l || out_null) {
    want = LEASE_ERR_NULL, allowed = ERR_NULL;
  } else {
    want = key_use_status(&k);
    if (closed[li] && (want == LEASE_OK || want == LEASE_ERR_INVALID_KEY)) {
      /* A closed limiter refuses before it looks at the key's length. */
      int empty;
      want = key_status(&k, &empty) == LEASE_OK ? LEASE_ERR_CLOSED : want;
    }
    allowed = S(want);
    if (want == LEASE_OK) {
      if (li == POLICY_LIMITER) {
        allowed = OK | ERR_COST; /* set_limit may have changed this key's limit */
      } else if (cost == 0 || cost > limits[li]) {
        allowed = ERR_COST;
      }
    }
  }
  CHECK_IN(st, allowed, wait ? "lease_acquire" : "lease_try_acquire");
  if (st == LEASE_OK) {
    check_decision(&d, li);
    if (d.allowed) {
      admitted[li]++;
    } else {
      denied[li]++;
    }
  }
}

static void fuzz_set_limit(void) {
  int li = POLICY_LIMITER;
  lease_limiter *l = chance(3) ? NULL : limiters[li];
  key_t_ k = random_key();
  static const uint64_t edge[] = {0, 1, 2, 60, 1000, 1ULL << 26, 1ULL << 52, (1ULL << 52) + 1, UINT64_MAX};
  uint64_t lim = chance(50) ? edge[below(9)] : wide();
  uint64_t win = chance(50) ? edge[below(9)] : wide();
  lease_status st = lease_set_limit(l, k.p, k.len, lim, win);
  unsigned allowed;
  if (!l) {
    allowed = ERR_NULL;
  } else {
    lease_status want = key_use_status(&k);
    int empty;
    if (closed[li] && key_status(&k, &empty) == LEASE_OK) {
      want = LEASE_ERR_CLOSED;
    }
    allowed = S(want);
    if (want == LEASE_OK) {
      int ok = lim >= 1 && win >= 1 && lim <= (1ULL << 52) / win;
      allowed = ok ? OK : ERR_CONFIG;
    }
  }
  CHECK_IN(st, allowed, "lease_set_limit");
}

static void fuzz_inspect(void) {
  int li = (int)below(N_LIMITERS);
  lease_limiter *l = chance(3) ? NULL : limiters[li];
  key_t_ k = random_key();
  lease_inspection in;
  int out_null = chance(3);
  lease_status st = lease_inspect(l, k.p, k.len, out_null ? NULL : &in);
  unsigned allowed;
  if (!l || out_null) {
    allowed = ERR_NULL;
  } else {
    lease_status want = key_use_status(&k);
    int empty;
    if (closed[li] && key_status(&k, &empty) == LEASE_OK) want = LEASE_ERR_CLOSED;
    allowed = S(want);
  }
  CHECK_IN(st, allowed, "lease_inspect");
  if (st == LEASE_OK) {
    CHECK(in.window_ms >= 1 && in.limit >= 1, "iteration %ld: inspect limit %llu", iter,
          (unsigned long long)in.limit);
    if (li != POLICY_LIMITER) CHECK(in.limit == limits[li], "iteration %ld: inspect limit", iter);
    CHECK(in.admitted <= admitted[li] && in.denied <= denied[li], "iteration %ld: inspect counts", iter);
  }
}

static void fuzz_http_key(void) {
  key_t_ k = random_key();
  size_t cap;
  int null_cap;
  char *buf = random_buffer(&cap, &null_cap);
  size_t needed = 0;
  int want_needed = chance(80);
  lease_status st = lease_http_key(k.p, k.len, null_cap ? NULL : buf, cap, want_needed ? &needed : NULL);
  int empty;
  lease_status ks = key_status(&k, &empty);
  unsigned allowed = S(ks);
  if (ks == LEASE_OK) allowed = OK | ERR_SMALL | (null_cap ? ERR_NULL : 0);
  CHECK_IN(st, allowed, "lease_http_key");
  /* Hashed: over 512 bytes, or holding U+001F (the rule buckets' separator). */
  int hashed = ks == LEASE_OK && (k.len > LEASE_MAX_KEY_LEN || (k.p && memchr(k.p, 0x1f, k.len)));
  if (ks == LEASE_OK && want_needed) {
    size_t result = hashed ? 71 : k.len;
    CHECK(needed == result + 1, "iteration %ld: needed %zu for a %zu-byte key", iter, needed, k.len);
  }
  if (st == LEASE_OK) {
    if (!hashed) {
      CHECK(strlen(buf) == k.len && memcmp(buf, k.p ? (const void *)k.p : "", k.len) == 0,
            "iteration %ld: http_key changed a short key", iter);
    } else {
      CHECK(strncmp(buf, "sha256:", 7) == 0 && strlen(buf) == 71, "iteration %ld: http_key %s", iter, buf);
    }
  } else if (st == LEASE_ERR_BUFFER_TOO_SMALL && cap > 0 && !null_cap) {
    CHECK(buf[0] == 0, "iteration %ld: a short buffer did not get \"\"", iter);
  }
}

static void fuzz_redact(void) {
  int cred = chance(50);
  char *url = chance(3) ? NULL : cred ? credential_url() : random_string(values, sizeof values / sizeof *values);
  size_t cap;
  int null_cap;
  char *buf = random_buffer(&cap, &null_cap);
  size_t needed = 0;
  lease_status st = lease_redact_url(url, null_cap ? NULL : buf, cap, chance(80) ? &needed : NULL);
  unsigned allowed = !url ? ERR_NULL
                          : !valid_utf8((const uint8_t *)url, strlen(url)) ? ERR_UTF8
                                                                           : OK | ERR_SMALL | (null_cap ? ERR_NULL : 0);
  CHECK_IN(st, allowed, "lease_redact_url");
  if (st == LEASE_OK && cred) {
    CHECK(!strstr(buf, "Uq") && !strstr(buf, "Pq") && !strstr(buf, "Sq"), "iteration %ld: %s -> %s", iter, url,
          buf);
  }
}

static void fuzz_parse_rate(void) {
  static const char *rates[] = {"600/min", "10/s", "100/30s", " 5000 / hour ", "1/ms", "4503599627370496/ms",
                                "1/4503599627370497ms", "0/s", "10/0s", "18446744073709551615/day", "x/s", "10"};
  char *rate = chance(3) ? NULL : random_string(rates, sizeof rates / sizeof *rates);
  uint64_t lim = 0, win = 0;
  int nulls = (int)below(6); /* 0: limit NULL, 1: window NULL */
  lease_status st = lease_parse_rate(rate, nulls == 0 ? NULL : &lim, nulls == 1 ? NULL : &win);
  unsigned allowed;
  if (!rate || nulls <= 1) {
    allowed = ERR_NULL;
  } else {
    allowed = valid_utf8((const uint8_t *)rate, strlen(rate)) ? OK | ERR_CONFIG : ERR_UTF8;
  }
  CHECK_IN(st, allowed, "lease_parse_rate");
  if (st == LEASE_OK && nulls > 1) {
    CHECK(lim >= 1 && win >= 1 && lim <= (1ULL << 52) / win, "iteration %ld: %s -> %llu/%llu", iter, rate,
          (unsigned long long)lim, (unsigned long long)win);
  }
}

static void fuzz_names(void) {
  char *s = chance(5) ? NULL : random_string(values, sizeof values / sizeof *values);
  int valid = s && valid_utf8((const uint8_t *)s, strlen(s));
  lease_mode m;
  lease_failure_policy p;
  int out_null = chance(5);
  unsigned allowed = (!s || out_null) ? ERR_NULL : valid ? OK | ERR_CONFIG : ERR_UTF8;
  CHECK_IN(lease_mode_parse(s, out_null ? NULL : &m), allowed, "lease_mode_parse");
  CHECK_IN(lease_failure_policy_parse(s, out_null ? NULL : &p), allowed, "lease_failure_policy_parse");
  CHECK(lease_reason_name((lease_reason)next_u64()) != NULL, "iteration %ld: reason name NULL", iter);
  CHECK(lease_error_kind_name((uint32_t)next_u64()) != NULL, "iteration %ld: kind name NULL", iter);
}

/* lease_acquire_tier / lease_try_acquire_tier with a random tier (the
 * fuzzed limiters define none): a tier that cannot be read is a clear
 * status before anything else, a readable one is never admitted. */
static void fuzz_tier(void) {
  int li = (int)below(N_LIMITERS);
  lease_limiter *l = chance(3) ? NULL : limiters[li];
  key_t_ k = random_key();
  key_t_ t = chance(25) ? (key_t_){NULL, 0} : random_key();
  uint64_t cost = random_cost(limits[li]);
  lease_decision d;
  int out_null = chance(3), wait = chance(50), empty;
  lease_status st = wait ? lease_acquire_tier(l, k.p, k.len, cost, t.p, t.len, out_null ? NULL : &d)
                         : lease_try_acquire_tier(l, k.p, k.len, cost, t.p, t.len, out_null ? NULL : &d);
  lease_status ts = key_status(&t, &empty);
  unsigned allowed;
  if (ts == LEASE_ERR_NULL) {
    allowed = ERR_NULL;
  } else if (ts != LEASE_OK) {
    allowed = ERR_CONFIG; /* not UTF-8, or no length at all: it names no tier */
  } else if (!l || out_null) {
    allowed = ERR_NULL;
  } else if (!t.p) {
    allowed = OK | ERR_COST | ERR_CLOSED | S(key_use_status(&k)); /* no tier: lease_acquire */
  } else {
    /* fuzz_policy may define tiers in the store of the policy limiter. */
    allowed = ERR_CONFIG | ERR_COST | ERR_CLOSED | S(key_use_status(&k)) | (li == POLICY_LIMITER ? OK : 0);
    CHECK(st != LEASE_OK || li == POLICY_LIMITER, "iteration %ld: a tier no limiter defines was admitted", iter);
  }
  CHECK_IN(st, allowed, wait ? "lease_acquire_tier" : "lease_try_acquire_tier");
  if (st == LEASE_OK) {
    CHECK(d.rule < d.rule_count && d.rule_count <= LEASE_MAX_RULES && d.rule_limits[d.rule] == d.limit &&
              d.rule_window_ms[d.rule] == d.window_ms && (li == POLICY_LIMITER || d.rule_count == 1),
          "iteration %ld: rule %u of %u", iter, d.rule, d.rule_count);
    check_decision(&d, li);
    if (d.allowed) {
      admitted[li]++;
    } else {
      denied[li]++;
    }
  }
}

/* The store calls on the limiter that takes every set_limit, with random
 * names, rules, assignments, keys and buffers. */
static void fuzz_policy(void) {
  static const char *names[] = {"free", "pro", "gold", "b@d", "", "x.y-z_1", "tier:pro"};
  static const char *rules[] = {"1/s", "10/s, 1000/day", "1/s, 2/s", "0/s", "1/fortnight", "", "tier:pro",
                                "tier:", "5/min", "x=1/s"};
  lease_limiter *l = chance(3) ? NULL : limiters[POLICY_LIMITER];
  key_t_ k = random_key();
  char *name = chance(5) ? NULL : random_string(names, sizeof names / sizeof *names);
  char *text = chance(5) ? NULL : random_string(rules, sizeof rules / sizeof *rules);
  uint64_t version = 0;
  size_t cap, needed = 0;
  int null_cap;
  char *buf = random_buffer(&cap, &null_cap);
  unsigned any = OK | ERR_CONFIG | ERR_NULL | ERR_UTF8 | S(LEASE_ERR_INVALID_KEY) | ERR_CLOSED | ERR_SMALL;
  lease_status st;
  switch (below(7)) {
    case 0: st = lease_policy_set_tier(l, name, text, chance(50) ? &version : NULL); break;
    case 1: st = lease_policy_delete_tier(l, name, chance(50) ? &version : NULL); break;
    case 2: st = lease_policy_assign(l, k.p, k.len, text, chance(50) ? &version : NULL); break;
    case 3: st = lease_policy_unassign(l, k.p, k.len, chance(50) ? &version : NULL); break;
    case 4: st = lease_policy_get(l, k.p, k.len, null_cap ? NULL : buf, cap, &needed); break;
    case 5: {
      key_t_ t = random_key();
      st = lease_policy_describe(l, k.p, k.len, t.p, t.len, null_cap ? NULL : buf, cap, &needed);
      break;
    }
    default: st = lease_refresh_policies(l); break;
  }
  CHECK_IN(st, l ? any : ERR_NULL, "lease_policy_*");
}

/* Options by name, then a limiter from them (used only when it is on memory://). */
static void fuzz_options(void) {
  lease_options *o = NULL;
  EXPECT(lease_options_new(&o), LEASE_OK);
  int memory = 0, n = (int)below(8);
  for (int i = 0; i < n; i++) {
    char *name = chance(3) ? NULL : random_string(option_names, sizeof option_names / sizeof *option_names);
    int name_valid = name && valid_utf8((const uint8_t *)name, strlen(name));
    lease_options *target = chance(3) ? NULL : o;
    lease_status st;
    if (chance(50)) {
      char *value = chance(3) ? NULL : random_string(values, sizeof values / sizeof *values);
      int value_valid = value && valid_utf8((const uint8_t *)value, strlen(value));
      st = lease_options_set_str(target, name, value);
      unsigned allowed = (!target || !name) ? ERR_NULL
                         : !name_valid  ? ERR_UTF8
                         : !value       ? ERR_NULL
                         : !value_valid ? ERR_UTF8
                                        : OK | ERR_CONFIG;
      CHECK_IN(st, allowed, "lease_options_set_str");
      if (st == LEASE_OK && strcmp(name, "url") == 0) memory = strncmp(value, "memory://", 9) == 0;
    } else {
      static const int64_t edge[] = {0, 1, -1, 10, 1000, INT64_MAX, INT64_MIN, 1LL << 52};
      int64_t v = chance(50) ? edge[below(8)] : (int64_t)next_u64();
      st = lease_options_set_int(target, name, v);
      unsigned allowed = (!target || !name) ? ERR_NULL : !name_valid ? ERR_UTF8 : OK | ERR_CONFIG;
      CHECK_IN(st, allowed, "lease_options_set_int");
    }
  }
  if (chance(30)) memory = lease_options_set_str(o, "url", "memory://") == LEASE_OK;
  lease_limiter *l = NULL;
  lease_status st = lease_limiter_new_from_options(chance(3) ? NULL : o, &l);
  CHECK_IN(st, OK | ERR_CONFIG | ERR_NULL, "lease_limiter_new_from_options");
  if (st == LEASE_OK && memory) {
    /* Only a memory:// limiter is used: nothing leaves the process. */
    lease_decision d;
    CHECK_IN(lease_acquire(l, KEY("k"), 1, &d), OK, "lease_acquire on a limiter from fuzzed options");
    CHECK_IN(lease_try_acquire(l, KEY("k"), 1, &d), OK, "lease_try_acquire on a limiter from fuzzed options");
    lease_advance_clock(l, below(1ULL << 40));
    CHECK_IN(lease_settle(l), OK, "lease_settle");
    CHECK_IN(lease_close(l), OK, "lease_close");
  }
  lease_limiter_free(l);
  lease_options_free(o);
  lease_options_free(NULL);
}

/* A lease_config with random fields, then a limiter from it (only used on memory://). */
static void fuzz_config(void) {
  lease_config c;
  lease_config_init(&c);
  char *url = NULL, *prefix = NULL;
  if (chance(50)) c.url = url = chance(10) ? NULL : random_string(values, sizeof values / sizeof *values);
  if (chance(20)) c.key_prefix = prefix = chance(10) ? NULL : random_string(values, sizeof values / sizeof *values);
  uint64_t *fields[] = {&c.limit, &c.window_ms, &c.lease_size, &c.refill_threshold, &c.lease_ttl_ms,
                        &c.expected_replicas, &c.backend_timeout_ms, &c.max_keys, &c.clock_start_ms};
  static const uint64_t edge[] = {0, 1, 2, 10, 1000, LEASE_AUTO, 1ULL << 52, (1ULL << 52) + 1, 60001};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
    if (chance(40)) *fields[i] = chance(50) ? edge[below(9)] : wide();
  }
  if (chance(10)) c.mode = (lease_mode)below(5);
  if (chance(10)) c.on_backend_failure = (lease_failure_policy)below(5);
  if (chance(50)) c.clock = (lease_clock)below(chance(90) ? 2 : 1000);
  lease_limiter *l = NULL;
  int null_config = chance(3), null_out = chance(3);
  lease_status st = lease_limiter_new(null_config ? NULL : &c, null_out ? NULL : &l);
  CHECK_IN(st, OK | ERR_CONFIG | ERR_NULL | ERR_UTF8, "lease_limiter_new");
  if (st == LEASE_OK && c.url && strncmp(c.url, "memory://", 9) == 0 && c.clock == LEASE_CLOCK_MANUAL) {
    lease_decision d;
    /* limit >= 1, so a cost of 1 is always valid */
    CHECK_IN(lease_acquire(l, KEY("k"), 1, &d), OK, "lease_acquire on a fuzzed config");
    CHECK_IN(lease_advance_clock(l, below(1ULL << 40)), OK, "lease_advance_clock");
    CHECK_IN(lease_try_acquire(l, KEY("k"), 1, &d), OK, "lease_try_acquire on a fuzzed config");
  }
  if (st == LEASE_OK && c.clock == LEASE_CLOCK_MANUAL) {
    CHECK(c.clock_start_ms <= (1ULL << 52), "iteration %ld: a manual clock starting at %llu ms was accepted", iter,
          (unsigned long long)c.clock_start_ms);
  }
  lease_limiter_free(l);
}

static void fuzz_buffers(void) {
  int li = (int)below(N_LIMITERS);
  size_t cap;
  int null_cap;
  char *buf = random_buffer(&cap, &null_cap);
  size_t needed = 0;
  int null_limiter = chance(3), null_needed = chance(20);
  lease_status st = lease_metrics_prometheus(null_limiter ? NULL : limiters[li], null_cap ? NULL : buf, cap,
                                             null_needed ? NULL : &needed);
  CHECK_IN(st, OK | ERR_SMALL | ERR_NULL, "lease_metrics_prometheus");
  struct lease_metrics m;
  int null_out = chance(3);
  CHECK_IN(lease_metrics(limiters[li], null_out ? NULL : &m), null_out ? ERR_NULL : OK, "lease_metrics");
  if (!null_out) {
    CHECK(m.admitted == admitted[li] && m.denied == denied[li],
          "iteration %ld: limiter %d metrics admitted %llu denied %llu, decisions %llu / %llu", iter, li,
          (unsigned long long)m.admitted, (unsigned long long)m.denied, (unsigned long long)admitted[li],
          (unsigned long long)denied[li]);
    CHECK(m.keys_tracked <= 4, "iteration %ld: %llu keys tracked, max_keys 4", iter,
          (unsigned long long)m.keys_tracked);
    CHECK(m.backend_errors == 0 && m.fallback_active == 0, "iteration %ld: memory authority failed", iter);
  }
}

static void fuzz_clock(void) {
  int li = (int)below(N_LIMITERS);
  /* Mostly short moves (so keys run dry and get denied), some of up to
   * 2^40 ms (the engine's time arithmetic holds to 2^53). */
  uint64_t ms = chance(90) ? below(50) : below(1ULL << 40);
  CHECK_IN(lease_advance_clock(chance(3) ? NULL : limiters[li], ms), OK | ERR_NULL, "lease_advance_clock");
  CHECK_IN(lease_settle(limiters[li]), closed[li] ? ERR_CLOSED : OK, "lease_settle");
}

static void fuzz_all(void) {
  void (*actions[])(void) = {fuzz_acquire, fuzz_acquire,  fuzz_acquire, fuzz_acquire,  fuzz_set_limit,
                             fuzz_inspect, fuzz_http_key, fuzz_redact,  fuzz_parse_rate, fuzz_names,
                             fuzz_options, fuzz_config,   fuzz_buffers, fuzz_clock,      fuzz_tier,
                             fuzz_tier,    fuzz_policy};
  size_t n = sizeof actions / sizeof *actions;
  make_limiters();
  state = seed;
  for (iter = 0; iter < iterations; iter++) {
    if (iter == iterations * 3 / 4) {
      EXPECT(lease_close(limiters[CLOSED_LIMITER]), LEASE_OK);
      closed[CLOSED_LIMITER] = 1;
    }
    actions[below(n)]();
    release_all();
    if (case_failures > 20) {
      fprintf(stderr, "  stopping after %d failed checks (seed %llu)\n", case_failures, (unsigned long long)seed);
      break;
    }
  }
  if (case_failures) fprintf(stderr, "  seed %llu, %ld iterations\n", (unsigned long long)seed, iterations);
  printf("seed %llu, %ld iterations; statuses returned:", (unsigned long long)seed, iter);
  for (int i = 0; i < 16; i++) {
    if (seen[i]) printf(" %s=%ld", i <= LEASE_ERR_PANIC ? status_names[i] : "other", seen[i]);
  }
  printf("; decisions: %llu admitted, %llu denied\n", (unsigned long long)(admitted[0] + admitted[1] + admitted[2] + admitted[3] + admitted[4]),
         (unsigned long long)(denied[0] + denied[1] + denied[2] + denied[3] + denied[4]));
  for (int i = 0; i < N_LIMITERS; i++) {
    lease_limiter_free(limiters[i]);
    limiters[i] = NULL;
  }
}

int main(void) {
  const char *s = getenv("QL_FUZZ_SEED"), *n = getenv("QL_FUZZ_ITERS");
  if (s) seed = strtoull(s, NULL, 0);
  if (n) iterations = strtol(n, NULL, 0);
  RUN(fuzz_all);
  SUMMARY();
}
