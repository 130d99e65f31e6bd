/* A tiny test framework for the C tests: CHECK records a failure and goes
 * on; RUN runs one test case; each program ends with "N passed, N failed". */
#ifndef QL_CHECK_H
#define QL_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"

static int case_failures __attribute__((unused));
static int cases_passed, cases_failed;

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      case_failures++;                                                            \
      fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                               \
      fprintf(stderr, "\n    last error: %s\n", lease_last_error());             \
    }                                                                             \
  } while (0)

/* A call must return the expected status. */
#define EXPECT(call, status) \
  do { \
    lease_status s_ = (call); \
    CHECK(s_ == (status), "%s returned %d, expected %d", #call, (int)s_, (int)(status)); \
  } while (0)

/* A call must fail with `status` and a last-error message containing `needle`. */
#define EXPECT_ERR(call, status, needle) \
  do { \
    lease_status s_ = (call); \
    CHECK(s_ == (status), "%s returned %d, expected %d", #call, (int)s_, (int)(status)); \
    CHECK(strstr(lease_last_error(), (needle)) != NULL, "message of %s lacks \"%s\"", #call, (needle)); \
  } while (0)

/* A limiter a test needs before it can check anything: exit(2) if it cannot be made. */
static lease_limiter *new_limiter_or_exit(const lease_config *c) __attribute__((unused));
static lease_limiter *new_limiter_or_exit(const lease_config *c) {
  lease_limiter *l = NULL;
  if (lease_limiter_new(c, &l) != LEASE_OK) {
    fprintf(stderr, "lease_limiter_new(%s): %s\n", c->url ? c->url : "memory://", lease_last_error());
    exit(2);
  }
  return l;
}

#define RUN(fn)                                                   \
  do {                                                            \
    case_failures = 0;                                            \
    fn();                                                         \
    if (case_failures == 0) {                                     \
      cases_passed++;                                             \
      printf("ok %s\n", #fn);                                     \
    } else {                                                      \
      cases_failed++;                                             \
      printf("FAILED %s (%d checks)\n", #fn, case_failures);      \
    }                                                             \
    fflush(stdout);                                               \
  } while (0)

#define SUMMARY()                                               \
  do {                                                          \
    printf("%d passed, %d failed\n", cases_passed, cases_failed); \
    return cases_failed ? 1 : 0;                                \
  } while (0)

#define KEY(s) (const uint8_t *)(s), strlen(s)

#endif
