package quotalease

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Calendar quotas ("50/day@Europe/Berlin"): at most N in each calendar
// period of a time zone, the whole quota back at the period's start. A
// manual clock's readings are Unix ms, so ClockStartMs sets the date.

// unixMs is the Unix ms of an RFC 3339 instant.
func unixMs(t *testing.T, text string) uint64 {
	t.Helper()
	at, err := time.Parse(time.RFC3339, text)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(at.UnixMilli())
}

// calendarConfig is a config with a manual clock set to start, on a
// private memory authority.
func calendarConfig(t *testing.T, start string) Config {
	c := DefaultConfig()
	c.URL = "memory://" + uniq("cal")
	c.ManualClock = true
	c.ClockStartMs = unixMs(t, start)
	return c
}

// eachAuthority runs test on the memory authority and on a real Redis.
func eachAuthority(t *testing.T, c Config, test func(t *testing.T, l *Limiter)) {
	t.Run("memory", func(t *testing.T) { test(t, mustNew(t, c)) })
	t.Run("redis", func(t *testing.T) {
		c := c
		c.URL = redisURL(t)
		c.KeyPrefix = uniq("cal")
		test(t, mustNew(t, c))
	})
}

// drainUntilDenied acquires cost 1 on key until the first denial and returns how
// many were admitted and the denial.
func drainUntilDenied(t *testing.T, l *Limiter, key string) (int, Decision) {
	t.Helper()
	for n := 0; ; n++ {
		d, err := l.Acquire(key)
		if err != nil {
			t.Fatalf("acquire %d: %v", n, err)
		}
		if !d.Allowed {
			return n, d
		}
		if n >= 1000 {
			t.Fatalf("never denied: %+v", d)
		}
	}
}

// At 22:00 UTC on 2026-12-04 it is 23:00 in Berlin: the day's 50 are
// admitted, then denied until Berlin's midnight an hour away (nothing
// refills within the day), and the whole quota is back at that instant.
func TestCalendarDayInBerlinAcrossMidnight(t *testing.T) {
	c := calendarConfig(t, "2026-12-04T22:00:00Z")
	c.Rate = "50/day@Europe/Berlin"
	eachAuthority(t, c, func(t *testing.T, l *Limiter) {
		n, d := drainUntilDenied(t, l, "k")
		if n != 50 {
			t.Fatalf("admitted %d, want the day's 50", n)
		}
		if d.Reason != ReasonExhausted || d.RetryAfterMs != 3_600_000 || d.ResetAfterMs != 3_600_000 ||
			d.RetryAfter() != time.Hour || d.ResetAfter() != time.Hour {
			t.Fatalf("denial: %+v, want retry and reset at Berlin's midnight, an hour away", d)
		}
		if d.Limit != 50 || d.WindowMs != 86_400_000 || d.Remaining != 0 || d.Rule != 0 ||
			!reflect.DeepEqual(d.Rules, []Rule{{50, 86_400_000}}) {
			t.Fatalf("denial's rule: %+v", d)
		}
		h := d.Headers()
		if h.Get("RateLimit-Policy") != `"default";q=50;w=86400` || h.Get("RateLimit") != `"default";r=0;t=3600` ||
			h.Get("Retry-After") != "3600" || len(h) != 3 {
			t.Fatalf("headers %v", h)
		}
		if p, err := l.Policy("k", ""); err != nil || p.Rules != "50/day@Europe/Berlin" {
			t.Fatalf("Policy: %+v %v", p, err)
		}
		// One ms before midnight: still the same day.
		if err := l.AdvanceClock(3_600_000 - 1); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Acquire("k"); err != nil || d.Allowed || d.RetryAfterMs != 1 || d.ResetAfterMs != 1 {
			t.Fatalf("a token bucket would have refilled: %+v %v", d, err)
		}
		if err := l.AdvanceClock(1); err != nil {
			t.Fatal(err)
		}
		n, d = drainUntilDenied(t, l, "k")
		if n != 50 || d.RetryAfterMs != 86_400_000 || d.ResetAfterMs != 86_400_000 {
			t.Fatalf("the next day: %d admitted, then %+v", n, d)
		}
	})
}

