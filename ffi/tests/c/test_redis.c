/* liblease against a real redis-server started by tests/harness/redisctl:
 * sharing across limiters, try_acquire's pending, flush/close giving tokens
 * back, a URL's credentials kept out of the degraded message (closed port,
 * wrong password), a wrong password as LEASE_ERR_MISCONFIGURED with its
 * stderr line, and the degraded / recovered event callback when Redis is
 * killed and restarted. Needs QL_REDIS_PORT and QL_REDISCTL. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static char url[128];
static const char *redisctl;
static const char *port;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static lease_limiter *make(const char *prefix, uint64_t limit, uint64_t lease_size, int manual) {
  lease_config c;
  lease_config_init(&c);
  c.url = url;
  c.key_prefix = prefix;
  c.limit = limit;
  c.window_ms = 60000;
  c.lease_size = lease_size;
  c.backend_timeout_ms = 2000;
  if (manual) {
    c.clock = LEASE_CLOCK_MANUAL;
    c.clock_start_ms = 1000000;
  }
  return new_limiter_or_exit(&c);
}

static void unique_prefix(char *buf, size_t cap, const char *what) {
  static int n;
  snprintf(buf, cap, "c%d-%s-%d", (int)getpid(), what, n++);
}

static void limiters_share_one_bucket(void) {
  char prefix[64];
  lease_limiter *a, *b;
  lease_decision d;
  struct lease_metrics ma, mb;
  int i, admitted = 0;
  unique_prefix(prefix, sizeof prefix, "share");
  a = make(prefix, 30, 4, 1);
  b = make(prefix, 30, 4, 1);
  for (i = 0; i < 60; i++) {
    EXPECT(lease_acquire((i % 3) ? a : b, KEY("tenant"), 1, &d), LEASE_OK);
    admitted += d.allowed;
    lease_settle(a);
    lease_settle(b);
  }
  CHECK(admitted == 30, "admitted %d of 30 across two limiters", admitted);
  EXPECT(lease_metrics(a, &ma), LEASE_OK);
  EXPECT(lease_metrics(b, &mb), LEASE_OK);
  CHECK(ma.backend_calls > 0 && mb.backend_calls > 0, "both leased from Redis");
  CHECK(ma.backend_errors == 0 && mb.backend_errors == 0, "backend errors");
  lease_limiter_free(a);
  lease_limiter_free(b);
}

static void try_acquire_is_pending_on_a_cold_key(void) {
  char prefix[64];
  lease_limiter *l;
  lease_decision d;
  double deadline;
  unique_prefix(prefix, sizeof prefix, "try");
  l = make(prefix, 100, 10, 0);
  EXPECT(lease_try_acquire(l, KEY("cold"), 1, &d), LEASE_OK);
  CHECK(!d.allowed && d.reason == LEASE_REASON_PENDING, "first try_acquire: %s", lease_reason_name(d.reason));
  /* The lease request it started lands without anyone waiting for it. */
  deadline = now_s() + 10;
  do {
    EXPECT(lease_try_acquire(l, KEY("cold"), 1, &d), LEASE_OK);
    if (d.allowed) break;
    pause_ms(5);
  } while (now_s() < deadline);
  CHECK(d.allowed && d.reason == LEASE_REASON_LEASE, "never admitted: %s", lease_reason_name(d.reason));
  lease_limiter_free(l);
}

static void flush_and_close_give_tokens_back(void) {
  char prefix[64];
  lease_limiter *a, *b;
  lease_decision d;
  struct lease_metrics m;
  int i, admitted = 0;
  unique_prefix(prefix, sizeof prefix, "flush");
  a = make(prefix, 10, 5, 1);
  b = make(prefix, 10, 5, 1);
  EXPECT(lease_acquire(a, KEY("k"), 1, &d), LEASE_OK); /* a holds 4 */
  EXPECT(lease_flush(a), LEASE_OK);
  EXPECT(lease_metrics(a, &m), LEASE_OK);
  CHECK(m.tokens_returned == 4, "flush returned %llu", (unsigned long long)m.tokens_returned);
  EXPECT(lease_acquire(a, KEY("k"), 1, &d), LEASE_OK); /* a holds 4 again */
  EXPECT(lease_close(a), LEASE_OK);
  for (i = 0; i < 10; i++) {
    EXPECT(lease_acquire(b, KEY("k"), 1, &d), LEASE_OK);
    admitted += d.allowed;
    lease_settle(b);
  }
  CHECK(admitted == 8, "b admitted %d: all but a's 2 spent tokens", admitted);
  EXPECT_ERR(lease_acquire(a, KEY("k"), 1, &d), LEASE_ERR_CLOSED, "closed");
  lease_limiter_free(a);
  lease_limiter_free(b);
}

