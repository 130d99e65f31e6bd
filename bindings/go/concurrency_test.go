package quotalease

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// retryWithinRecheck: a permit denial's body says a retry of 1-250 ms (it
// stays local recheck_ms, 250, from when it was decided, and counts down).
func retryWithinRecheck(body string) bool {
	m := regexp.MustCompile(`"retry_after_ms":(\d+)[,}]`).FindStringSubmatch(body)
	if m == nil {
		return false
	}
	ms, err := strconv.Atoi(m[1])
	return err == nil && ms >= 1 && ms <= 250
}

// Concurrency limits (Config.Concurrency, AcquireConcurrent): at most N
// permits of a key in flight across the limiters of one authority, a
// release frees one, long requests keep theirs, and every bad input. The
// fleet cases run on memory://NAME and on a real Redis, with manual clocks
// moved in 500 ms steps, each followed by Settle (what the broker's ticker
// does on a system clock).

const concurrencyLimit = 3

// eachFleet runs test with two limiters on one authority (Concurrency 3,
// manual clocks): the same memory://NAME, then the same Redis and prefix.
func eachFleet(t *testing.T, test func(t *testing.T, l1, l2 *Limiter)) {
	c := DefaultConfig()
	c.Limit = 1000
	c.Concurrency = concurrencyLimit
	c.BackendTimeoutMs = 2000
	c.ManualClock = true
	t.Run("memory", func(t *testing.T) {
		c := c
		c.URL = "memory://" + uniq("inflight")
		test(t, mustNew(t, c), mustNew(t, c))
	})
	t.Run("redis", func(t *testing.T) {
		c := c
		c.URL = redisURL(t)
		c.KeyPrefix = uniq("inflight")
		test(t, mustNew(t, c), mustNew(t, c))
	})
}

// takeAll takes permits of key at once until the first denial, which it
// checks and closes; the admitted permits are closed when the test ends.
func takeAll(t *testing.T, l *Limiter, key string) []*Permit {
	t.Helper()
	var held []*Permit
	for {
		p, err := l.AcquireConcurrent(key)
		if err != nil {
			t.Fatalf("acquire %d: %v", len(held), err)
		}
		if p.Decision.Limit != concurrencyLimit || p.Key != key || p.Allowed != p.Decision.Allowed {
			t.Fatalf("permit %d: %+v", len(held), p)
		}
		if !p.Allowed {
			d := p.Decision
			// (a permit denial stays local recheck_ms, 250, from when it was decided)
			if d.Reason != ReasonExhausted || d.RetryAfterMs < 1 || d.RetryAfterMs > 250 || d.Remaining != 0 {
				t.Fatalf("denial: %+v", d)
			}
			p.Close()
			return held
		}
		if p.Decision.Reason != ReasonLease {
			t.Fatalf("admitted: %+v", p.Decision)
		}
		t.Cleanup(p.Close)
		held = append(held, p)
		if len(held) > 100 {
			t.Fatal("never denied")
		}
	}
}

