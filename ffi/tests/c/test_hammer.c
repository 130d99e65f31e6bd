/* Many threads on one limiter: the limit holds exactly, the counters agree
 * with what the threads saw, and each thread keeps its own last error.
 * Memory authority always; a real Redis too when QL_REDIS_URL is set. */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "check.h"

#define THREADS 8
#define PER_THREAD 20000

typedef struct {
  lease_limiter *l;
  int id;
  uint64_t admitted, denied;
  int failures;
  char first_failure[256];
} worker;

static void note(worker *w, const char *what) {
  if (w->failures++ == 0) snprintf(w->first_failure, sizeof w->first_failure, "%s: %s", what, lease_last_error());
}

static void *run(void *arg) {
  worker *w = arg;
  lease_decision d;
  struct lease_metrics m;
  char buf[4096];
  size_t needed;
  int i;
  for (i = 0; i < PER_THREAD; i++) {
    lease_status s;
    if (i % 97 == 0) {
      s = lease_try_acquire(w->l, KEY("hot"), 1, &d);
    } else {
      s = lease_acquire(w->l, KEY("hot"), 1, &d);
    }
    if (s != LEASE_OK) {
      note(w, "acquire");
      continue;
    }
    if (d.allowed) w->admitted++;
    else w->denied++;
    if (i % 500 == 0) {
      /* A bad call in the middle of the storm: this thread's own message. */
      char key[32];
      snprintf(key, sizeof key, "t%d", w->id);
      if (lease_acquire(w->l, KEY(key), 0, &d) != LEASE_ERR_INVALID_COST || !strstr(lease_last_error(), "cost 0"))
        note(w, "bad cost");
      if (lease_set_limit(w->l, KEY(key), 100 + (uint64_t)i, 1000) != LEASE_OK) note(w, "set_limit");
    }
    if (i % 1000 == 0) {
      if (lease_metrics(w->l, &m) != LEASE_OK) note(w, "metrics");
      if (lease_metrics_prometheus(w->l, buf, sizeof buf, &needed) != LEASE_OK) note(w, "prometheus");
    }
  }
  return NULL;
}

static void *churn(void *arg) {
  /* Other limiters come and go while the hammer runs. */
  int *failures = arg, i;
  for (i = 0; i < 200; i++) {
    lease_config c;
    lease_limiter *l;
    lease_decision d;
    lease_config_init(&c);
    c.url = (i % 2) ? "memory://churn" : "memory://";
    c.limit = 5;
    if (lease_limiter_new(&c, &l) != LEASE_OK || lease_acquire(l, KEY("k"), 1, &d) != LEASE_OK) (*failures)++;
    lease_limiter_free(l);
  }
  return NULL;
}

static int hammer(lease_limiter **ls, int nls, uint64_t limit, const char *label) {
  pthread_t t[THREADS], ct;
  worker w[THREADS];
  struct lease_metrics m, sum;
  uint64_t admitted = 0, denied = 0;
  int i, churn_failures = 0;
  memset(&sum, 0, sizeof sum);
  for (i = 0; i < THREADS; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].l = ls[i % nls];
    w[i].id = i;
    CHECK(pthread_create(&t[i], NULL, run, &w[i]) == 0, "pthread_create");
  }
  CHECK(pthread_create(&ct, NULL, churn, &churn_failures) == 0, "pthread_create");
  for (i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    admitted += w[i].admitted;
    denied += w[i].denied;
    CHECK(w[i].failures == 0, "%s: thread %d: %d failures, first: %s", label, i, w[i].failures, w[i].first_failure);
  }
  pthread_join(ct, NULL);
  CHECK(churn_failures == 0, "%s: %d churn failures", label, churn_failures);
  CHECK(admitted == limit, "%s: admitted %llu with a limit of %llu and a stopped clock", label,
        (unsigned long long)admitted, (unsigned long long)limit);
  CHECK(admitted + denied == (uint64_t)THREADS * PER_THREAD, "%s: %llu decisions", label,
        (unsigned long long)(admitted + denied));
  for (i = 0; i < nls; i++) {
    EXPECT(lease_metrics(ls[i], &m), LEASE_OK);
    sum.admitted += m.admitted;
    sum.denied += m.denied;
    sum.backend_errors += m.backend_errors;
  }
  CHECK(sum.admitted == admitted && sum.denied == denied, "%s: metrics %llu/%llu, threads saw %llu/%llu", label,
        (unsigned long long)sum.admitted, (unsigned long long)sum.denied, (unsigned long long)admitted,
        (unsigned long long)denied);
  CHECK(sum.backend_errors == 0, "%s: %llu backend errors", label, (unsigned long long)sum.backend_errors);
  printf("  %s: %d threads x %d calls: %llu admitted, %llu denied\n", label, THREADS, PER_THREAD,
         (unsigned long long)admitted, (unsigned long long)denied);
  return 0;
}

static lease_limiter *make(const char *url, const char *prefix, uint64_t limit) {
  lease_config c;
  lease_config_init(&c);
  c.url = url;
  c.key_prefix = prefix;
  c.limit = limit;
  c.window_ms = 60000;
  c.clock = LEASE_CLOCK_MANUAL; /* no refill during the run: the count is exact */
  c.clock_start_ms = 1000000;
  c.backend_timeout_ms = 10000;
  c.on_backend_failure = LEASE_FAILURE_DENY;
  return new_limiter_or_exit(&c);
}

static void memory_one_limiter(void) {
  lease_limiter *l = make("memory://", "ql", 5000);
  hammer(&l, 1, 5000, "memory, 1 limiter");
  EXPECT(lease_close(l), LEASE_OK);
  lease_limiter_free(l);
}

static void memory_two_limiters_one_authority(void) {
  lease_limiter *ls[2];
  ls[0] = make("memory://hammer", "ql", 3000);
  ls[1] = make("memory://hammer", "ql", 3000);
  hammer(ls, 2, 3000, "memory, 2 limiters");
  lease_limiter_free(ls[0]);
  lease_limiter_free(ls[1]);
}

static void redis_two_limiters(void) {
  const char *url = getenv("QL_REDIS_URL");
  char prefix[64];
  lease_limiter *ls[2];
  snprintf(prefix, sizeof prefix, "hammer%d", (int)getpid());
  ls[0] = make(url, prefix, 2000);
  ls[1] = make(url, prefix, 2000);
  hammer(ls, 2, 2000, "redis, 2 limiters");
  EXPECT(lease_close(ls[0]), LEASE_OK);
  EXPECT(lease_close(ls[1]), LEASE_OK);
  lease_limiter_free(ls[0]);
  lease_limiter_free(ls[1]);
}

int main(void) {
  RUN(memory_one_limiter);
  RUN(memory_two_limiters_one_authority);
  if (getenv("QL_REDIS_URL")) RUN(redis_two_limiters);
  SUMMARY();
}
