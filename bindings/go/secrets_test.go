package quotalease

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// A Redis URL's user name and password are never printed: fmt of a Config
// (every verb), error messages and the degraded event's message show the
// URL as the engine's rule gives it (redis://***@host:port). Each test also
// checks that the host is still shown, so an empty string cannot pass.

const (
	secretUser = "alice-user-QRS"
	secretPW   = "s3cret-pw-XYZ"
)

func assertClean(t *testing.T, what, text string) {
	t.Helper()
	if strings.Contains(text, secretPW) || strings.Contains(text, secretUser) {
		t.Errorf("%s shows a credential: %s", what, text)
	}
}

// closedPort is a loopback port nothing listens on (bound, then released).
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestRedactURLIsTheEnginesRule(t *testing.T) {
	for url, want := range map[string]string{
		"redis://" + secretUser + ":" + secretPW + "@h:6379/0":          "redis://***@h:6379/0",
		"redis+cluster://:" + secretPW + "@a:1,b:2":                     "redis+cluster://***@a:1,b:2",
		"unix:///run/redis.sock?pass=" + secretPW:                       "unix:///run/redis.sock?pass=***",
		"redis://" + secretUser + ":" + secretPW:                        "redis://***",
		"redis://127.0.0.1:6379":                                        "redis://127.0.0.1:6379",
		"redis://h:1/?x=a@" + secretPW:                                  "redis://***",
		"redis://" + secretUser + ":" + secretPW + "@h\x00:1":           "redis://***@h",
		"redis://" + secretUser + ":" + secretPW + "\xff@h:1":           "***",
		"rediss://" + secretUser + ":" + secretPW + "@h:6380/#insecure": "rediss://***@h:6380/#insecure",
	} {
		if got := RedactURL(url); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", url, got, want)
		}
	}
}

func TestFmtOfAConfigNeverShowsThePassword(t *testing.T) {
	c := DefaultConfig()
	c.URL = "redis://" + secretUser + ":" + secretPW + "@127.0.0.1:6379/0"
	c.Limit = 5
	c.OnEvent = func(Event) {}
	shown := "redis://***@127.0.0.1:6379/0"
	nested := struct{ Cfg Config }{c}
	for _, text := range []string{
		c.String(), c.GoString(),
		fmt.Sprint(c), fmt.Sprintln(c), fmt.Sprint(&c),
		fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%s", c),
		fmt.Sprintf("%q", c), fmt.Sprintf("%d", c), fmt.Sprintf("%x", c),
		fmt.Sprintf("%v", &c), fmt.Sprintf("%+v", nested), fmt.Sprintf("%#v", nested),
		fmt.Sprintf("%v", []Config{c}), fmt.Sprintf("%v", map[string]Config{"k": c}),
	} {
		assertClean(t, "fmt of a Config", text)
		if !strings.Contains(text, shown) {
			t.Errorf("the URL is not shown redacted: %s", text)
		}
	}
	if got := fmt.Sprintf("%+v", c); !strings.Contains(got, "URL:"+shown) || !strings.Contains(got, "Limit:5") {
		t.Errorf("%%+v: %s", got)
	}
	if got := fmt.Sprintf("%#v", c); !strings.HasPrefix(got, "quotalease.Config{URL:\""+shown+"\"") {
		t.Errorf("%%#v: %s", got)
	}
	if c.URL != "redis://"+secretUser+":"+secretPW+"@127.0.0.1:6379/0" {
		t.Errorf("formatting changed the Config: %s", c.URL)
	}
}

func TestConfigErrorsNeverShowThePassword(t *testing.T) {
	for _, url := range []string{
		"redis://" + secretUser + ":" + secretPW + "@127.0.0.1:notaport",
		"redis://" + secretUser + ":" + secretPW + "@127.0.0.1:6379/notadb",
		"unix:///run/redis.sock?user=" + secretUser + "&pass=" + secretPW,
		"redis://" + secretUser + ":" + secretPW,
	} {
		_, err := New(Config{URL: url, Limit: 5})
		if err == nil {
			t.Fatalf("%s: no error", url)
		}
		assertClean(t, "the error", err.Error()+fmt.Sprintf(" %+v %#v", err, err))
		if !strings.Contains(err.Error(), "`url`") {
			t.Errorf("the error does not name the option: %v", err)
		}
	}
	// A URL given to another option.
	_, err := newLimiter([]option{{name: "limit", str: "redis://" + secretUser + ":" + secretPW + "@h:1", isStr: true}}, nil)
	if err == nil {
		t.Fatal("a string limit: no error")
	}
	assertClean(t, "the error", err.Error())
}

