package quotalease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func serve(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") })

func TestMiddlewareHeadersAnd429(t *testing.T) {
	c := manual(3, 60000)
	c.LeaseSize = 3
	l := mustNew(t, c)
	srv := serve(t, Middleware(l, ByHeader("X-Api-Key"))(hello))
	for i := 0; i < 3; i++ {
		resp, body := get(t, srv.URL, map[string]string{"X-Api-Key": "k1"})
		if resp.StatusCode != 200 || body != "hello" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"default";q=3;w=60` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
		if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"default";r=`) {
			t.Fatalf("RateLimit %q", got)
		}
		if resp.Header.Get("Retry-After") != "" {
			t.Fatal("Retry-After on an allowed response")
		}
	}
	resp, body := get(t, srv.URL, map[string]string{"X-Api-Key": "k1"})
	// The body of every quotalease middleware (Python's and Node's bytes too).
	var problem struct {
		RetryAfterMs uint64 `json:"retry_after_ms"`
	}
	if err := json.Unmarshal([]byte(body), &problem); err != nil || problem.RetryAfterMs == 0 {
		t.Fatalf("4th: not a problem body with retry_after_ms: %q (%v)", body, err)
	}
	want := fmt.Sprintf(`{"type":"about:blank","title":"Too Many Requests","status":429,`+
		`"detail":"rate limit exceeded","retry_after_ms":%d}`, problem.RetryAfterMs)
	if resp.StatusCode != http.StatusTooManyRequests || body != want ||
		resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("4th: %d %q %q, want %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, want)
	}
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("RateLimit") != `"default";r=0;t=60` {
		t.Fatalf("429 headers %v", resp.Header)
	}
	// Another key is independent; a request without the header is not limited.
	if resp, _ := get(t, srv.URL, map[string]string{"X-Api-Key": "k2"}); resp.StatusCode != 200 {
		t.Fatalf("k2: %d", resp.StatusCode)
	}
	if resp, _ := get(t, srv.URL, nil); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("unkeyed: %d %v", resp.StatusCode, resp.Header)
	}
	if m := l.Metrics(); m.Admitted != 4 || m.Denied != 1 {
		t.Fatalf("metrics %+v", m)
	}
}

func TestMiddlewareByRemoteIPCostAndCustomDenied(t *testing.T) {
	c := manual(10, 60000)
	c.LeaseSize = 10
	l := mustNew(t, c)
	denied := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "slow down")
	})
	mw := Middleware(l, nil, WithCost(func(*http.Request) uint64 { return 4 }), WithDeniedHandler(denied))
	srv := serve(t, mw(hello))
	for i, want := range []int{200, 200, 503} {
		resp, body := get(t, srv.URL, nil)
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if want == 503 && (body != "slow down" || resp.Header.Get("Retry-After") == "") {
			t.Fatalf("custom denied: %q %v", body, resp.Header)
		}
	}
	// The key was the client's IP (127.0.0.1): 8 of its 10 tokens are spent.
	if d, _ := l.AcquireN("127.0.0.1", 2); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("127.0.0.1: %+v", d)
	}
}

func TestMiddlewareLimitsAnOverLongKeyUnderItsHash(t *testing.T) {
	c := manual(2, 60000)
	c.LeaseSize = 1
	l := mustNew(t, c)
	srv := serve(t, Middleware(l, ByHeader("X-Key"))(hello))
	long := strings.Repeat("x", 600) // a 500 before: keys are at most 512 bytes
	for i, want := range []int{200, 200, 429} {
		if resp, body := get(t, srv.URL, map[string]string{"X-Key": long}); resp.StatusCode != want {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	// The key is the engine's: sha256 of the raw value (python3 hashlib), as in every language.
	const hashed = "sha256:5130b33e6b87fbf5316ed9049e98924eb110800bcbaaad8050f642fba6df37c9"
	if k, err := HTTPKey(long); k != hashed || err != nil {
		t.Fatalf("HTTPKey: %q %v", k, err)
	}
	if d, err := l.Acquire(hashed); err != nil || d.Allowed {
		t.Fatalf("the hashed key's bucket should be spent: %+v %v", d, err)
	}
	for _, k := range []string{"user:42", strings.Repeat("y", 512)} {
		if got, err := HTTPKey(k); got != k || err != nil {
			t.Errorf("HTTPKey(%d bytes) = %d bytes, %v", len(k), len(got), err)
		}
	}
	if _, err := HTTPKey("ab\xff"); !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("non-UTF-8: %v", err)
	}
}

func TestMiddlewareErrors(t *testing.T) {
	l := mustNew(t, manual(10, 60000))
	badKey := func(*http.Request) string { return "ab\xff" }
	srv := serve(t, Middleware(l, badKey)(hello))
	logged := captureLog(t)
	resp, body := get(t, srv.URL, nil)
	if resp.StatusCode != 500 || body != "internal server error: rate limiter\n" {
		t.Fatalf("non-UTF-8 key: %d %q", resp.StatusCode, body)
	}
	if !strings.Contains(logged.String(), "UTF-8") {
		t.Fatalf("the error is logged, not sent: %q", logged.String())
	}
	var seen error
	failOpen := WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		seen = err
		hello.ServeHTTP(w, r)
	})
	srv2 := serve(t, Middleware(l, ByHeader("X-Key"), failOpen)(hello))
	l.Close()
	resp, body = get(t, srv2.URL, map[string]string{"X-Key": "k"})
	if resp.StatusCode != 200 || body != "hello" || !errors.Is(seen, ErrClosed) {
		t.Fatalf("fail open: %d %q %v", resp.StatusCode, body, seen)
	}
}

