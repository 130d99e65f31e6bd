package quotalease

import "testing"

// A warm key: the limiter holds local tokens for it and never runs dry (the
// limit is far above b.N, leases are large), so this measures the admit path
// plus one cgo call. Compare with the Rust and C figures (scripts/bench-c-go.sh).
func warmLimiter(b *testing.B) *Limiter {
	c := DefaultConfig()
	c.Limit = 1 << 40
	c.WindowMs = 1000
	c.LeaseSize = 1 << 30
	l, err := New(c)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	if d, err := l.Acquire("bench:warm"); err != nil || !d.Allowed {
		b.Fatalf("%+v %v", d, err)
	}
	return l
}

func BenchmarkAcquire(b *testing.B) {
	l := warmLimiter(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.Acquire("bench:warm"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireParallel(b *testing.B) {
	l := warmLimiter(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Acquire("bench:warm"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkHeaders(b *testing.B) {
	d := Decision{Allowed: true, Limit: 100, Remaining: 42, ResetAfterMs: 1234, WindowMs: 60000, Reason: ReasonLease}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = d.Headers()
	}
}

// The cost of an empty cgo call, for reading BenchmarkAcquire.
func BenchmarkCgoNoop(b *testing.B) {
	for i := 0; i < b.N; i++ {
		cgoNoop()
	}
}

// The warm admit path naming a tier of one rule and of two rules, beside
// BenchmarkAcquire (the same limits, so only the tier lookup and the second
// rule differ). Run them in one go test -bench invocation to compare.
func benchTier(b *testing.B, tiers, tier string) {
	c := DefaultConfig()
	c.Limit = 1 << 40
	c.WindowMs = 1000
	c.LeaseSize = 1 << 30
	c.Tiers = tiers
	l, err := New(c)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	if d, err := l.AcquireTier("bench:warm", tier); err != nil || !d.Allowed {
		b.Fatalf("%+v %v", d, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.AcquireTier("bench:warm", tier); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireTierOneRule(b *testing.B) {
	benchTier(b, "one=1099511627776/s", "one")
}

func BenchmarkAcquireTierTwoRules(b *testing.B) {
	benchTier(b, "two=1099511627776/s, 450000000000/10s", "two")
}