// The engine quotes a string option it cannot read; a URL given to the wrong
// field (Rate: os.Getenv("REDIS_URL")) is shown redacted all the same.
func TestAURLInAStringFieldIsShownRedacted(t *testing.T) {
	url := "redis://" + secretUser + ":" + secretPW + "@h:1/0"
	for name, c := range map[string]Config{
		"Rate":             {Rate: url},
		"Mode":             {Rate: "5/min", Mode: Mode(url)},
		"OnBackendFailure": {Rate: "5/min", OnBackendFailure: FailurePolicy(url)},
		"OvershootBudget":  {Rate: "5/min", OvershootBudget: url},
		"Tiers":            {Rate: "5/min", Tiers: "free=" + url},
		"PolicyFile":       {Rate: "5/min", PolicyFile: "/nonexistent/" + url},
		"a quote in Rate":  {Rate: `"` + url},
		"a NUL in Rate":    {Rate: url + "\x00"},
	} {
		_, err := New(c)
		if !errors.Is(err, ErrConfig) {
			t.Fatalf("%s: %v, want a KindConfig error", name, err)
		}
		assertClean(t, name, err.Error()+fmt.Sprintf(" %+v %#v", err, err))
		if !strings.Contains(err.Error(), "***") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := New(Config{Rate: url}); err == nil || !strings.Contains(err.Error(), `"redis://***@h:1/0"`) {
		t.Errorf("the value is not shown redacted with its host: %v", err)
	}
	// One without its scheme: the engine redacts a quoted value with an @.
	bare := secretUser + ":" + secretPW + "@h:1"
	for _, c := range []Config{{Rate: bare}, {Rate: "5/min", Tiers: "pro=" + bare}} {
		_, err := New(c)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `"***@h:1"`) {
			t.Errorf("%+v: %v", c, err)
		}
		if err != nil {
			assertClean(t, "a URL without its scheme", err.Error())
		}
	}
	c := DefaultConfig()
	c.URL = "memory://" + uniq("secret")
	c.Rate = "5/min"
	l := mustNew(t, c)
	defer l.Close()
	for name, err := range map[string]error{
		"PolicySetTier":       errOf(l.PolicySetTier("pro", url)),
		"PolicySetTier NUL":   errOf(l.PolicySetTier("pro", url+"\x00")),
		"PolicyAssign":        errOf(l.PolicyAssign("k", url)),
		"PolicyAssign as key": errOf(l.PolicyAssign("k", "tier:"+url)),
	} {
		if !errors.Is(err, ErrConfig) {
			t.Fatalf("%s: %v, want a KindConfig error", name, err)
		}
		assertClean(t, name, err.Error())
	}
}

// degradedMessage builds a limiter on url, acquires until its degraded
// event arrives and returns the message.
func degradedMessage(t *testing.T, url string) string {
	var mu sync.Mutex
	var messages []string
	c := DefaultConfig()
	c.URL = url
	c.Limit = 1000
	c.BackendTimeoutMs = 300
	c.KeyPrefix = uniq("secret")
	c.OnEvent = func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Kind == EventDegraded {
			messages = append(messages, e.Message)
		}
	}
	l := mustNew(t, c)
	got := func() bool { mu.Lock(); defer mu.Unlock(); return len(messages) > 0 }
	if !pollUntil(t, 15*time.Second, func() { l.Acquire("k") }, got) {
		t.Fatalf("no degraded event for %s", RedactURL(url))
	}
	mu.Lock()
	defer mu.Unlock()
	return messages[0]
}

func TestAFailingConnectionNeverShowsThePassword(t *testing.T) {
	url := fmt.Sprintf("redis://%s:%s@127.0.0.1:%d/0", secretUser, secretPW, closedPort(t))
	msg := degradedMessage(t, url)
	assertClean(t, "the degraded message", msg)
	if !strings.Contains(msg, "Connection refused") {
		t.Errorf("message: %s", msg)
	}
}

func TestAWrongPasswordNeverShowsThePassword(t *testing.T) {
	out, err := exec.Command(redisctl, "start").Output()
	if err != nil {
		t.Fatal(err)
	}
	port := strings.TrimSpace(string(out))
	defer exec.Command(redisctl, "stop", port).Run()
	acl := exec.Command("redis-cli", "-p", port, "ACL", "SETUSER", secretUser, "on", ">another-password", "~*", "+@all")
	if out, err := acl.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	msg := degradedMessage(t, fmt.Sprintf("redis://%s:%s@127.0.0.1:%s", secretUser, secretPW, port))
	assertClean(t, "the degraded message", msg)
	if !strings.Contains(msg, "AuthenticationFailed") {
		t.Errorf("message: %s", msg)
	}
}