func releaseAll(t *testing.T, ps []*Permit) {
	t.Helper()
	for _, p := range ps {
		if err := p.Release(); err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
}

// advance moves every clock ms, in steps of 500 ms, each followed by Settle.
func advance(t *testing.T, ms uint64, ls ...*Limiter) {
	t.Helper()
	for ms > 0 {
		step := uint64(500)
		if ms < step {
			step = ms
		}
		for _, l := range ls {
			if err := l.AdvanceClock(step); err != nil {
				t.Fatal(err)
			}
			if err := l.Settle(); err != nil {
				t.Fatal(err)
			}
		}
		ms -= step
	}
}

func TestConcurrencyAtMostTheLimitAndAReleaseFreesOne(t *testing.T) {
	eachFleet(t, func(t *testing.T, l, _ *Limiter) {
		var held []*Permit
		for i := 0; i < concurrencyLimit; i++ {
			p, err := l.AcquireConcurrent("k")
			if err != nil || !p.Allowed || p.Decision.Remaining != uint64(concurrencyLimit-1-i) {
				t.Fatalf("permit %d: %+v %v", i, p, err)
			}
			defer p.Close()
			held = append(held, p)
		}
		if got := takeAll(t, l, "k"); len(got) != 0 {
			t.Fatalf("%d past the limit", len(got))
		}
		if err := held[0].Release(); err != nil {
			t.Fatal(err)
		}
		// One released: exactly one more.
		if got := takeAll(t, l, "k"); len(got) != 1 {
			t.Fatalf("after one release: %d admitted, want 1", len(got))
		}
		if got := takeAll(t, l, "other"); len(got) != concurrencyLimit {
			t.Fatalf("another key: %d, want its own %d", len(got), concurrencyLimit)
		}
	})
}

func TestConcurrencyTwoLimitersShareThePermits(t *testing.T) {
	eachFleet(t, func(t *testing.T, l1, l2 *Limiter) {
		mine := takeAll(t, l1, "k")
		if len(mine) != concurrencyLimit {
			t.Fatalf("l1 took %d", len(mine))
		}
		if n := len(takeAll(t, l2, "k")); n != 0 {
			t.Fatalf("l2 took %d while l1 holds all", n)
		}
		// Released at l1, each goes back to the authority at once; l2
		// asks again once its denial's recheck (250 ms) has passed.
		releaseAll(t, mine)
		advance(t, 1000, l1, l2)
		if n := len(takeAll(t, l2, "k")); n != concurrencyLimit {
			t.Fatalf("l2 took %d after the release", n)
		}
	})
}

func TestConcurrencyALongHeldPermitIsKept(t *testing.T) {
	eachFleet(t, func(t *testing.T, l1, l2 *Limiter) {
		mine := takeAll(t, l1, "k")
		if len(mine) != concurrencyLimit {
			t.Fatalf("l1 took %d", len(mine))
		}
		// Far past a commitment's life (7 s): the holder renews it.
		advance(t, 30_000, l1, l2)
		if n := len(takeAll(t, l2, "k")); n != 0 {
			t.Fatalf("l2 took %d of permits still in flight", n)
		}
		releaseAll(t, mine)
	})
}

func TestConcurrencyCloseWithoutReleaseReleases(t *testing.T) {
	eachFleet(t, func(t *testing.T, l1, l2 *Limiter) {
		mine := takeAll(t, l1, "k")
		if len(mine) != concurrencyLimit {
			t.Fatalf("l1 took %d", len(mine))
		}
		mine[0].Close()
		mine[0].Close() // idempotent
		if err := mine[0].Release(); !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("release after Close: %v", err)
		}
		again, err := l1.AcquireConcurrent("k")
		if err != nil || !again.Allowed {
			t.Fatalf("the closed permit is free again: %+v %v", again, err)
		}
		again.Close()
		for _, p := range mine[1:] {
			p.Close()
		}
		if err := l1.Flush(); err != nil {
			t.Fatal(err)
		}
		advance(t, 1000, l1, l2)
		theirs := takeAll(t, l2, "k")
		if len(theirs) != concurrencyLimit {
			t.Fatalf("l2 took %d after the closes", len(theirs))
		}
		// A permit may outlive its limiter.
		l2.Close()
		for _, p := range theirs {
			p.Close()
		}
	})
}

