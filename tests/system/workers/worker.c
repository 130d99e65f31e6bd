/* C worker of the cross-language system test (see ../README.md).
 * Built by scripts/build-system-workers.sh against include/lease.h and liblease. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "lease.h"

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static int n_degraded, n_recovered;

static void on_event(void *user, enum lease_event_kind kind, const char *message) {
  (void)user;
  (void)message;
  pthread_mutex_lock(&ev_lock);
  if (kind == LEASE_EVENT_DEGRADED) n_degraded++;
  else n_recovered++;
  pthread_mutex_unlock(&ev_lock);
}

/* Reason codes counted (lease_reason_name names 0..8 today; room for more). */
#define N_REASONS 16

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t num(const jval *job, const char *k) {
  const jval *v = json_get(job, k);
  if (!v || v->type != J_NUM || !v->is_uint) {
    fprintf(stderr, "worker_c: job field %s missing\n", k);
    exit(2);
  }
  return v->uint;
}

static const char *str(const jval *job, const char *k) {
  const jval *v = json_get(job, k);
  if (!v || v->type != J_STR) {
    fprintf(stderr, "worker_c: job field %s missing\n", k);
    exit(2);
  }
  return v->str;
}

static void die_status(const char *what, enum lease_status st) {
  fprintf(stderr, "worker_c: %s failed (%d): %s\n", what, (int)st, lease_last_error());
  exit(1);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: worker_c JOB_JSON\n");
    return 2;
  }
  char err[256];
  jval *job = json_parse(argv[1], err, sizeof err);
  if (!job) {
    fprintf(stderr, "worker_c: bad job: %s\n", err);
    return 2;
  }
  struct lease_config cfg;
  lease_config_init(&cfg);
  cfg.url = str(job, "url");
  cfg.key_prefix = str(job, "key_prefix");
  cfg.limit = num(job, "limit");
  cfg.window_ms = num(job, "window_ms");
  /* absent: adaptive leasing (the default) */
  cfg.lease_size = json_get(job, "lease_size") ? num(job, "lease_size") : LEASE_AUTO;
  cfg.expected_replicas = num(job, "expected_replicas");
  cfg.backend_timeout_ms = num(job, "backend_timeout_ms");
  enum lease_status st = lease_failure_policy_parse(str(job, "on_backend_failure"), &cfg.on_backend_failure);
  if (st != LEASE_OK) die_status("policy", st);
  struct lease_limiter *lim = NULL;
  if ((st = lease_limiter_new(&cfg, &lim)) != LEASE_OK) die_status("lease_limiter_new", st);
  if ((st = lease_set_event_callback(lim, on_event, NULL)) != LEASE_OK) die_status("callback", st);

  const jval *keys = json_get(job, "keys"), *weights = json_get(job, "weights");
  const char *schedule[256];
  size_t n = 0;
  for (size_t k = 0; k < keys->count; k++)
    for (uint64_t w = 0; w < weights->items[k].uint && n < 256; w++) schedule[n++] = keys->items[k].str;
  uint64_t admitted[16] = {0};
  uint64_t reasons[N_REASONS] = {0};
  uint64_t pause_us = num(job, "pause_us"), start = num(job, "start_at_ms"), end = start + num(job, "duration_ms");
  uint64_t slot_ms = num(job, "slot_ms"), settle_end = end + num(job, "settle_ms");
  /* Optional: a progress line every progress_ms (for the soak's driver). */
  const jval *pj = json_get(job, "progress_ms");
  uint64_t progress_ms = pj ? num(job, "progress_ms") : 0, next_progress = start;
  size_t n_keys = keys->count < 16 ? keys->count : 16;
  size_t n_slots = (size_t)((settle_end - start) / slot_ms + 1);
  /* timeline[((slot * n_keys + key) * N_REASONS + reason) * 2 + denied] */
  uint64_t *timeline = calloc(n_slots * n_keys * N_REASONS * 2, sizeof *timeline);
  if (!timeline) {
    fprintf(stderr, "worker_c: out of memory\n");
    return 1;
  }
  while (now_ms() < start) usleep(1000);
  uint64_t max_ms = 0;
  struct lease_metrics m;
  for (size_t i = 0;; i++) {
    uint64_t t = now_ms();
    /* Past the deadline, go on while degraded: recovery is awaited, not timed. */
    if (t >= settle_end) break;
    if (t >= end) {
      if ((st = lease_metrics(lim, &m)) != LEASE_OK) die_status("lease_metrics", st);
      if (!m.fallback_active) break;
    }
    if (progress_ms && t >= next_progress) {
      if ((st = lease_metrics(lim, &m)) != LEASE_OK) die_status("lease_metrics", st);
      printf("{\"progress_at_ms\": %llu, \"fallback_active\": %llu, \"fallback_transitions\": %llu, \"reasons\": {",
             (unsigned long long)t, (unsigned long long)m.fallback_active, (unsigned long long)m.fallback_transitions);
      for (uint32_t r = 0, first_r = 1; r < N_REASONS; r++)
        if (reasons[r]) {
          printf("%s\"%s\": %llu", first_r ? "" : ", ", lease_reason_name(r), (unsigned long long)reasons[r]);
          first_r = 0;
        }
      printf("}}\n");
      fflush(stdout);
      next_progress = t + progress_ms;
    }
    const char *key = schedule[i % n];
    struct lease_decision d;
    if ((st = lease_acquire(lim, (const uint8_t *)key, strlen(key), 1, &d)) != LEASE_OK) die_status("lease_acquire", st);
    if (now_ms() - t > max_ms) max_ms = now_ms() - t;
    if (d.reason < N_REASONS) reasons[d.reason]++;
    for (size_t k = 0; k < n_keys; k++)
      if (strcmp(keys->items[k].str, key) == 0) {
        if (d.allowed) admitted[k]++;
        if (d.reason < N_REASONS) timeline[((((t - start) / slot_ms) * n_keys + k) * N_REASONS + d.reason) * 2 + !d.allowed]++;
      }
    if (pause_us) usleep((useconds_t)pause_us);
  }
  uint64_t ended_at_ms = now_ms();
  int closed = lease_close(lim) == LEASE_OK;
  if ((st = lease_metrics(lim, &m)) != LEASE_OK) die_status("lease_metrics", st);

  printf("{\"lang\": \"c\", \"admitted\": {");
  for (size_t k = 0; k < keys->count; k++) printf("%s\"%s\": %llu", k ? ", " : "", keys->items[k].str, (unsigned long long)admitted[k]);
  printf("}, \"reasons\": {");
  int first = 1;
  for (uint32_t r = 0; r < N_REASONS; r++)
    if (reasons[r]) {
      printf("%s\"%s\": %llu", first ? "" : ", ", lease_reason_name(r), (unsigned long long)reasons[r]);
      first = 0;
    }
  printf("}, \"metrics\": {\"admitted\": %llu, \"denied\": %llu, \"backend_calls\": %llu, \"backend_errors\": %llu, "
         "\"tokens_leased\": %llu, \"tokens_returned\": %llu, \"tokens_expired\": %llu, \"fallback_active\": %llu, "
         "\"fallback_transitions\": %llu, \"keys_tracked\": %llu, \"overshoot_bound\": %llu}",
         (unsigned long long)m.admitted, (unsigned long long)m.denied, (unsigned long long)m.backend_calls,
         (unsigned long long)m.backend_errors, (unsigned long long)m.tokens_leased,
         (unsigned long long)m.tokens_returned, (unsigned long long)m.tokens_expired,
         (unsigned long long)m.fallback_active, (unsigned long long)m.fallback_transitions,
         (unsigned long long)m.keys_tracked, (unsigned long long)m.overshoot_bound);
  pthread_mutex_lock(&ev_lock);
  printf(", \"events\": [");
  first = 1;
  for (int i = 0; i < n_degraded; i++) printf("%s\"degraded\"", first ? "" : ", "), first = 0;
  for (int i = 0; i < n_recovered; i++) printf("%s\"recovered\"", first ? "" : ", "), first = 0;
  pthread_mutex_unlock(&ev_lock);
  printf("], \"closed\": %s, \"max_acquire_ms\": %llu, \"ended_at_ms\": %llu, \"timeline\": [", closed ? "true" : "false",
         (unsigned long long)max_ms, (unsigned long long)ended_at_ms);
  first = 1;
  for (size_t slot = 0; slot < n_slots; slot++)
    for (size_t k = 0; k < n_keys; k++)
      for (uint32_t r = 0; r < N_REASONS; r++) {
        const uint64_t *c = &timeline[((slot * n_keys + k) * N_REASONS + r) * 2];
        if (!c[0] && !c[1]) continue;
        printf("%s[%zu, \"%s\", \"%s\", %llu, %llu]", first ? "" : ", ", slot, keys->items[k].str, lease_reason_name(r),
               (unsigned long long)c[0], (unsigned long long)c[1]);
        first = 0;
      }
  printf("]}\n");
  free(timeline);
  lease_limiter_free(lim);
  json_free(job);
  return 0;
}
