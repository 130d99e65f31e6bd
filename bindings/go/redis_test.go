package quotalease

import (
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

func redisConfig(t testing.TB, prefix string, limit, lease uint64) Config {
	c := DefaultConfig()
	c.URL = redisURL(t)
	c.KeyPrefix = prefix
	c.Limit = limit
	c.LeaseSize = lease
	c.BackendTimeoutMs = 2000
	return c
}

func TestRedisLimitersShareOneBucket(t *testing.T) {
	c := redisConfig(t, uniq("share"), 40, 4)
	c.ManualClock, c.ClockStartMs = true, 1_000_000
	a, b := mustNew(t, c), mustNew(t, c)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := 0; g < 8; g++ {
		l := a
		if g%2 == 1 {
			l = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				d, err := l.Acquire("tenant")
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	ma, mb := a.Metrics(), b.Metrics()
	if admitted != 40 || ma.Admitted+mb.Admitted != 40 || ma.BackendErrors+mb.BackendErrors != 0 {
		t.Fatalf("admitted %d; metrics %+v %+v", admitted, ma, mb)
	}
	if ma.BackendCalls == 0 || mb.BackendCalls == 0 {
		t.Fatalf("both must lease from Redis: %+v %+v", ma, mb)
	}
}

func TestRedisTryAcquireIsPendingOnAColdKey(t *testing.T) {
	l := mustNew(t, redisConfig(t, uniq("try"), 100, 10))
	d, err := l.TryAcquire("cold")
	if err != nil || d.Allowed || d.Reason != ReasonPending {
		t.Fatalf("first TryAcquire: %+v %v", d, err)
	}
	if !pollUntil(t, 10*time.Second, func() { d, _ = l.TryAcquire("cold") }, func() bool { return d.Allowed }) {
		t.Fatalf("the lease never landed: %+v", d)
	}
	if d.Reason != ReasonLease {
		t.Fatalf("reason %s", d.Reason)
	}
}

func TestRedisCloseGivesTokensBack(t *testing.T) {
	c := redisConfig(t, uniq("close"), 10, 5)
	c.ManualClock, c.ClockStartMs = true, 1_000_000
	a, b := mustNew(t, c), mustNew(t, c)
	a.Acquire("k") // a holds 4
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for i := 0; i < 10; i++ {
		if d, _ := b.Acquire("k"); d.Allowed {
			admitted++
		}
		b.Settle()
	}
	if admitted != 9 {
		t.Fatalf("b admitted %d, want 9 (a spent 1 and gave 4 back)", admitted)
	}
}

// Kills and restarts the shared server, so it checks its own server.
func TestRedisEventsReachOnEvent(t *testing.T) {
	out, err := exec.Command(redisctl, "start").Output()
	if err != nil {
		t.Fatal(err)
	}
	port := strings.TrimSpace(string(out))
	defer exec.Command(redisctl, "stop", port).Run()

	var mu sync.Mutex
	var events []Event
	count := func(k EventKind) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, e := range events {
			if e.Kind == k {
				n++
			}
		}
		return n
	}
	c := DefaultConfig()
	c.URL = "redis://127.0.0.1:" + port
	c.KeyPrefix = uniq("events")
	c.Limit = 1_000_000
	c.LeaseSize = 2
	c.BackendTimeoutMs = 200
	c.OnBackendFailure = PolicyAllow
	c.OnEvent = func(e Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	l := mustNew(t, c)
	if d, err := l.Acquire("k"); err != nil || d.Reason != ReasonLease {
		t.Fatalf("warm-up: %+v %v", d, err)
	}
	if err := exec.Command(redisctl, "kill", port).Run(); err != nil {
		t.Fatal(err)
	}
	step := func() { l.Acquire("k") }
	if !pollUntil(t, 15*time.Second, step, func() bool { return count(EventDegraded) > 0 }) {
		t.Fatal("no degraded event")
	}
	mu.Lock()
	msg := events[0].Message
	mu.Unlock()
	if !strings.Contains(msg, "backend unreachable") {
		t.Fatalf("message %q", msg)
	}
	if d, _ := l.Acquire("k"); !d.Allowed || d.Reason != ReasonFallback {
		t.Fatalf("while down: %+v", d)
	}
	if m := l.Metrics(); m.FallbackActive != 1 {
		t.Fatalf("metrics %+v", m)
	}
	if err := exec.Command(redisctl, "restart", port).Run(); err != nil {
		t.Fatal(err)
	}
	if !pollUntil(t, 30*time.Second, step, func() bool { return count(EventRecovered) > 0 }) {
		t.Fatal("no recovered event")
	}
	if m := l.Metrics(); m.FallbackActive != 0 || m.FallbackTransitions != 2 || count(EventDegraded) != 1 {
		t.Fatalf("metrics %+v, events %v", m, events)
	}
	if err := l.Close(); err != nil && !errors.Is(err, ErrBackend) {
		t.Fatal(err)
	}
}
