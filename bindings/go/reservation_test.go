package quotalease

import (
	"errors"
	"strings"
	"testing"
)

// drain counts the requests of cost 1 admitted at this instant until the
// first denial.
func drain(t *testing.T, l *Limiter, key string) int {
	t.Helper()
	n := 0
	for ; n <= 10_000; n++ {
		d, err := l.Acquire(key)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			return n
		}
	}
	t.Fatal("never denied")
	return n
}

// reserveOn runs the reservation checks on one authority: settled below
// the estimate the rest goes back, above it the key owes the difference.
func reserveOn(t *testing.T, c Config) {
	c.Limit, c.WindowMs = 100, 3_600_000
	l := mustNew(t, c)
	r, err := l.Reserve("k", 40, "")
	if err != nil || !r.Allowed() || r.Estimate() != 40 || r.Key() != "k" {
		t.Fatalf("reserve: %v %+v", err, r)
	}
	if err := r.Settle(10); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if n := drain(t, l, "k"); n != 90 {
		t.Fatalf("the key spent what was used (10): %d admitted after", n)
	}
	over, err := l.Reserve("o", 10, "")
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if err := over.Settle(150); err != nil {
		t.Fatal(err)
	}
	if m := l.Metrics(); m.TokensDebited != 140 || m.Map()["tokens_debited"] != 140 {
		t.Fatalf("the overage is counted: %+v", m)
	}
	if d, _ := l.Acquire("o"); d.Allowed {
		t.Fatal("the key owes 50 tokens")
	}
}

func TestReserveThenSettle(t *testing.T) {
	c := DefaultConfig()
	c.URL = "memory://" + uniq("rsv")
	reserveOn(t, c)
}

func TestReserveThenSettleOnRedis(t *testing.T) {
	c := DefaultConfig()
	c.URL = redisURL(t)
	c.KeyPrefix = uniq("rsv")
	reserveOn(t, c)
}

func TestReservationBadInput(t *testing.T) {
	l := mustNew(t, manual(10, 60_000))
	r, err := l.Reserve("k", 10, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(-1); !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "got -1") {
		t.Fatalf("negative actual: %v", err)
	}
	if err := r.Settle(10); err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(10); !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "settled already") {
		t.Fatalf("twice: %v", err)
	}
	r.Close()
	r.Close()
	if err := r.Settle(1); !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("after Close: %v", err)
	}
	denied, err := l.Reserve("k", 1, "")
	if err != nil || denied.Allowed() {
		t.Fatalf("denied: %v %+v", err, denied)
	}
	if err := denied.Settle(0); !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "denied") {
		t.Fatalf("a denied reservation: %v", err)
	}
	denied.Close()
	if _, err := l.Reserve("k", 0, ""); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("estimate 0: %v", err)
	}
	if _, err := l.Reserve("k", 1, "gold"); !errors.Is(err, ErrConfig) {
		t.Fatalf("unknown tier: %v", err)
	}
	if _, err := l.Reserve("", 1, ""); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	var nilL *Limiter
	if _, err := nilL.Reserve("k", 1, ""); err == nil {
		t.Fatal("nil limiter")
	}
	var nilR *Reservation
	if err := nilR.Settle(1); err == nil {
		t.Fatal("nil reservation")
	}
	nilR.Close()
	open, err := l.Reserve("other", 2, "")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	l.Close()
	if err := open.Settle(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed limiter: %v", err)
	}
}