/* ---- events ---- */

typedef struct {
  pthread_mutex_t mu;
  int degraded, recovered;
  char last_message[512];
} recorder;

static void on_event(void *user, lease_event_kind kind, const char *message) {
  recorder *r = user;
  pthread_mutex_lock(&r->mu);
  if (kind == LEASE_EVENT_DEGRADED) r->degraded++;
  if (kind == LEASE_EVENT_RECOVERED) r->recovered++;
  snprintf(r->last_message, sizeof r->last_message, "%s", message ? message : "(null)");
  pthread_mutex_unlock(&r->mu);
}

static int count(recorder *r, int recovered) {
  int n;
  pthread_mutex_lock(&r->mu);
  n = recovered ? r->recovered : r->degraded;
  pthread_mutex_unlock(&r->mu);
  return n;
}

static int harness(const char *cmd) {
  char line[512];
  snprintf(line, sizeof line, "%s %s %s >/dev/null", redisctl, cmd, port);
  return system(line);
}

/* Keep calling acquire (which drives leasing and probing) until `cond`
 * holds, for at most `seconds`. */
#define POLL_UNTIL(cond, seconds, key)                       \
  do {                                                       \
    double deadline_ = now_s() + (seconds);                  \
    lease_decision pd_;                                      \
    while (!(cond) && now_s() < deadline_) {                 \
      lease_acquire(l, KEY(key), 1, &pd_);                   \
      pause_ms(10);                                          \
    }                                                        \
  } while (0)

/* ---- credentials never reach an event or the last error ---- */

#define SECRET_USER "alice-user-QRS"
#define SECRET_PW "s3cret-pw-XYZ"

static int has_secret(const char *text) {
  return strstr(text, SECRET_PW) != NULL || strstr(text, SECRET_USER) != NULL;
}

/* A loopback port nothing listens on (bound, then released). */
static int closed_port(void) {
  struct sockaddr_in a;
  socklen_t n = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), p;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &n) != 0) {
    fprintf(stderr, "cannot find a closed port\n");
    exit(2);
  }
  p = ntohs(a.sin_port);
  close(fd);
  return p;
}

/* A limiter on `secret_url` degrades (the server refuses or is absent):
 * its degraded message, and lease_last_error after a failing config, show
 * neither the user nor the password. `reason` is a piece of the message. */
static void degrade_without_secrets(const char *secret_url, const char *reason) {
  char prefix[64];
  lease_config c;
  lease_limiter *l = NULL;
  recorder r = {PTHREAD_MUTEX_INITIALIZER, 0, 0, ""};
  unique_prefix(prefix, sizeof prefix, "secret");
  lease_config_init(&c);
  c.url = secret_url;
  c.key_prefix = prefix;
  c.limit = 1000;
  c.backend_timeout_ms = 300;
  EXPECT(lease_limiter_new(&c, &l), LEASE_OK);
  if (!l) return;
  EXPECT(lease_set_event_callback(l, on_event, &r), LEASE_OK);
  POLL_UNTIL(count(&r, 0) > 0, 15, "k");
  pthread_mutex_lock(&r.mu);
  CHECK(r.degraded > 0, "no degraded event for %s", reason);
  CHECK(strstr(r.last_message, reason) != NULL, "message: %s", r.last_message);
  CHECK(!has_secret(r.last_message), "the degraded message shows a credential: %s", r.last_message);
  pthread_mutex_unlock(&r.mu);
  EXPECT(lease_set_event_callback(l, NULL, NULL), LEASE_OK);
  lease_limiter_free(l);
}

