package quotalease

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Tests that need Redis share one real redis-server from
// tests/harness/redisctl (never a mock), started on first use, with this
// run's own harness state so stop-all stops only ours.
var (
	redisctl  string
	redisOnce sync.Once
	redisErr  error
	redisAddr string
)

func TestMain(m *testing.M) {
	code := func() int {
		root, err := filepath.Abs("../..")
		if err != nil {
			panic(err)
		}
		redisctl = filepath.Join(root, "tests/harness/redisctl")
		state, err := os.MkdirTemp("", "quotalease-go-harness")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(state)
		os.Setenv("QUOTALEASE_HARNESS_STATE", state)
		defer exec.Command(redisctl, "stop-all").Run()
		return m.Run()
	}()
	os.Exit(code)
}

// redisURL starts the shared server on first use and returns its URL.
func redisURL(t testing.TB) string {
	t.Helper()
	redisOnce.Do(func() {
		out, err := exec.Command(redisctl, "start").Output()
		if err != nil {
			redisErr = fmt.Errorf("cannot start redis-server with %s: %v (install it: scripts/ensure-redis.sh)", redisctl, err)
			return
		}
		redisAddr = "redis://127.0.0.1:" + strings.TrimSpace(string(out))
	})
	if redisErr != nil {
		t.Fatal(redisErr)
	}
	return redisAddr
}

var unique atomic.Int64

// uniq returns a name no other test of this process uses.
func uniq(what string) string {
	return fmt.Sprintf("go%d-%s-%d", os.Getpid(), what, unique.Add(1))
}

// manual returns a config on a private memory authority with a stopped clock.
func manual(limit, windowMs uint64) Config {
	c := DefaultConfig()
	c.URL = "memory://" + uniq("m")
	c.Limit = limit
	c.WindowMs = windowMs
	c.ManualClock = true
	c.ClockStartMs = 1_000_000
	return c
}

func mustNew(t testing.TB, c Config) *Limiter {
	t.Helper()
	l, err := New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// pollUntil calls step until cond holds, for at most d (a bounded hang guard,
// not a sleep used as synchronisation).
func pollUntil(t *testing.T, d time.Duration, step func(), cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		step()
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
