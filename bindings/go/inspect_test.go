package quotalease

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// take acquires one token for key and waits for any lease request it started.
func take(t *testing.T, l *Limiter, key string) Decision {
	t.Helper()
	d, err := l.Acquire(key)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	if err := l.Settle(); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	return d
}

func mustInspect(t *testing.T, l *Limiter, key string) Inspection {
	t.Helper()
	i, err := l.Inspect(key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return i
}

// opt formats an optional figure for failure messages.
func opt(p *uint64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatUint(*p, 10)
}

func is(p *uint64, want uint64) bool { return p != nil && *p == want }

func TestInspectAKeyNeverSeen(t *testing.T) {
	l := mustNew(t, manual(100, 1000))
	i := mustInspect(t, l, "never-seen")
	if i.Limit != 100 || i.WindowMs != 1000 {
		t.Fatalf("policy %d/%d", i.Limit, i.WindowMs)
	}
	if i.AuthorityTokens != nil || i.AuthorityRefilledAtMs != nil || i.AuthorityTTLMs != nil {
		t.Fatalf("no bucket is stored: tokens %s refilled %s ttl %s",
			opt(i.AuthorityTokens), opt(i.AuthorityRefilledAtMs), opt(i.AuthorityTTLMs))
	}
	if i.LocalTokens != 0 || i.Admitted != 0 || i.Holders != 0 || i.FallbackPerWindow != 0 || i.DemandPerS != 0 || i.RateMode() {
		t.Fatalf("a key never seen: %+v", i)
	}
}

// A lone holder on memory:// with a manual clock: chunks sized by its demand
// within the budget, then, once the bucket is dry, exactly its refill. Every
// figure is exact.
func TestInspectAdaptiveFiguresOnMemory(t *testing.T) {
	// LeaseSize Auto: adaptive leasing; the figures are those of a 2 %
	// budget ("auto", the default, lets a lone holder lease further ahead)
	c := manual(100, 1000)
	c.OvershootBudget = "2%"
	l := mustNew(t, c)
	// Five requests at t0: demand is not measured yet (the first estimate
	// waits for 100 ms of traffic), so each lease is the request plus as
	// many as the key has seen here: 1, 2, then 3 tokens; one is held.
	for n := 0; n < 5; n++ {
		if !take(t, l, "k").Allowed {
			t.Fatalf("request %d denied", n)
		}
	}
	i := mustInspect(t, l, "k")
	if i.Admitted != 5 || i.Denied != 0 || i.Holders != 1 || i.DemandPerS != 0 || i.LocalTokens != 1 {
		t.Fatalf("after 5 at t0: %+v", i)
	}
	if i.FallbackPerWindow != 100 {
		t.Fatalf("a lone holder's fallback is the key's whole rate: %d", i.FallbackPerWindow)
	}
	if !is(i.AuthorityTokens, 94) || !is(i.AuthorityRefilledAtMs, 1_000_000) || i.AuthorityTTLMs != nil {
		t.Fatalf("authority tokens %s refilled %s ttl %s (memory:// stores no TTL)",
			opt(i.AuthorityTokens), opt(i.AuthorityRefilledAtMs), opt(i.AuthorityTTLMs))
	}
	if i.RateMode() || i.RatePerWindow != 0 {
		t.Fatalf("chunk mode: rate %d", i.RatePerWindow)
	}

	// 100 ms later, two more: the first spends the held token; the second
	// asks, and 6 requests in 100 ms is 60 per second: the lease is the
	// request plus the budget (2 % of 100 = 2 tokens held).
	if err := l.AdvanceClock(100); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 2; n++ {
		if !take(t, l, "k").Allowed {
			t.Fatalf("request %d at +100 ms denied", n)
		}
	}
	i = mustInspect(t, l, "k")
	if i.DemandPerS != 60 || i.LocalTokens != 2 {
		t.Fatalf("demand %d (want 60) local %d (want 2)", i.DemandPerS, i.LocalTokens)
	}
	// 94 refilled by 10, capped at the capacity less the 2 tokens still
	// committed to this holder (98), less the lease of 3
	if !is(i.AuthorityTokens, 95) || !is(i.AuthorityRefilledAtMs, 1_000_100) {
		t.Fatalf("authority %s at %s", opt(i.AuthorityTokens), opt(i.AuthorityRefilledAtMs))
	}

	// Spend the bucket: the first denial finds it dry (a lone holder at 60
	// per second is not saturated: no rate).
	n, d := 0, Decision{}
	for ; n < 200; n++ {
		if d = take(t, l, "k"); !d.Allowed {
			break
		}
	}
	if d.Allowed || d.Reason != ReasonExhausted || n != 97 || d.Remaining != 0 {
		t.Fatalf("admitted %d more (want the 95 in the bucket and the 2 held), then %+v", n, d)
	}
	i = mustInspect(t, l, "k")
	if !is(i.AuthorityTokens, 0) || i.LocalTokens != 0 || i.Holders != 1 || i.FallbackPerWindow != 100 {
		t.Fatalf("dry: %+v, authority %s", i, opt(i.AuthorityTokens))
	}
	if i.Admitted != 104 || i.Denied != 1 {
		t.Fatalf("admitted %d denied %d", i.Admitted, i.Denied)
	}

	// 100 ms later the instance admits exactly the refill: one bucket's worth.
	before := i.Admitted
	if err := l.AdvanceClock(100); err != nil {
		t.Fatal(err)
	}
	for n = 0; n < 200; n++ {
		if !take(t, l, "k").Allowed {
			break
		}
	}
	i = mustInspect(t, l, "k")
	if got := i.Admitted - before; got != 10 {
		t.Fatalf("admitted %d in 100 ms, want the refill of 10", got)
	}
}

// Two limiters on one authority: each answer counts the live holders, and
// their valid fallback shares never sum above the key's rate: a joiner gets
// what the others' shares leave until they call again.
func inspectTwoHolders(t *testing.T, c Config) {
	a, b := mustNew(t, c), mustNew(t, c)
	take(t, a, "k")
	if i := mustInspect(t, a, "k"); i.Holders != 1 || i.FallbackPerWindow != 100 {
		t.Fatalf("a alone: holders %d fallback %d", i.Holders, i.FallbackPerWindow)
	}
	take(t, b, "k")
	if ib := mustInspect(t, b, "k"); ib.Holders != 2 || ib.FallbackPerWindow != 0 {
		t.Fatalf("b: holders %d fallback %d (a holds the whole rate)", ib.Holders, ib.FallbackPerWindow)
	}
	// a's next lease request (after giving back what it holds) takes its
	// half, then b's takes the other.
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	take(t, a, "k")
	ia := mustInspect(t, a, "k")
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	take(t, b, "k")
	ib := mustInspect(t, b, "k")
	if ia.Holders != 2 || ia.FallbackPerWindow != 50 || ia.FallbackPerWindow+ib.FallbackPerWindow != 100 {
		t.Fatalf("a: holders %d fallback %d (+ b's %d)", ia.Holders, ia.FallbackPerWindow, ib.FallbackPerWindow)
	}
}

func TestInspectTwoHoldersOnMemory(t *testing.T) {
	inspectTwoHolders(t, manual(100, 1000)) // one memory://NAME for both
}

func TestRedisInspectTwoHolders(t *testing.T) {
	c := redisConfig(t, uniq("inspect2"), 100, 0) // lease 0: adaptive
	c.WindowMs, c.ManualClock = 1000, true
	inspectTwoHolders(t, c)
}

// On Redis: the stored bucket with its TTL, a measured demand, and a rate
// once the bucket is dry (Redis prefetches, so the chunks differ from
// memory's; the adaptive figures mean the same).
func TestRedisInspectAdaptiveFigures(t *testing.T) {
	c := redisConfig(t, uniq("inspect"), 100, 0)
	c.WindowMs, c.ManualClock = 1000, true
	l := mustNew(t, c)
	if i := mustInspect(t, l, "k"); i.AuthorityTokens != nil || i.AuthorityTTLMs != nil || i.Holders != 0 {
		t.Fatalf("a fresh key: %+v", i)
	}
	for n := 0; n < 5; n++ {
		if !take(t, l, "k").Allowed {
			t.Fatalf("request %d denied", n)
		}
	}
	i := mustInspect(t, l, "k")
	if i.Admitted != 5 || i.Holders != 1 || i.FallbackPerWindow != 100 || i.RateMode() || i.DemandPerS != 0 {
		t.Fatalf("after 5 at t0: %+v", i)
	}
	if i.AuthorityTokens == nil || *i.AuthorityTokens+i.LocalTokens+5 != 100 {
		t.Fatalf("authority %s + local %d + 5 spent != 100", opt(i.AuthorityTokens), i.LocalTokens)
	}
	if !is(i.AuthorityRefilledAtMs, 1_000_000) || i.AuthorityTTLMs == nil || *i.AuthorityTTLMs == 0 {
		t.Fatalf("refilled %s ttl %s (Redis reports the bucket's TTL)", opt(i.AuthorityRefilledAtMs), opt(i.AuthorityTTLMs))
	}
	if err := l.AdvanceClock(100); err != nil {
		t.Fatal(err)
	}
	// Requests the held tokens serve make no call; the first that asks
	// measures the demand.
	for n := 0; n < 10; n++ {
		take(t, l, "k")
		if i = mustInspect(t, l, "k"); i.DemandPerS > 0 {
			break
		}
	}
	offered := i.Admitted + i.Denied
	// at most everything offered, over the 100 ms measured
	if i.DemandPerS == 0 || i.DemandPerS > offered*10 {
		t.Fatalf("demand %d per s with %d offered", i.DemandPerS, offered)
	}
	n, d := 0, Decision{}
	for ; n < 200; n++ {
		if d = take(t, l, "k"); !d.Allowed {
			break
		}
	}
	if d.Allowed || d.Reason != ReasonExhausted {
		t.Fatalf("after %d: %+v", n, d)
	}
	i = mustInspect(t, l, "k")
	if !is(i.AuthorityTokens, 0) || i.Holders != 1 {
		t.Fatalf("dry: authority %s holders %d", opt(i.AuthorityTokens), i.Holders)
	}
	before := i.Admitted
	if err := l.AdvanceClock(100); err != nil {
		t.Fatal(err)
	}
	for n = 0; n < 200; n++ {
		if !take(t, l, "k").Allowed {
			break
		}
	}
	// the refill (10), with what a prefetch holds (the budget, 2) at most
	if got := mustInspect(t, l, "k").Admitted - before; got > 12 {
		t.Fatalf("admitted %d in 100 ms: the refill is 10", got)
	}
}

func TestInspectShowsSetLimitAndFixedLeases(t *testing.T) {
	c := manual(10, 1000)
	c.LeaseSize = 5
	l := mustNew(t, c)
	if err := l.SetLimit("vip", 100, 2000); err != nil {
		t.Fatal(err)
	}
	take(t, l, "vip")
	i := mustInspect(t, l, "vip")
	if i.Limit != 100 || i.WindowMs != 2000 || i.LocalTokens != 4 || !is(i.AuthorityTokens, 95) || i.Admitted != 1 {
		t.Fatalf("a lease of 5, one spent: %+v, authority %s", i, opt(i.AuthorityTokens))
	}
	if i.Holders != 0 || i.FallbackPerWindow != 0 || i.RateMode() {
		t.Fatalf("fixed leases carry no adaptive answer: %+v", i)
	}
}

func TestInspectBadInputIsATypedError(t *testing.T) {
	l := mustNew(t, manual(100, 1000))
	for _, tc := range []struct {
		name, key string
		text      string
	}{
		{"empty key", "", "empty"},
		{"long key", strings.Repeat("x", 513), "512"},
		{"non-UTF-8 key", "ab\xff", "UTF-8"},
	} {
		i, err := l.Inspect(tc.key)
		var e *Error
		if !errors.Is(err, ErrInvalidKey) || !errors.As(err, &e) || e.Kind != KindInvalidKey ||
			!strings.Contains(e.Message, tc.text) || strings.Contains(e.Message, "lease_") {
			t.Errorf("%s: got %v, want an invalid key error containing %q", tc.name, err, tc.text)
		}
		if i != (Inspection{}) {
			t.Errorf("%s: a zero Inspection with the error, got %+v", tc.name, i)
		}
	}
	if _, err := l.Inspect(strings.Repeat("x", 512)); err != nil {
		t.Errorf("512-byte key: %v", err)
	}
	take(t, l, "k")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Inspect("k"); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "closed") {
		t.Errorf("after Close: %v", err)
	}
	var nilLimiter *Limiter
	if _, err := nilLimiter.Inspect("k"); !errors.Is(err, ErrClosed) {
		t.Errorf("nil limiter: %v", err)
	}
}
