package quotalease

import (
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestDefaultConfigHasTheDocumentedDefaults(t *testing.T) {
	c := DefaultConfig()
	// Limit and WindowMs are left unset, so that Rate can be set instead.
	if c.URL != "memory://" || c.Limit != 0 || c.WindowMs != 0 || c.Rate != "" || c.LeaseSize != Auto ||
		c.RefillThreshold != Auto || c.LeaseTTLMs != 2000 || c.OnBackendFailure != PolicyStaticShare ||
		c.ExpectedReplicas != 1 || c.BackendTimeoutMs != 250 || c.KeyPrefix != "ql" || c.MaxKeys != 100000 ||
		c.Mode != ModeLease || c.ManualClock || c.ClockStartMs != 0 {
		t.Fatalf("DefaultConfig() = %+v", c)
	}
	l := mustNew(t, func() Config { c.Limit = 5; return c }())
	if d, err := l.Acquire("k"); err != nil || d.Limit != 5 || d.WindowMs != 60000 {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestZeroFieldsKeepTheEngineDefaults(t *testing.T) {
	// Only Limit set: every zero field is left to the engine.
	l := mustNew(t, Config{Limit: 100})
	d, err := l.Acquire("k")
	if err != nil || !d.Allowed || d.Reason != ReasonLease || d.WindowMs != 60000 || d.Limit != 100 {
		t.Fatalf("%+v %v", d, err)
	}
	// Adaptive leasing by default: a new key's first lease is what the
	// request needs (no demand measured yet).
	if m := l.Metrics(); m.TokensLeased != 1 {
		t.Fatalf("lease size: %+v", m)
	}
}

func TestManualClockStartsWhereTheEngineSays(t *testing.T) {
	c := DefaultConfig()
	c.Limit, c.ManualClock = 5, true // no ClockStartMs: the engine's start
	l := mustNew(t, c)
	if err := l.AdvanceClock(1); err != nil {
		t.Fatal(err)
	}
	c.ManualClock = false
	c.ClockStartMs = 5
	if _, err := New(c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "`clock_start_ms` needs `clock` = \"manual\"") {
		t.Fatalf("start without the manual clock: %v", err)
	}
}

func TestAcquireUntilExhausted(t *testing.T) {
	c := manual(10, 1000)
	c.LeaseSize = 4
	l := mustNew(t, c)
	for i := 0; i < 10; i++ {
		d, err := l.Acquire("user:1")
		if err != nil || !d.Allowed || d.Reason != ReasonLease || d.Remaining != uint64(9-i) || d.Limit != 10 {
			t.Fatalf("acquire %d: %+v %v", i, d, err)
		}
	}
	d, err := l.Acquire("user:1")
	if err != nil || d.Allowed || d.Reason != ReasonExhausted || d.RetryAfterMs == 0 || d.RetryAfter() <= 0 {
		t.Fatalf("11th: %+v %v", d, err)
	}
	d, err = l.AcquireN("user:2", 3)
	if err != nil || !d.Allowed || d.Remaining != 7 {
		t.Fatalf("other key: %+v %v", d, err)
	}
	if err := l.AdvanceClock(1000); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Acquire("user:1"); !d.Allowed {
		t.Fatalf("after a window: %+v", d)
	}
}

func TestRateSetsLimitAndWindow(t *testing.T) {
	c := manual(0, 0)
	c.Rate = "5/s"
	l := mustNew(t, c)
	d, err := l.Acquire("k")
	if err != nil || d.Limit != 5 || d.WindowMs != 1000 {
		t.Fatalf("%+v %v", d, err)
	}
	c.Rate = "5/fortnight"
	if _, err := New(c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "rate") {
		t.Fatalf("bad rate: %v", err)
	}
	// From DefaultConfig, Rate alone.
	c = DefaultConfig()
	c.Rate = "600/min"
	if d, err := mustNew(t, c).Acquire("k"); err != nil || d.Limit != 600 || d.WindowMs != 60000 {
		t.Fatalf("DefaultConfig + Rate: %+v %v", d, err)
	}
}

func TestRateWithLimitOrWindowIsAConfigError(t *testing.T) {
	// Rate used to override Limit and WindowMs silently; now it is the
	// engine's rule, as in every language.
	for name, edit := range map[string]func(*Config){
		"Limit":    func(c *Config) { c.Limit = 5 },
		"WindowMs": func(c *Config) { c.WindowMs = 1000 },
	} {
		c := DefaultConfig()
		c.Rate = "10/s"
		edit(&c)
		l, err := New(c)
		var e *Error
		if l != nil || !errors.As(err, &e) || e.Kind != KindConfig ||
			!strings.Contains(e.Message, "`rate` cannot be combined with `limit` or `window_ms`") {
			t.Errorf("Rate + %s: %v", name, err)
		}
	}
}

func TestErrorsNameNoCFunction(t *testing.T) {
	// liblease prefixes its messages with the C function's name; a Go caller
	// called New, not lease_limiter_new_from_options, and reads the engine's
	// message as every other language does.
	_, err := New(Config{Limit: 10, Rate: "10/MIN"})
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindConfig {
		t.Fatalf("got %v, want a config error", err)
	}
	if strings.Contains(e.Message, "lease_") || !strings.HasPrefix(err.Error(), "quotalease: invalid configuration: `rate`") {
		t.Errorf("the message names a C function or lost the engine's text: %q", err.Error())
	}
	l := mustNew(t, manual(10, 1000))
	if _, err := l.AcquireN("", 1); err == nil || strings.Contains(err.Error(), "lease_") ||
		!strings.HasPrefix(err.Error(), "quotalease: invalid key: ") {
		t.Errorf("empty key: %v", err)
	}
	// A message without a C function's name first is left whole.
	if got := stripCFunction("invalid configuration: `limit` must be at least 1"); got != "invalid configuration: `limit` must be at least 1" {
		t.Errorf("stripCFunction: %q", got)
	}
}

func TestUnknownOptionSuggestsTheClosestName(t *testing.T) {
	// Config's fields cannot be misspelt; the engine's suggestion still
	// reaches Go through the options-by-name path New uses.
	for name, want := range map[string]string{"lese_size": "lease_size", "leaseSise": "leaseSize"} {
		_, err := newLimiter([]option{{name: "limit", num: 5}, {name: name, num: 2}}, nil)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "unknown option `"+name+"`; did you mean `"+want+"`?") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestTryAcquireModesAndSharedMemory(t *testing.T) {
	c := manual(4, 60000)
	c.Mode = ModeExact
	l := mustNew(t, c)
	if d, err := l.TryAcquireN("k", 2); err != nil || !d.Allowed || d.Reason != ReasonExact || d.Remaining != 2 {
		t.Fatalf("exact: %+v %v", d, err)
	}
	c = manual(4, 60000)
	c.Mode = ModeLocal
	c.ExpectedReplicas = 2
	l = mustNew(t, c)
	if d, _ := l.AcquireN("k", 2); !d.Allowed || d.Reason != ReasonLocal {
		t.Fatalf("local: %+v", d)
	}
	if d, _ := l.Acquire("k"); d.Allowed {
		t.Fatalf("local share is 2: %+v", d)
	}
	// Two limiters on memory://NAME share one authority.
	c = manual(10, 60000)
	c.LeaseSize = 3
	a, b := mustNew(t, c), mustNew(t, c)
	admitted := 0
	for i := 0; i < 20; i++ {
		l := a
		if i%2 == 1 {
			l = b
		}
		if d, _ := l.Acquire("shared"); d.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d of 10", admitted)
	}
}

func TestSetLimitMetricsAndPrometheus(t *testing.T) {
	c := manual(5, 60000)
	c.LeaseSize = 5
	l := mustNew(t, c)
	if err := l.SetLimit("vip", 100, 1000); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.AcquireN("vip", 50); !d.Allowed || d.Limit != 100 {
		t.Fatalf("vip: %+v", d)
	}
	for i := 0; i < 7; i++ {
		l.Acquire("k")
	}
	m := l.Metrics()
	if m.Admitted != 6 || m.Denied != 2 || m.KeysTracked != 2 || m.BackendErrors != 0 {
		t.Fatalf("metrics %+v", m)
	}
	if got := m.Map(); len(got) != 13 || got["admitted"] != 6 || got["denied"] != 2 {
		t.Fatalf("Map() = %v", got)
	}
	text := l.MetricsPrometheus()
	if !strings.Contains(text, "\nquotalease_admitted_total 6\n") || !strings.Contains(text, "# TYPE quotalease_keys_tracked gauge") {
		t.Fatalf("prometheus:\n%s", text)
	}
}

func TestDecisionHeaders(t *testing.T) {
	d := Decision{Allowed: false, Limit: 100, Remaining: 0, RetryAfterMs: 1200, ResetAfterMs: 30500, WindowMs: 60000, Reason: ReasonExhausted}
	h := d.Headers()
	if h.Get("RateLimit-Policy") != `"default";q=100;w=60` || h.Get("RateLimit") != `"default";r=0;t=31` || h.Get("Retry-After") != "2" || len(h) != 3 {
		t.Fatalf("headers %v", h)
	}
	d.Allowed, d.RetryAfterMs = true, 0
	if h := d.Headers(); h.Get("Retry-After") != "" || len(h) != 2 {
		t.Fatalf("allowed headers %v", h)
	}
}

func TestCloseIsIdempotentAndLaterCallsFail(t *testing.T) {
	c := manual(10, 60000)
	c.LeaseSize = 4
	l := mustNew(t, c)
	l.Acquire("k")
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if m := l.Metrics(); m.TokensReturned != 3 {
		t.Fatalf("flush returned %d", m.TokensReturned)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for name, err := range map[string]error{
		"Acquire":    second(l.Acquire("k")),
		"TryAcquire": second(l.TryAcquire("k")),
		"SetLimit":   l.SetLimit("k", 5, 1000),
		"Flush":      l.Flush(),
		"Settle":     l.Settle(),
	} {
		var e *Error
		if !errors.Is(err, ErrClosed) || !errors.As(err, &e) || e.Kind != KindClosed || !strings.Contains(e.Message, "closed") {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	if m := l.Metrics(); m.Admitted != 1 {
		t.Fatalf("metrics after close: %+v", m)
	}
}

func second(_ Decision, err error) error { return err }

func TestBadInputIsATypedError(t *testing.T) {
	c := manual(10, 1000)
	c.LeaseSize = 2
	l := mustNew(t, c)
	cases := []struct {
		name string
		err  error
		want error
		text string
	}{
		{"empty key", second(l.Acquire("")), ErrInvalidKey, "empty"},
		{"long key", second(l.Acquire(strings.Repeat("x", 513))), ErrInvalidKey, "512"},
		{"non-UTF-8 key", second(l.Acquire("ab\xff")), ErrInvalidKey, "UTF-8"},
		{"cost 0", second(l.AcquireN("k", 0)), ErrInvalidCost, "cost 0"},
		{"cost above limit", second(l.AcquireN("k", 11)), ErrInvalidCost, "limit (10)"},
		{"try cost 0", second(l.TryAcquireN("k", 0)), ErrInvalidCost, "cost 0"},
		{"set_limit 0", l.SetLimit("k", 0, 1000), ErrConfig, "limit"},
		{"set_limit empty key", l.SetLimit("", 5, 1000), ErrInvalidKey, "empty"},
		{"advance system clock", mustNew(t, func() Config { c := DefaultConfig(); c.Limit = 5; return c }()).AdvanceClock(5), ErrConfig, "manual"},
	}
	for _, tc := range cases {
		if !errors.Is(tc.err, tc.want) || !strings.Contains(tc.err.Error(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, tc.err, tc.want, tc.text)
		}
	}
	if d, err := l.Acquire(strings.Repeat("x", 512)); err != nil || !d.Allowed {
		t.Errorf("512-byte key: %+v %v", d, err)
	}
	var nilLimiter *Limiter
	if _, err := nilLimiter.Acquire("k"); !errors.Is(err, ErrClosed) {
		t.Errorf("nil limiter: %v", err)
	}
}

func TestBadConfigIsATypedError(t *testing.T) {
	type edit func(*Config)
	cases := []struct {
		name  string
		edit  edit
		field string
	}{
		{"limit 0", func(c *Config) { c.Limit = 0 }, "`limit` must be at least 1"},
		{"lease > limit", func(c *Config) { c.LeaseSize = 11 }, "`lease_size`"},
		{"threshold > lease", func(c *Config) { c.LeaseSize = 4; c.RefillThreshold = 5 }, "`refill_threshold`"},
		{"timeout", func(c *Config) { c.BackendTimeoutMs = 60001 }, "`backend_timeout_ms`"},
		{"prefix", func(c *Config) { c.KeyPrefix = "a{b" }, "`key_prefix`"},
		{"http url", func(c *Config) { c.URL = "http://localhost" }, "unknown scheme"},
		{"bad port", func(c *Config) { c.URL = "redis://:99999999" }, "`url`"},
		{"non-UTF-8 url", func(c *Config) { c.URL = "redis://h\xff" }, "UTF-8"},
		{"NUL in url", func(c *Config) { c.URL = "memory://a\x00b" }, "`url` contains a NUL byte"},
		{"mode", func(c *Config) { c.Mode = "fast" }, "`mode`"},
		{"policy", func(c *Config) { c.OnBackendFailure = "panic" }, "`on_backend_failure`"},
		{"2^52", func(c *Config) { c.Limit = 1_000_000_000_000; c.WindowMs = 10_000_000 }, "2^52"},
		{"2^63", func(c *Config) { c.LeaseTTLMs = 1 << 63 }, "`lease_ttl_ms` must be at most"},
		{"rate", func(c *Config) { c.Limit = 0; c.Rate = "ten per second" }, "`rate`"},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		c.Limit = 10
		tc.edit(&c)
		l, err := New(c)
		var e *Error
		if l != nil || !errors.Is(err, ErrConfig) || !errors.As(err, &e) || e.Kind != KindConfig || !strings.Contains(e.Message, tc.field) {
			t.Errorf("%s: got %v, want a config error naming %s", tc.name, err, tc.field)
		}
	}
}

func TestManyGoroutinesHoldTheLimitExactly(t *testing.T) {
	l := mustNew(t, manual(3000, 60000))
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, denied := 0, 0
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, d := 0, 0
			for i := 0; i < 2000; i++ {
				dec, err := l.Acquire("hot")
				if err != nil {
					t.Error(err)
					return
				}
				if dec.Allowed {
					a++
				} else {
					d++
				}
				if i%400 == 0 {
					// This goroutine's error is its own, even across OS threads.
					if _, err := l.AcquireN("hot", 0); !errors.Is(err, ErrInvalidCost) || !strings.Contains(err.Error(), "cost 0") {
						t.Errorf("concurrent bad cost: %v", err)
					}
				}
			}
			mu.Lock()
			admitted += a
			denied += d
			mu.Unlock()
		}()
	}
	wg.Wait()
	m := l.Metrics()
	if admitted != 3000 || denied != 16*2000-3000 || m.Admitted != 3000 || m.Denied != uint64(denied) {
		t.Fatalf("admitted %d denied %d metrics %+v", admitted, denied, m)
	}
}

func TestFinalizerFreesAnUnclosedLimiter(t *testing.T) {
	// Limiters dropped without Close are freed by the finalizer; run it many
	// times (under the race detector and cgocheck this catches misuse).
	for i := 0; i < 200; i++ {
		c := DefaultConfig()
		c.Limit = 5
		c.OnEvent = func(Event) {}
		l, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		l.Acquire("k")
	}
	runtime.GC()
	runtime.GC()
}

func TestOvershootBudgetCapsWhatAnInstanceHolds(t *testing.T) {
	l, err := New(Config{Limit: 100, WindowMs: 1000, OvershootBudget: "5%", ManualClock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 10; i++ {
		if d, err := l.Acquire("k"); err != nil || !d.Allowed {
			t.Fatalf("acquire %d: %v %v", i, d, err)
		}
	}
	if err := l.AdvanceClock(100); err != nil {
		t.Fatal(err)
	}
	// the 3 tokens still held serve three; the fourth asks, with the demand
	// measured, for more, and the budget (5 % of 100) caps it
	for i := 0; i < 4; i++ {
		if d, err := l.Acquire("k"); err != nil || !d.Allowed {
			t.Fatalf("acquire: %v %v", d, err)
		}
	}
	if m := l.Metrics(); m.OvershootBound != 5 {
		t.Fatalf("overshoot bound %d, want 5", m.OvershootBound)
	}
	// "auto", the default, named
	auto, err := New(Config{Limit: 100, OvershootBudget: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := auto.Acquire("k"); err != nil || !d.Allowed {
		t.Fatalf("auto: %v %v", d, err)
	}
	auto.Close()
	if _, err := New(Config{Limit: 100, OvershootBudget: "automatic"}); err == nil || !strings.Contains(err.Error(), "overshoot_budget") {
		t.Fatalf("want a config error naming overshoot_budget, got %v", err)
	}
	if _, err := New(Config{Limit: 100, OvershootBudget: "150%"}); err == nil || !strings.Contains(err.Error(), "overshoot_budget") {
		t.Fatalf("want a config error naming overshoot_budget, got %v", err)
	}
}

// A server that accepts connections and never answers (a listener nobody
// reads): a cold Acquire waits one BackendTimeoutMs in all, connect
// included (it once waited two), and a first silence is denied as pending:
// the failure policy decides once the silence lasts a timeout more.
func TestABlackHoleCostsOneTimeout(t *testing.T) {
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	l := mustNew(t, Config{URL: "redis://" + hole.Addr().String(), Rate: "600/min", BackendTimeoutMs: 1000})
	start := time.Now()
	d, err := l.Acquire("k")
	waited := time.Since(start)
	if err != nil || d.Allowed || d.Reason != ReasonPending {
		t.Fatalf("%+v %v", d, err)
	}
	if waited >= 2*time.Second {
		t.Fatalf("waited %v: more than one BackendTimeoutMs (1 s)", waited)
	}
}

// AcquireWait admits once the refill covers the request, denies at once
// (with the hint) when it cannot come in time, counts each request once,
// and serves a key's waiters in arrival order.
func TestAcquireWait(t *testing.T) {
	c := DefaultConfig()
	c.URL = "memory://" + uniq("wait")
	c.Limit, c.WindowMs, c.LeaseSize = 2, 1000, 1
	l := mustNew(t, c)
	if d, _ := l.AcquireN("k", 2); !d.Allowed {
		t.Fatal("the first two")
	}
	if d, err := l.AcquireWait("k", 2, "", 10*time.Millisecond); err != nil || d.Allowed || d.RetryAfterMs <= 10 {
		t.Fatalf("two tokens take a second: %+v %v", d, err)
	}
	order := make(chan string, 2)
	go func() {
		d, err := l.AcquireWait("k", 2, "", 30*time.Second)
		if err != nil || !d.Allowed {
			t.Errorf("first: %+v %v", d, err)
		}
		order <- "two tokens, first"
	}()
	if !pollUntil(t, 30*time.Second, func() {}, func() bool { return l.Waiters("k") == 1 }) {
		t.Fatal("the first waiter never queued")
	}
	go func() {
		d, err := l.AcquireWait("k", 1, "", 30*time.Second)
		if err != nil || !d.Allowed {
			t.Errorf("second: %+v %v", d, err)
		}
		order <- "one token, second"
	}()
	if a, b := <-order, <-order; a != "two tokens, first" || b != "one token, second" {
		t.Fatalf("served %q then %q", a, b)
	}
	if m := l.Metrics(); m.Admitted != 3 || m.Denied != 1 {
		t.Fatalf("one count per request: %+v", m)
	}
	if _, err := l.AcquireWait("k", 0, "", time.Second); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("cost 0: %v", err)
	}
	if _, err := l.AcquireWait("k", 1, "", -time.Second); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative wait: %v", err)
	}
}