static void secrets_stay_out_of_events(void) {
  char secret_url[256], line[512];
  snprintf(secret_url, sizeof secret_url, "redis://" SECRET_USER ":" SECRET_PW "@127.0.0.1:%d/0", closed_port());
  degrade_without_secrets(secret_url, "Connection refused");
  /* A real server that refuses the password. */
  snprintf(line, sizeof line, "redis-cli -p %s ACL SETUSER " SECRET_USER " on '>another-password' '~*' '+@all' >/dev/null",
           port);
  CHECK(system(line) == 0, "%s", line);
  snprintf(secret_url, sizeof secret_url, "redis://" SECRET_USER ":" SECRET_PW "@127.0.0.1:%s", port);
  degrade_without_secrets(secret_url, "AuthenticationFailed");
}

/* Whether the file behind `fd` contains `needle`. */
static int file_has(int fd, const char *needle) {
  char buf[8192];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  return strstr(buf, needle) != NULL;
}

/* A server that refuses the password is a configuration error, not an
 * outage: lease_limiter_check and lease_acquire return
 * LEASE_ERR_MISCONFIGURED naming the host, never the password, and one
 * line goes to stderr by default (run after secrets_stay_out_of_events,
 * which creates the user). */
static void a_wrong_password_is_misconfigured(void) {
  char secret_url[256], prefix[64], host[64], path[] = "/tmp/ql-stderr-XXXXXX";
  lease_config c;
  lease_limiter *l = NULL;
  lease_decision d;
  int saved, fd;
  double deadline;
  snprintf(secret_url, sizeof secret_url, "redis://" SECRET_USER ":" SECRET_PW "@127.0.0.1:%s", port);
  snprintf(host, sizeof host, "127.0.0.1:%s", port);
  unique_prefix(prefix, sizeof prefix, "misconf");
  lease_config_init(&c);
  c.url = secret_url;
  c.key_prefix = prefix;
  c.limit = 1000;
  c.backend_timeout_ms = 1000;
  /* stderr into a file while the limiter runs */
  fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  if (fd < 0) return;
  unlink(path);
  fflush(stderr);
  saved = dup(2);
  dup2(fd, 2);
  EXPECT(lease_limiter_new(&c, &l), LEASE_OK);
  if (l) {
    EXPECT_ERR(lease_limiter_check(l), LEASE_ERR_MISCONFIGURED, "authentication failed");
    CHECK(strstr(lease_last_error(), host) != NULL, "no host in: %s", lease_last_error());
    CHECK(!has_secret(lease_last_error()), "a credential shows: %s", lease_last_error());
    EXPECT_ERR(lease_acquire(l, KEY("k"), 1, &d), LEASE_ERR_MISCONFIGURED, "authentication failed");
    CHECK(!has_secret(lease_last_error()), "a credential shows: %s", lease_last_error());
    EXPECT_ERR(lease_try_acquire(l, KEY("k"), 1, &d), LEASE_ERR_MISCONFIGURED, host);
    CHECK(strcmp(lease_error_kind_name(LEASE_ERR_MISCONFIGURED), "misconfigured") == 0, "kind name %s",
          lease_error_kind_name(LEASE_ERR_MISCONFIGURED));
    deadline = now_s() + 15;
    while (!file_has(fd, "quotalease: degraded") && now_s() < deadline) pause_ms(10);
  }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  CHECK(file_has(fd, "quotalease: degraded") && file_has(fd, "misconfigured"), "no degraded line on stderr");
  CHECK(!file_has(fd, SECRET_PW) && !file_has(fd, SECRET_USER), "stderr shows a credential");
  close(fd);
  lease_limiter_free(l);
  /* The right URL passes the check. */
  l = make(prefix, 10, 1, 0);
  EXPECT(lease_limiter_check(l), LEASE_OK);
  lease_limiter_free(l);
}

/* A server that accepts connections and never answers (a listening socket
 * nobody reads): a cold acquire waits one backend_timeout_ms in all, connect
 * included (issue 25: it waited two), and a first silence is denied as
 * pending: the failure policy decides once the silence lasts a timeout more. */