func TestMiddlewareWithTier(t *testing.T) {
	c := manual(100, 60000)
	c.Tiers = "free=1/min; pro=2/s, 3/min"
	l := mustNew(t, c)
	plan := WithTier(func(r *http.Request) string { return r.Header.Get("X-Plan") })
	srv := serve(t, Middleware(l, ByHeader("X-Api-Key"), plan)(hello))
	resp, _ := get(t, srv.URL, map[string]string{"X-Api-Key": "p", "X-Plan": "pro"})
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != `"1s";q=2;w=1, "1min";q=3;w=60` ||
		!strings.HasPrefix(resp.Header.Get("RateLimit"), `"1s";r=1;`) {
		t.Fatalf("pro: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := get(t, srv.URL, map[string]string{"X-Api-Key": "f", "X-Plan": "free"}); resp.StatusCode != 200 {
		t.Fatalf("free, first: %d", resp.StatusCode)
	}
	resp, _ = get(t, srv.URL, map[string]string{"X-Api-Key": "f", "X-Plan": "free"})
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("RateLimit-Policy") != `"default";q=1;w=60` {
		t.Fatalf("free, second: %d %v", resp.StatusCode, resp.Header)
	}
	// No tier: the limiter's own limit; an unknown tier: the error handler.
	if resp, _ := get(t, srv.URL, map[string]string{"X-Api-Key": "n"}); resp.Header.Get("RateLimit-Policy") != `"default";q=100;w=60` {
		t.Fatalf("no tier: %v", resp.Header)
	}
	logged := captureLog(t)
	resp, body := get(t, srv.URL, map[string]string{"X-Api-Key": "g", "X-Plan": "gold"})
	if resp.StatusCode != http.StatusInternalServerError || strings.Contains(body, "gold") {
		t.Fatalf("unknown tier: %d %q (a header's value is not sent back)", resp.StatusCode, body)
	}
	if !strings.Contains(logged.String(), "gold") {
		t.Fatalf("unknown tier, logged: %q", logged.String())
	}
}

// captureLog sends the standard logger to a buffer until the test ends.
func captureLog(t *testing.T) *syncBuffer {
	t.Helper()
	buf := &syncBuffer{}
	prev, flags := log.Writer(), log.Flags()
	log.SetOutput(buf)
	t.Cleanup(func() { log.SetOutput(prev); log.SetFlags(flags) })
	return buf
}

// syncBuffer is a bytes.Buffer that the server's goroutines may write to
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// WithWait: a request waits for the refill instead of a 429; a shadow
// admission passes with no RateLimit headers.
func TestMiddlewareWithWaitAndShadow(t *testing.T) {
	c := DefaultConfig()
	c.URL = "memory://" + uniq("mwwait")
	c.Limit, c.WindowMs, c.LeaseSize = 2, 1000, 1
	l := mustNew(t, c)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	srv := serve(t, Middleware(l, func(*http.Request) string { return "k" }, WithWait(30*time.Second))(ok))
	for i := 0; i < 3; i++ {
		if r, _ := get(t, srv.URL, nil); r.StatusCode != 200 {
			t.Fatalf("request %d: %d (the third waits for the refill)", i, r.StatusCode)
		}
	}
	s := DefaultConfig()
	s.URL = "memory://" + uniq("mwshadow")
	s.Limit, s.WindowMs, s.Shadow = 1, 60000, true
	ls := mustNew(t, s)
	srv2 := serve(t, Middleware(ls, func(*http.Request) string { return "k" })(ok))
	get(t, srv2.URL, nil)
	r, _ := get(t, srv2.URL, nil)
	if r.StatusCode != 200 || r.Header.Get("RateLimit") != "" {
		t.Fatalf("shadow: %d %v", r.StatusCode, r.Header)
	}
	if m := ls.Metrics(); m.ShadowDenied != 1 {
		t.Fatalf("metrics %+v", m)
	}
}
