package quotalease

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// A server that refuses the password is a configuration error, not an
// outage: Acquire and Check return ErrMisconfigured (errors.Is, errors.As)
// naming the host and never the password (issue 25).
func TestAWrongPasswordIsMisconfigured(t *testing.T) {
	out, err := exec.Command(redisctl, "start").Output()
	if err != nil {
		t.Fatal(err)
	}
	port := strings.TrimSpace(string(out))
	defer exec.Command(redisctl, "stop", port).Run()
	if out, err := exec.Command("redis-cli", "-p", port, "CONFIG", "SET", "requirepass", "the-right-one").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	c := DefaultConfig()
	c.URL = fmt.Sprintf("redis://:%s@127.0.0.1:%s", secretPW, port)
	c.KeyPrefix = uniq("misconf")
	c.Limit = 100
	c.BackendTimeoutMs = 1000
	l := mustNew(t, c)
	host := "127.0.0.1:" + port
	for what, err := range map[string]error{"Check": l.Check(), "Acquire": func() error { _, err := l.Acquire("k"); return err }()} {
		if !errors.Is(err, ErrMisconfigured) {
			t.Fatalf("%s: %v, want ErrMisconfigured", what, err)
		}
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindMisconfigured || e.Kind.String() != "misconfigured" {
			t.Fatalf("%s: %#v", what, err)
		}
		msg := err.Error()
		assertClean(t, what, msg)
		if !strings.Contains(msg, host) || !strings.Contains(msg, "authentication failed") {
			t.Errorf("%s: %s", what, msg)
		}
		if strings.Contains(msg, "lease_") {
			t.Errorf("%s names a C function: %s", what, msg)
		}
	}
	// The right password passes the check and leases.
	c.URL = fmt.Sprintf("redis://:the-right-one@127.0.0.1:%s", port)
	good := mustNew(t, c)
	if err := good.Check(); err != nil {
		t.Fatalf("Check on a good URL: %v", err)
	}
	if d, err := good.Acquire("k"); err != nil || d.Reason != ReasonLease {
		t.Fatalf("%+v %v", d, err)
	}
}

// Two labelled limiters render as one exposition with each family once; a
// bad label name is a KindConfig error.
func TestPrometheusTextOfTwoLimiters(t *testing.T) {
	a, b := mustNew(t, manual(5, 60000)), mustNew(t, manual(5, 60000))
	if _, err := a.Acquire("k"); err != nil {
		t.Fatal(err)
	}
	text, err := PrometheusText(
		Labeled{Limiter: a, Labels: map[string]string{"limiter": "api"}},
		Labeled{Limiter: b, Labels: map[string]string{"limiter": "per-route"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(text, "# TYPE quotalease_admitted_total counter"); n != 1 {
		t.Errorf("family printed %d times:\n%s", n, text)
	}
	for _, want := range []string{`quotalease_admitted_total{limiter="api"} 1`, `quotalease_admitted_total{limiter="per-route"} 0`} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("no %s in:\n%s", want, text)
		}
	}
	one, err := a.MetricsPrometheusLabeled(map[string]string{"limiter": "api"})
	if err != nil || !strings.Contains(one, `quotalease_admitted_total{limiter="api"} 1`) {
		t.Fatalf("%v\n%s", err, one)
	}
	for _, labels := range []map[string]string{{"1bad": "x"}, {"__name__": "x"}, {"a-b": "x"}} {
		_, err := a.MetricsPrometheusLabeled(labels)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "labels") {
			t.Errorf("%v: %v", labels, err)
		}
	}
	_, err = PrometheusText(Labeled{Limiter: a, Labels: map[string]string{"l": "x"}}, Labeled{Limiter: b, Labels: map[string]string{"l": "x"}})
	if !errors.Is(err, ErrConfig) {
		t.Errorf("same labels: %v", err)
	}
	if err := a.Check(); err != nil {
		t.Errorf("Check on memory://: %v", err)
	}
}