static void a_black_hole_costs_one_timeout(void) {
  struct sockaddr_in a;
  socklen_t n = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  char hole[128];
  lease_config c;
  lease_limiter *l;
  lease_decision d;
  double t, waited;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 16) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &n) == 0,
        "a listening socket");
  snprintf(hole, sizeof hole, "redis://127.0.0.1:%d", ntohs(a.sin_port));
  lease_config_init(&c);
  c.url = hole;
  c.limit = 600;
  c.window_ms = 60000;
  c.backend_timeout_ms = 1000;
  EXPECT(lease_limiter_new(&c, &l), LEASE_OK);
  t = now_s();
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  waited = now_s() - t;
  CHECK(!d.allowed && d.reason == LEASE_REASON_PENDING, "reason %s", lease_reason_name(d.reason));
  CHECK(waited < 2.0, "waited %.2f s: more than one backend_timeout_ms (1 s)", waited);
  lease_limiter_free(l);
  close(fd);
}

static void events_reach_the_callback(void) {
  char prefix[64];
  lease_config c;
  lease_limiter *l;
  lease_decision d;
  struct lease_metrics m;
  recorder first = {PTHREAD_MUTEX_INITIALIZER, 0, 0, ""};
  recorder second = {PTHREAD_MUTEX_INITIALIZER, 0, 0, ""};
  unique_prefix(prefix, sizeof prefix, "events");
  lease_config_init(&c);
  c.url = url;
  c.key_prefix = prefix;
  c.limit = 1000000;
  c.lease_size = 2;
  c.backend_timeout_ms = 200;
  c.on_backend_failure = LEASE_FAILURE_ALLOW;
  EXPECT(lease_limiter_new(&c, &l), LEASE_OK);
  EXPECT(lease_set_event_callback(l, on_event, &first), LEASE_OK);
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(d.allowed && d.reason == LEASE_REASON_LEASE, "warm-up: %s", lease_reason_name(d.reason));

  CHECK(harness("kill") == 0, "redisctl kill");
  POLL_UNTIL(count(&first, 0) > 0, 15, "k");
  CHECK(count(&first, 0) == 1, "degraded events: %d", count(&first, 0));
  pthread_mutex_lock(&first.mu);
  CHECK(strstr(first.last_message, "backend unreachable") != NULL, "message: %s", first.last_message);
  pthread_mutex_unlock(&first.mu);
  EXPECT(lease_acquire(l, KEY("k"), 1, &d), LEASE_OK);
  CHECK(d.allowed && d.reason == LEASE_REASON_FALLBACK, "while down: allowed %d reason %s", d.allowed,
        lease_reason_name(d.reason));
  EXPECT(lease_metrics(l, &m), LEASE_OK);
  CHECK(m.fallback_active == 1, "fallback_active %llu", (unsigned long long)m.fallback_active);

  /* Replace the callback: from now on only `second` hears. */
  EXPECT(lease_set_event_callback(l, on_event, &second), LEASE_OK);
  CHECK(harness("restart") == 0, "redisctl restart");
  POLL_UNTIL(count(&second, 1) > 0, 30, "k");
  CHECK(count(&second, 1) == 1, "recovered events: %d", count(&second, 1));
  CHECK(count(&first, 1) == 0, "the replaced callback was called");
  EXPECT(lease_metrics(l, &m), LEASE_OK);
  CHECK(m.fallback_active == 0 && m.fallback_transitions == 2, "fallback_active %llu transitions %llu",
        (unsigned long long)m.fallback_active, (unsigned long long)m.fallback_transitions);
  /* Unregister, then free: nothing is called after free returns. */
  EXPECT(lease_set_event_callback(l, NULL, NULL), LEASE_OK);
  EXPECT(lease_close(l), LEASE_OK);
  lease_limiter_free(l);
}

int main(void) {
  const char *p = getenv("QL_REDIS_PORT");
  redisctl = getenv("QL_REDISCTL");
  if (!p || !redisctl) {
    fprintf(stderr, "set QL_REDIS_PORT and QL_REDISCTL (scripts/test-c.sh does)\n");
    return 2;
  }
  port = p;
  snprintf(url, sizeof url, "redis://127.0.0.1:%s", p);
  RUN(limiters_share_one_bucket);
  RUN(try_acquire_is_pending_on_a_cold_key);
  RUN(flush_and_close_give_tokens_back);
  RUN(secrets_stay_out_of_events);
  RUN(a_wrong_password_is_misconfigured);
  RUN(a_black_hole_costs_one_timeout);
  RUN(events_reach_the_callback); /* last: it kills and restarts the server */
  SUMMARY();
}