func TestConcurrencyBadInput(t *testing.T) {
	for _, c := range []func(*Config){
		func(c *Config) { c.Mode = ModeExact },
		func(c *Config) { c.Mode = ModeLocal },
		func(c *Config) { c.LeaseSize = 2 },
	} {
		cfg := manual(10, 60_000)
		cfg.Concurrency = 2
		c(&cfg)
		if _, err := New(cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "needs adaptive leasing") {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
	none := mustNew(t, manual(10, 60_000))
	if _, err := none.AcquireConcurrent("k"); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "`concurrency` is 0") {
		t.Fatalf("concurrency 0: %v", err)
	}

	cfg := manual(10, 60_000)
	cfg.Concurrency = 1
	l := mustNew(t, cfg)
	for _, key := range []string{"", "a\x1fb", "a\xffb", strings.Repeat("x", 513)} {
		if _, err := l.AcquireConcurrent(key); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("key %q: %v", key, err)
		}
	}
	p, err := l.AcquireConcurrent("k")
	if err != nil || !p.Allowed {
		t.Fatalf("%+v %v", p, err)
	}
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(); !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "released already") {
		t.Fatalf("twice: %v", err)
	}
	p.Close()
	held, err := l.AcquireConcurrent("k")
	if err != nil || !held.Allowed {
		t.Fatalf("%+v %v", held, err)
	}
	defer held.Close()
	denied, err := l.AcquireConcurrent("k")
	if err != nil || denied.Allowed || denied.Decision.Allowed {
		t.Fatalf("denied: %+v %v", denied, err)
	}
	if err := denied.Release(); !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "no permit was taken") {
		t.Fatalf("a denied permit: %v", err)
	}
	denied.Close()
	var nilL *Limiter
	if _, err := nilL.AcquireConcurrent("k"); err == nil {
		t.Fatal("nil limiter")
	}
	var nilP *Permit
	if err := nilP.Release(); err == nil {
		t.Fatal("nil permit")
	}
	nilP.Close()
	open, err := l.AcquireConcurrent("o")
	if err != nil || !open.Allowed {
		t.Fatalf("%+v %v", open, err)
	}
	defer open.Close()
	l.Close()
	if _, err := l.AcquireConcurrent("k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed limiter: %v", err)
	}
	if err := open.Release(); !errors.Is(err, ErrClosed) {
		t.Fatalf("release on a closed limiter: %v", err)
	}
}

// AcquireConcurrentTier: the tier a call names sets its key's concurrency;
// "" is no tier (Config.Concurrency); an unknown tier is KindConfig and
// takes nothing.
func TestConcurrencyACallsTierSetsItsLimit(t *testing.T) {
	cfg := manual(100, 60_000)
	cfg.Concurrency = 3
	cfg.Tiers = "free=100/min, 1 concurrent; pro=100/min, 2 concurrent"
	l := mustNew(t, cfg)
	take := func(key, tier string) int {
		n := 0
		for {
			p, err := l.AcquireConcurrentTier(key, tier)
			if err != nil {
				t.Fatalf("%s in %q: %v", key, tier, err)
			}
			defer p.Close()
			if !p.Allowed {
				return n
			}
			n++
		}
	}
	for _, c := range []struct {
		key, tier string
		want      int
	}{{"a", "free", 1}, {"b", "pro", 2}, {"c", "", 3}} {
		if got := take(c.key, c.tier); got != c.want {
			t.Fatalf("%s in %q: %d permits, want %d", c.key, c.tier, got, c.want)
		}
	}
	if _, err := l.AcquireConcurrentTier("d", "gold"); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "gold") {
		t.Fatalf("unknown tier: %v", err)
	}
	if got := take("d", ""); got != 3 {
		t.Fatalf("d after the unknown tier: %d", got)
	}
}