// A calendar quota as one rule of a tier: ten seconds of 10/s are held to
// 25 for the day, the daily rule binds the denial until UTC midnight, and
// the headers name it "1day".
func TestCalendarRuleInATier(t *testing.T) {
	c := calendarConfig(t, "2026-12-04T12:00:00Z")
	c.Tiers = "pro=10/s, 25/day@UTC"
	c.DefaultTier = "pro"
	eachAuthority(t, c, func(t *testing.T, l *Limiter) {
		total := 0
		for i, want := range []int{10, 10, 5, 0, 0, 0, 0, 0, 0, 0} {
			n, d := drainUntilDenied(t, l, "k")
			wantRule := 1
			if i < 2 {
				wantRule = 0 // the 1 s rule denies while the day has tokens
			}
			if n != want || d.Rule != wantRule {
				t.Fatalf("second %d: %d admitted, rule %d binds; want %d, rule %d", i, n, d.Rule, want, wantRule)
			}
			total += n
			if err := l.AdvanceClock(1000); err != nil {
				t.Fatal(err)
			}
		}
		if total != 25 {
			t.Fatalf("admitted %d in ten seconds, want the day's 25", total)
		}
		d, err := l.AcquireTier("k", "pro")
		if err != nil || d.Allowed || d.Reason != ReasonExhausted || d.Rule != 1 {
			t.Fatalf("the daily rule denies: %+v %v", d, err)
		}
		if !reflect.DeepEqual(d.Rules, []Rule{{10, 1000}, {25, 86_400_000}}) || d.Limit != 25 ||
			d.WindowMs != 86_400_000 || d.Remaining != 0 {
			t.Fatalf("rules: %+v", d)
		}
		// 12:00:10 UTC: midnight is 12 h - 10 s away.
		if d.RetryAfterMs != 43_190_000 || d.ResetAfterMs != 43_190_000 {
			t.Fatalf("retry %d reset %d, want 43190000 (UTC midnight)", d.RetryAfterMs, d.ResetAfterMs)
		}
		h := d.Headers()
		if h.Get("RateLimit-Policy") != `"1s";q=10;w=1, "1day";q=25;w=86400` ||
			h.Get("RateLimit") != `"1day";r=0;t=43190` || h.Get("Retry-After") != "43190" {
			t.Fatalf("headers %v", h)
		}
		p, err := l.Policy("k", "")
		if err != nil || p != (Policy{Rules: "10/s, 25/day@UTC", Tier: "pro",
			Source: "tier pro (assigned by default_tier, defined in config)"}) {
			t.Fatalf("Policy: %+v %v", p, err)
		}
		// UTC midnight: the day's quota is back; the 1 s rule binds again.
		if err := l.AdvanceClock(d.RetryAfterMs); err != nil {
			t.Fatal(err)
		}
		if n, d := drainUntilDenied(t, l, "k"); n != 10 || d.Rule != 0 {
			t.Fatalf("the next day: %d admitted, then %+v", n, d)
		}
	})
}

