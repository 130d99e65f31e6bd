/* The conformance-vector runner in C (format: tests/vectors/README.md).
 * Usage: test_vectors VECTOR_DIR memory
 *        test_vectors VECTOR_DIR redis redis://127.0.0.1:PORT */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "json.h"

#define MAX_INSTANCES 8

static const char *backend;
static const char *redis_url;
static int run_counter;
static int steps_total;

/* The vectors' error kind of a status: the core's name (lease_error_kind_name). */
static const char *kind_name(lease_status s) {
  const char *k = lease_error_kind_name(s);
  return s == LEASE_OK ? "ok" : *k ? k : "other";
}

static uint64_t u64_of(const jval *v, const char *what) {
  if (!v || v->type != J_NUM || !v->is_uint) {
    fprintf(stderr, "vector error: %s must be a non-negative integer\n", what);
    exit(2);
  }
  return v->uint;
}

/* Set one JSON config object's options by name (numbers with
 * lease_options_set_int, strings with lease_options_set_str): the names,
 * their values and the rules between them are the core's. */
static lease_status apply_config(lease_options *o, const jval *obj) {
  size_t i;
  if (!obj) return LEASE_OK;
  for (i = 0; i < obj->count; i++) {
    const char *k = obj->keys[i];
    const jval *v = &obj->items[i];
    lease_status s = v->type == J_STR ? lease_options_set_str(o, k, v->str)
                                      : lease_options_set_int(o, k, (int64_t)u64_of(v, k));
    if (s != LEASE_OK) return s;
  }
  return LEASE_OK;
}

/* One limiter of a vector: a unique url and key_prefix, the manual clock (it
 * starts at 1000000 ms, the core's default), the vector's config, then a
 * step's (for "new"). *out is NULL on failure. */
static lease_status new_instance(const char *url, const char *prefix, const jval *base, const jval *extra,
                                 lease_limiter **out) {
  lease_options *o = NULL;
  lease_status s = lease_options_new(&o);
  *out = NULL;
  if (s == LEASE_OK) s = lease_options_set_str(o, "url", url);
  if (s == LEASE_OK) s = lease_options_set_str(o, "key_prefix", prefix);
  if (s == LEASE_OK) s = lease_options_set_str(o, "clock", "manual");
  if (s == LEASE_OK) s = apply_config(o, base);
  if (s == LEASE_OK) s = apply_config(o, extra);
  if (s == LEASE_OK) s = lease_limiter_new_from_options(o, out);
  lease_options_free(o);
  return s;
}

/* The step's key: a string, or {"repeat": "x", "times": N}; "k" when absent. */
static char *key_of(const jval *step, size_t *len) {
  const jval *k = json_get(step, "key");
  char *out;
  if (k && k->type == J_STR) {
    out = malloc(k->len + 1);
    memcpy(out, k->str, k->len + 1);
    *len = k->len;
    return out;
  }
  if (k && k->type == J_OBJ) {
    const jval *rep = json_get(k, "repeat");
    size_t times = (size_t)u64_of(json_get(k, "times"), "times"), i;
    out = malloc(rep->len * times + 1);
    for (i = 0; i < times; i++) memcpy(out + i * rep->len, rep->str, rep->len);
    *len = rep->len * times;
    out[*len] = '\0';
    return out;
  }
  out = malloc(2);
  strcpy(out, "k");
  *len = 1;
  return out;
}

/* The step's tier (NULL, 0: none), as lease_acquire_tier takes it. */
static const uint8_t *tier_of(const jval *step, size_t *len) {
  const jval *t = json_get(step, "tier");
  if (!t || t->type != J_STR) {
    *len = 0;
    return NULL;
  }
  *len = t->len;
  return (const uint8_t *)t->str;
}

/* A string field of a step (the vector is malformed without it). */
static const char *str_of(const jval *step, const char *field) {
  const jval *v = json_get(step, field);
  if (!v || v->type != J_STR) {
    fprintf(stderr, "vector error: %s must be a string\n", field);
    exit(2);
  }
  return v->str;
}