// WithConcurrency: a permit per request, held while the handler runs and
// released when it returns (or panics); a request past the limit is a 429
// with Retry-After and the problem body. The handlers are called directly
// (httptest.NewRecorder), so a returned ServeHTTP has released its permit.
func TestMiddlewareWithConcurrency(t *testing.T) {
	cfg := manual(1000, 60_000)
	cfg.Concurrency = 2
	l := mustNew(t, cfg)
	entered := make(chan struct{})
	gate := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Panic") != "" {
			panic("handler failed")
		}
		entered <- struct{}{}
		<-gate
		io.WriteString(w, "done")
	})
	h := Middleware(l, ByHeader("X-Api-Key"), WithConcurrency())(slow)
	request := func(header ...string) *http.Request {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Api-Key", "k")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		return req
	}
	codes := make(chan int, 2)
	for i := 0; i < 2; i++ {
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, request())
			codes <- rec.Code
		}()
		<-entered
	}
	// Two in flight: the third is denied at once.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request())
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" ||
		rec.Header().Get("RateLimit") != "" || rec.Header().Get("Content-Type") != "application/problem+json" ||
		!retryWithinRecheck(rec.Body.String()) {
		t.Fatalf("third: %d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	// One returns: one more may enter, and the next is denied again.
	gate <- struct{}{}
	if code := <-codes; code != http.StatusOK {
		t.Fatalf("first: %d", code)
	}
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request())
		codes <- rec.Code
	}()
	<-entered
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, request())
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("after one returned and one entered: %d", rec.Code)
	}
	close(gate)
	for i := 0; i < 2; i++ {
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("in flight %d: %d", i, code)
		}
	}
	// A handler that panics releases its permit too.
	for i := 0; i < 3; i++ {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			h.ServeHTTP(httptest.NewRecorder(), request("X-Panic", "1"))
		}()
	}
	p1, err1 := l.AcquireConcurrent("k")
	p2, err2 := l.AcquireConcurrent("k")
	if err1 != nil || err2 != nil || !p1.Allowed || !p2.Allowed {
		t.Fatalf("every permit released: %+v %v %+v %v", p1, err1, p2, err2)
	}
	p1.Close()
	p2.Close()
	// A request without the key is not limited; a limiter without
	// Concurrency goes to the error handler.
	noKey := httptest.NewRequest(http.MethodGet, "/", nil)
	open := Middleware(l, ByHeader("X-Api-Key"), WithConcurrency())(hello)
	if rec := httptest.NewRecorder(); func() int { open.ServeHTTP(rec, noKey); return rec.Code }() != http.StatusOK {
		t.Fatal("no key: limited")
	}
	var got error
	plain := Middleware(mustNew(t, manual(10, 60_000)), ByHeader("X-Api-Key"), WithConcurrency(),
		WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
			got = err
			w.WriteHeader(http.StatusServiceUnavailable)
		}))(hello)
	rec = httptest.NewRecorder()
	plain.ServeHTTP(rec, request())
	if rec.Code != http.StatusServiceUnavailable || !errors.Is(got, ErrConfig) {
		t.Fatalf("no concurrency: %d %v", rec.Code, got)
	}
}

// WithConcurrency with WithTier: the request's tier sets its key's limit.
func TestMiddlewareWithConcurrencyAndTier(t *testing.T) {
	cfg := manual(1000, 60_000)
	cfg.Concurrency = 3
	cfg.Tiers = "free=1000/min, 1 concurrent"
	l := mustNew(t, cfg)
	entered := make(chan struct{})
	gate := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-gate
	})
	h := Middleware(l, ByHeader("X-Api-Key"), WithConcurrency(),
		WithTier(func(r *http.Request) string { return r.Header.Get("X-Tier") }))(slow)
	request := func(tier string) *http.Request {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Api-Key", "k")
		req.Header.Set("X-Tier", tier)
		return req
	}
	done := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request("free"))
		done <- rec.Code
	}()
	<-entered
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request("free"))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("free's second in flight: %d", rec.Code)
	}
	close(gate)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("first: %d", code)
	}
	var got error
	gold := Middleware(l, ByHeader("X-Api-Key"), WithConcurrency(),
		WithTier(func(r *http.Request) string { return "gold" }),
		WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
			got = err
			w.WriteHeader(http.StatusServiceUnavailable)
		}))(hello)
	rec = httptest.NewRecorder()
	gold.ServeHTTP(rec, request("gold"))
	if rec.Code != http.StatusServiceUnavailable || !errors.Is(got, ErrConfig) || !strings.Contains(got.Error(), "gold") {
		t.Fatalf("unknown tier: %d %v", rec.Code, got)
	}
}

// WithCost and WithWait do not apply to a permit: Middleware panics when
// either is given with WithConcurrency, instead of ignoring it.
func TestMiddlewareWithConcurrencyRefusesCostAndWait(t *testing.T) {
	cfg := manual(1000, 60_000)
	cfg.Concurrency = 1
	l := mustNew(t, cfg)
	for name, opt := range map[string]MiddlewareOption{
		"WithCost": WithCost(func(*http.Request) uint64 { return 2 }),
		"WithWait": WithWait(100 * time.Millisecond),
	} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, name+" cannot be combined with WithConcurrency") {
					t.Fatalf("%s: recovered %q", name, msg)
				}
			}()
			Middleware(l, ByHeader("X-Api-Key"), WithConcurrency(), opt)
		}()
	}
	Middleware(l, ByHeader("X-Api-Key"), WithConcurrency(), WithWait(0)) // no wait: nothing to refuse
}