// The net/http middleware sends the daily rule's headers on its 429.
func TestCalendarMiddlewareHeaders(t *testing.T) {
	c := calendarConfig(t, "2026-12-04T12:00:00Z")
	c.Limit = 100
	c.Tiers = "pro=10/s, 25/day@UTC"
	l := mustNew(t, c)
	plan := WithTier(func(r *http.Request) string { return r.Header.Get("X-Plan") })
	srv := serve(t, Middleware(l, ByHeader("X-Api-Key"), plan)(hello))
	pro := map[string]string{"X-Api-Key": "a", "X-Plan": "pro"}
	for i := 0; i < 25; i++ {
		if i > 0 && i%10 == 0 {
			if err := l.AdvanceClock(1000); err != nil {
				t.Fatal(err)
			}
		}
		resp, _ := get(t, srv.URL, pro)
		if resp.StatusCode != http.StatusOK ||
			resp.Header.Get("RateLimit-Policy") != `"1s";q=10;w=1, "1day";q=25;w=86400` {
			t.Fatalf("request %d: %d %v", i, resp.StatusCode, resp.Header)
		}
	}
	if err := l.AdvanceClock(1000); err != nil { // the 1 s rule has tokens again
		t.Fatal(err)
	}
	// 12:00:03 UTC: midnight is 12 h - 3 s away.
	resp, body := get(t, srv.URL, pro)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, `"retry_after_ms":43197000`) ||
		resp.Header.Get("RateLimit-Policy") != `"1s";q=10;w=1, "1day";q=25;w=86400` ||
		resp.Header.Get("RateLimit") != `"1day";r=0;t=43197` || resp.Header.Get("Retry-After") != "43197" {
		t.Fatalf("429: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// A calendar tier written to the shared policy store applies as one from
// the options does; a bad one is refused.
func TestCalendarTierInThePolicyStore(t *testing.T) {
	c := calendarConfig(t, "2026-12-04T12:00:00Z")
	c.Limit = 100
	c.PolicyRefreshMs = 1000
	a, b := mustNew(t, c), mustNew(t, c) // one memory:// store
	if _, err := a.PolicySetTier("gold", "5/week@Europe/Berlin"); err != nil {
		t.Fatal(err)
	}
	if err := b.RefreshPolicies(); err != nil {
		t.Fatal(err)
	}
	// Friday 13:00 in Berlin; its week ends at Monday's midnight, 23:00 UTC on Sunday.
	const untilMonday = (2*24 + 11) * 3_600_000
	for i := 0; i < 5; i++ {
		if d, err := b.AcquireTier("g", "gold"); err != nil || !d.Allowed {
			t.Fatalf("gold %d: %+v %v", i, d, err)
		}
	}
	d, err := b.AcquireTier("g", "gold")
	if err != nil || d.Allowed || d.Limit != 5 || d.WindowMs != 604_800_000 || d.RetryAfterMs != untilMonday {
		t.Fatalf("gold, the week's 6th: %+v %v (want retry %d)", d, err, uint64(untilMonday))
	}
	if _, err := a.PolicySetTier("bad", "5/week@Mars/Olympus"); !errors.Is(err, ErrConfig) ||
		!strings.Contains(err.Error(), "does not know") {
		t.Fatalf("unknown zone in the store: %v", err)
	}
}

// With no "@", a day is a window of 24 hours: a token bucket that refills
// continuously, not at midnight.
func TestADayWithNoZoneIsATokenBucket(t *testing.T) {
	c := calendarConfig(t, "2026-12-04T22:00:00Z")
	c.Rate = "24/day"
	l := mustNew(t, c)
	if n, d := drainUntilDenied(t, l, "k"); n != 24 || d.RetryAfterMs != 3_600_000 || d.ResetAfterMs != 86_400_000 {
		t.Fatalf("%d admitted, then %+v", n, d)
	}
	if err := l.AdvanceClock(3_600_000); err != nil { // an hour: one token, and not midnight in UTC
		t.Fatal(err)
	}
	if n, _ := drainUntilDenied(t, l, "k"); n != 1 {
		t.Fatalf("refilled %d in an hour, want 1", n)
	}
}

// Bad calendar rules are KindConfig errors with the engine's message, and
// calendar quotas need adaptive leasing.
func TestCalendarBadConfigIsATypedError(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"unknown zone", func(c *Config) { c.Rate = "10/month@Mars/Olympus" }, "does not know"},
		{"no zone", func(c *Config) { c.Rate = "10/month" }, "needs a time zone"},
		{"billing day on a day", func(c *Config) { c.Rate = "10/day@billing-day-3" }, "only months have one"},
		{"billing day 40", func(c *Config) { c.Rate = "10/month@billing-day-40" }, "1 to 31"},
		{"too many per month", func(c *Config) { c.Rate = "9999999/month@UTC" }, "at most 1737499 per month"},
		{"unknown zone in a tier", func(c *Config) { c.Limit = 5; c.Tiers = "pro=10/s, 25/day@Mars/Olympus" }, "does not know"},
		{"exact", func(c *Config) { c.Rate = "10/day@UTC"; c.Mode = ModeExact }, "needs adaptive leasing"},
		{"local", func(c *Config) { c.Rate = "10/day@UTC"; c.Mode = ModeLocal }, "needs adaptive leasing"},
		{"lease size", func(c *Config) { c.Rate = "10/day@UTC"; c.LeaseSize = 2 }, "needs adaptive leasing"},
		{"local, a tier", func(c *Config) { c.Limit = 5; c.Tiers = "t=10/day@UTC"; c.Mode = ModeLocal }, "needs adaptive leasing"},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.edit(&c)
		l, err := New(c)
		var e *Error
		if l != nil || !errors.Is(err, ErrConfig) || !errors.As(err, &e) || e.Kind != KindConfig ||
			!strings.Contains(e.Message, tc.want) {
			t.Errorf("%s: got %v, want a config error containing %q", tc.name, err, tc.want)
		}
	}
	// The good forms build.
	for _, rate := range []string{"1737499/month@UTC", "30/month@billing-day-31 America/New_York", "1000/year@Asia/Tokyo"} {
		c := DefaultConfig()
		c.Rate = rate
		if d, err := mustNew(t, c).Acquire("k"); err != nil || !d.Allowed {
			t.Errorf("%s: %+v %v", rate, d, err)
		}
	}
}