static int check_decision(const char *ctx, const lease_decision *d, const jval *expect) {
  size_t i;
  int bad = 0;
  if (!expect) return 0;
  for (i = 0; i < expect->count; i++) {
    const char *k = expect->keys[i];
    const jval *v = &expect->items[i];
    if (!strcmp(k, "allowed")) {
      if ((v->type != J_BOOL) || (v->boolean != (int)d->allowed)) bad = 1;
    } else if (!strcmp(k, "reason")) {
      if (strcmp(v->str, lease_reason_name(d->reason)) != 0) bad = 1;
    } else {
      uint64_t got;
      if (!strcmp(k, "limit")) got = d->limit;
      else if (!strcmp(k, "remaining")) got = d->remaining;
      else if (!strcmp(k, "retry_after_ms")) got = d->retry_after_ms;
      else if (!strcmp(k, "reset_after_ms")) got = d->reset_after_ms;
      else if (!strcmp(k, "window_ms")) got = d->window_ms;
      else if (!strcmp(k, "rule")) got = d->rule;
      else {
        fprintf(stderr, "%s: unknown decision field %s\n", ctx, k);
        return 1;
      }
      if (!v->is_uint || v->uint != got) bad = 1;
    }
    if (bad) {
      char *e = json_dump(expect);
      fprintf(stderr,
              "  %s: field %s: expected %s; got allowed=%d reason=%s limit=%llu remaining=%llu "
              "retry_after_ms=%llu reset_after_ms=%llu window_ms=%llu rule=%u of %u\n",
              ctx, k, e, d->allowed, lease_reason_name(d->reason), (unsigned long long)d->limit,
              (unsigned long long)d->remaining, (unsigned long long)d->retry_after_ms,
              (unsigned long long)d->reset_after_ms, (unsigned long long)d->window_ms, d->rule, d->rule_count);
      free(e);
      return 1;
    }
  }
  return 0;
}

static int check_metrics(const char *ctx, const struct lease_metrics *m, const jval *expect) {
  static const struct {
    const char *name;
    size_t offset;
  } fields[] = {
#define F(n) {#n, offsetof(struct lease_metrics, n)}
      F(admitted),        F(denied),          F(backend_calls),        F(backend_errors),
      F(tokens_leased),   F(tokens_returned), F(tokens_expired),       F(fallback_active),
      F(fallback_transitions), F(keys_tracked), F(overshoot_bound),
#undef F
  };
  size_t i, j;
  for (i = 0; i < expect->count; i++) {
    int found = 0;
    for (j = 0; j < sizeof fields / sizeof fields[0]; j++) {
      if (strcmp(fields[j].name, expect->keys[i]) == 0) {
        uint64_t got = *(const uint64_t *)((const char *)m + fields[j].offset);
        found = 1;
        if (got != expect->items[i].uint) {
          fprintf(stderr, "  %s: metric %s: expected %llu, got %llu\n", ctx, expect->keys[i],
                  (unsigned long long)expect->items[i].uint, (unsigned long long)got);
          return 1;
        }
      }
    }
    if (!found) {
      fprintf(stderr, "  %s: unknown metric %s\n", ctx, expect->keys[i]);
      return 1;
    }
  }
  return 0;
}

static void settle_all(lease_limiter **ls, int n, const char *name, int *failed) {
  int i;
  for (i = 0; i < n; i++) {
    lease_status s = lease_settle(ls[i]);
    if (s != LEASE_OK && s != LEASE_ERR_CLOSED) {
      fprintf(stderr, "  %s: settle failed: %s\n", name, lease_last_error());
      *failed = 1;
    }
  }
}

