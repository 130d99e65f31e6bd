/* lease_acquire on a warm key from a real C program (linked against the
 * installed liblease.so): min ns per call over interleaved rounds.
 * Usage: bench_acquire [N] [ROUNDS]; N alone with ROUNDS=0 runs one loop of N
 * calls and prints nothing (for callgrind instruction counts). */
#define _POSIX_C_SOURCE 199309L
#include <lease.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 2000000;
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  const char *key = "user:42";
  size_t len = strlen(key);
  lease_config c;
  lease_limiter *l;
  lease_decision d;
  double best = 1e18;
  long i, allowed = 0;
  int r;
  lease_config_init(&c);
  c.limit = 1ULL << 40;
  c.window_ms = 1000;
  c.lease_size = 1ULL << 30;
  c.clock = LEASE_CLOCK_MANUAL;
  if (lease_limiter_new(&c, &l) != LEASE_OK) {
    fprintf(stderr, "%s\n", lease_last_error());
    return 1;
  }
  for (i = 0; i < 1000; i++) lease_acquire(l, (const uint8_t *)key, len, 1, &d);
  if (rounds == 0) {
    for (i = 0; i < n; i++) {
      if (lease_acquire(l, (const uint8_t *)key, len, 1, &d) != LEASE_OK) return 1;
      allowed += d.allowed;
    }
  } else {
    for (r = 0; r < rounds; r++) {
      double t = now_ns(), ns;
      for (i = 0; i < n; i++) {
        if (lease_acquire(l, (const uint8_t *)key, len, 1, &d) != LEASE_OK) return 1;
        allowed += d.allowed;
      }
      ns = (now_ns() - t) / (double)n;
      if (ns < best) best = ns;
    }
    printf("c_acquire_ns=%.2f\n", best);
  }
  lease_limiter_free(l);
  return allowed > 0 ? 0 : 1;
}