/* Run one vector; returns the number of failed steps (0 = pass). */
static int run_vector(const char *path) {
  char err[256], url[256], prefix[64], ctx[512];
  char *text = json_read_file(path);
  jval *v;
  const jval *base, *steps;
  const char *name;
  lease_limiter *ls[MAX_INSTANCES];
  int instances, i, failed = 0;
  size_t si;
  if (!text) {
    fprintf(stderr, "cannot read %s\n", path);
    return 1;
  }
  v = json_parse(text, err, sizeof err);
  free(text);
  if (!v) {
    fprintf(stderr, "%s: %s\n", path, err);
    return 1;
  }
  name = json_get(v, "name")->str;
  base = json_get(v, "config");
  steps = json_get(v, "steps");
  instances = json_get(v, "instances") ? (int)u64_of(json_get(v, "instances"), "instances") : 1;
  if (instances < 1 || instances > MAX_INSTANCES) {
    fprintf(stderr, "%s: bad instances\n", name);
    json_free(v);
    return 1;
  }
  run_counter++;
  snprintf(prefix, sizeof prefix, "c%dv%d", (int)getpid(), run_counter);
  if (redis_url) snprintf(url, sizeof url, "%s", redis_url);
  else snprintf(url, sizeof url, "memory://%s-%s", name, prefix);

  for (i = 0; i < instances; i++) {
    if (new_instance(url, prefix, base, NULL, &ls[i]) != LEASE_OK) {
      fprintf(stderr, "%s: cannot build instance %d: %s\n", name, i, lease_last_error());
      while (i-- > 0) lease_limiter_free(ls[i]);
      json_free(v);
      return 1;
    }
  }

  for (si = 0; si < steps->count; si++) {
    const jval *step = &steps->items[si];
    const jval *only = json_get(step, "only");
    const jval *inst = json_get(step, "instance");
    const jval *cost_v = json_get(step, "cost");
    const jval *expect = json_get(step, "expect");
    const jval *expect_error = json_get(step, "expect_error");
    const char *op = json_get(step, "op")->str;
    lease_limiter *l;
    uint64_t cost = cost_v ? u64_of(cost_v, "cost") : 1;
    int has_outcome = 0, bad = 0;
    lease_status s = LEASE_OK;
    lease_decision d;
    if (only && strcmp(only->str, backend) != 0) continue;
    l = ls[inst ? (int)u64_of(inst, "instance") : 0];
    snprintf(ctx, sizeof ctx, "%s [%s] step %zu (%s)", name, backend, si, op);

    if (!strcmp(op, "acquire") || !strcmp(op, "try_acquire")) {
      size_t klen, tlen;
      char *key = key_of(step, &klen);
      const uint8_t *tier = tier_of(step, &tlen);
      /* No tier: the plain calls, so both entry points are played. */
      if (tier) {
        s = op[0] == 'a' ? lease_acquire_tier(l, (const uint8_t *)key, klen, cost, tier, tlen, &d)
                         : lease_try_acquire_tier(l, (const uint8_t *)key, klen, cost, tier, tlen, &d);
      } else {
        s = op[0] == 'a' ? lease_acquire(l, (const uint8_t *)key, klen, cost, &d)
                         : lease_try_acquire(l, (const uint8_t *)key, klen, cost, &d);
      }
      free(key);
      has_outcome = 1;
    } else if (!strcmp(op, "acquire_n")) {
      size_t klen, tlen;
      char *key = key_of(step, &klen);
      const uint8_t *tier = tier_of(step, &tlen);
      uint64_t n = u64_of(json_get(step, "count"), "count"), k, a = 0, dn = 0;
      for (k = 0; k < n; k++) {
        if (lease_acquire_tier(l, (const uint8_t *)key, klen, cost, tier, tlen, &d) != LEASE_OK) {
          fprintf(stderr, "  %s: acquire failed: %s\n", ctx, lease_last_error());
          bad = 1;
          break;
        }
        if (d.allowed) a++;
        else dn++;
        settle_all(ls, instances, ctx, &bad);
      }
      free(key);
      if (!bad && (a != u64_of(json_get(expect, "allowed"), "allowed") ||
                   dn != u64_of(json_get(expect, "denied"), "denied"))) {
        char *e = json_dump(expect);
        fprintf(stderr, "  %s: allowed %llu denied %llu, expected %s\n", ctx, (unsigned long long)a,
                (unsigned long long)dn, e);
        free(e);
        bad = 1;
      }
    } else if (!strcmp(op, "advance")) {
      uint64_t ms = u64_of(json_get(step, "ms"), "ms");
      for (i = 0; i < instances; i++) {
        if (lease_advance_clock(ls[i], ms) != LEASE_OK) bad = 1;
      }
    } else if (!strcmp(op, "settle")) {
      /* the settle after every step */
    } else if (!strcmp(op, "set_limit")) {
      size_t klen;
      char *key = key_of(step, &klen);
      s = lease_set_limit(l, (const uint8_t *)key, klen, u64_of(json_get(step, "limit"), "limit"),
                          u64_of(json_get(step, "window_ms"), "window_ms"));
      free(key);
      if (expect_error ? strcmp(kind_name(s), expect_error->str) != 0 : s != LEASE_OK) {
        fprintf(stderr, "  %s: got %s (%s)\n", ctx, kind_name(s), lease_last_error());
        bad = 1;
      }
    } else if (!strncmp(op, "policy_", 7)) {
      /* The shared store; the settle below refreshes every instance. */
      size_t klen = 0;
      char *key = NULL;
      if (!strcmp(op, "policy_set_tier")) {
        s = lease_policy_set_tier(l, str_of(step, "name"), str_of(step, "rules"), NULL);
      } else if (!strcmp(op, "policy_delete_tier")) {
        s = lease_policy_delete_tier(l, str_of(step, "name"), NULL);
      } else if (!strcmp(op, "policy_assign")) {
        key = key_of(step, &klen);
        s = lease_policy_assign(l, (const uint8_t *)key, klen, str_of(step, "assignment"), NULL);
      } else if (!strcmp(op, "policy_unassign")) {
        key = key_of(step, &klen);
        s = lease_policy_unassign(l, (const uint8_t *)key, klen, NULL);
      } else {
        fprintf(stderr, "  %s: unknown op\n", ctx);
        bad = 1;
      }
      free(key);
      if (!bad && (expect_error ? strcmp(kind_name(s), expect_error->str) != 0 : s != LEASE_OK)) {
        fprintf(stderr, "  %s: got %s (%s)\n", ctx, kind_name(s), s == LEASE_OK ? "" : lease_last_error());
        bad = 1;
      }
    } else if (!strcmp(op, "flush") || !strcmp(op, "close")) {
      s = op[0] == 'f' ? lease_flush(l) : lease_close(l);
      if (s != LEASE_OK) {
        fprintf(stderr, "  %s: %s\n", ctx, lease_last_error());
        bad = 1;
      }
    } else if (!strcmp(op, "metrics")) {
      struct lease_metrics m;
      if (lease_metrics(l, &m) != LEASE_OK || check_metrics(ctx, &m, expect)) bad = 1;
    } else if (!strcmp(op, "new")) {
      lease_limiter *extra = NULL;
      s = new_instance(url, prefix, base, json_get(step, "config"), &extra);
      lease_limiter_free(extra);
      if (strcmp(kind_name(s), expect_error->str) != 0) {
        fprintf(stderr, "  %s: expected error %s, got %s (%s)\n", ctx, expect_error->str, kind_name(s),
                lease_last_error());
        bad = 1;
      }
    } else {
      fprintf(stderr, "  %s: unknown op\n", ctx);
      bad = 1;
    }

    if (has_outcome) {
      if (expect_error) {
        if (strcmp(kind_name(s), expect_error->str) != 0) {
          fprintf(stderr, "  %s: expected error %s, got %s (%s)\n", ctx, expect_error->str, kind_name(s),
                  s == LEASE_OK ? "" : lease_last_error());
          bad = 1;
        }
      } else if (s != LEASE_OK) {
        fprintf(stderr, "  %s: unexpected error %s\n", ctx, lease_last_error());
        bad = 1;
      } else {
        bad |= check_decision(ctx, &d, expect);
      }
    }
    settle_all(ls, instances, ctx, &bad);
    failed += bad;
    steps_total++;
  }
  for (i = 0; i < instances; i++) lease_limiter_free(ls[i]);
  json_free(v);
  return failed;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

static int is_json(const struct dirent *e) {
  size_t n = strlen(e->d_name);
  return n > 5 && strcmp(e->d_name + n - 5, ".json") == 0;
}

int main(int argc, char **argv) {
  struct dirent **files;
  int n, i;
  if (argc < 3 || (strcmp(argv[2], "redis") == 0 && argc < 4)) {
    fprintf(stderr, "usage: %s VECTOR_DIR memory | VECTOR_DIR redis REDIS_URL\n", argv[0]);
    return 2;
  }
  backend = argv[2];
  redis_url = strcmp(backend, "redis") == 0 ? argv[3] : NULL;
  n = scandir(argv[1], &files, is_json, by_name);
  if (n < 15) {
    fprintf(stderr, "expected at least 15 vectors in %s, found %d\n", argv[1], n);
    return 2;
  }
  for (i = 0; i < n; i++) {
    char path[1024];
    int failed;
    snprintf(path, sizeof path, "%s/%s", argv[1], files[i]->d_name);
    failed = run_vector(path);
    if (failed == 0) {
      cases_passed++;
      printf("ok %s [%s]\n", files[i]->d_name, backend);
    } else {
      cases_failed++;
      printf("FAILED %s [%s] (%d steps)\n", files[i]->d_name, backend, failed);
    }
    free(files[i]);
  }
  free(files);
  printf("  %d steps checked against %s\n", steps_total, backend);
  if (steps_total <= 100) {
    printf("FAILED: only %d steps ran\n", steps_total);
    cases_failed++;
  }
  SUMMARY();
}
