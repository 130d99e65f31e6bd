package quotalease

// #include "cshim.h"
import "C"

import (
	"log"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// HTTPKey is the limiter key Middleware uses for a raw value (a header, an
// address): the value itself when it is at most 512 bytes, else "sha256:"
// and the 64 hex digits of its SHA-256. The rule is the engine's, so an
// over-long header is limited instead of failing, and equal raw values
// share one bucket in every process and language. The only error is a raw
// value that is not valid UTF-8 (KindInvalidKey).
func HTTPKey(raw string) (string, error) {
	r := C.ql_http_key(raw)
	if r.status != C.LEASE_OK {
		return "", newError(r.status, r.err, ctxKey)
	}
	key := unsafe.Slice((*byte)(unsafe.Pointer(&r.key[0])), int(r.len))
	if string(key) == raw {
		return raw, nil // no copy for the usual, unchanged key
	}
	return string(key), nil
}

// KeyFunc picks the rate-limit key of a request. Returning "" lets the
// request through without limiting it (health checks, internal callers).
type KeyFunc func(*http.Request) string

// ByRemoteIP keys requests by the client's IP address (the host part of
// r.RemoteAddr). Behind a load balancer or reverse proxy, add
// WithTrustedProxies to Middleware: this key then reads the client's
// address through the trusted hops.
func ByRemoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// ByHeader keys requests by the value of a header (an API key, a tenant ID
// set by your gateway); requests without it are not limited.
func ByHeader(name string) KeyFunc {
	return func(r *http.Request) string { return r.Header.Get(name) }
}

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middleware)

type middleware struct {
	lim     *Limiter
	key     KeyFunc
	cost    func(*http.Request) uint64
	tier    func(*http.Request) string
	wait    time.Duration
	denied  http.Handler
	onError func(http.ResponseWriter, *http.Request, error)
	proxies *TrustedProxies
	// concurrent: a permit per request (WithConcurrency) instead of tokens.
	concurrent bool
}

// WithCost sets the tokens a request takes (default 1).
func WithCost(f func(*http.Request) uint64) MiddlewareOption {
	return func(m *middleware) { m.cost = f }
}

// WithTier names the plan tier of a request (the limiter's Config.Tiers,
// its policy file or the shared store define them): f returns the tier,
// e.g. from the authenticated customer's plan, or "" for none (the
// limiter's DefaultTier, else its Limit). A key's own entry in the store
// or file wins over the tier named. An unknown tier goes to the error
// handler (KindConfig).
func WithTier(f func(*http.Request) string) MiddlewareOption {
	return func(m *middleware) { m.tier = f }
}

// WithWait has a request wait up to d for its tokens (AcquireWait: in
// arrival order, from the local lease, a rate grant or the refill) instead
// of a 429; a denial whose RetryAfterMs falls past d is answered at once.
// The handler's goroutine waits. d <= 0: no wait (the default).
func WithWait(d time.Duration) MiddlewareOption {
	return func(m *middleware) { m.wait = d }
}

// WithConcurrency limits the requests of a key in flight at once instead
// of its rate: each request takes a permit (AcquireConcurrent; the limiter
// needs Config.Concurrency, else every request goes to the error handler),
// released when the next handler returns (or panics). A request past the
// limit is answered 429 (WithDeniedHandler's, or the default body) with
// Retry-After and no RateLimit headers, which describe rates. WithTier
// picks the tier whose "N concurrent" applies (AcquireConcurrentTier);
// WithCost and WithWait do not apply: Middleware panics when one is given
// with WithConcurrency, as it is a mistake in the program. For a rate and a
// concurrency limit
// both, stack two middlewares on the limiter:
//
//	h := quotalease.Middleware(lim, key)(quotalease.Middleware(lim, key, quotalease.WithConcurrency())(mux))
func WithConcurrency() MiddlewareOption {
	return func(m *middleware) { m.concurrent = true }
}

// WithDeniedHandler replaces the default 429 response (application/problem+json,
// RFC 9457, the body of every quotalease middleware:
// {"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded","retry_after_ms":N}).
// The RateLimit and Retry-After headers are already set when it runs.
func WithDeniedHandler(h http.Handler) MiddlewareOption {
	return func(m *middleware) { m.denied = h }
}

// WithErrorHandler decides what happens when the limiter returns an error
// (a closed limiter, a key that is not valid UTF-8, a cost above the
// limit, an unknown tier). The default logs the error with the standard
// logger and answers 500 with a fixed body, so no client sees the key, the
// tier or the engine's message; to fail open, call the next handler yourself:
//
//	quotalease.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
//		log.Print(err)
//		next.ServeHTTP(w, r)
//	})
func WithErrorHandler(f func(http.ResponseWriter, *http.Request, error)) MiddlewareOption {
	return func(m *middleware) { m.onError = f }
}

// problemBody is the default 429 body for d, the same bytes in every
// quotalease middleware (Python, Node's Express, Go): RFC 9457 problem
// details with the retry delay in milliseconds.
func problemBody(d Decision) []byte {
	return []byte(`{"type":"about:blank","title":"Too Many Requests","status":429,` +
		`"detail":"rate limit exceeded","retry_after_ms":` + strconv.FormatUint(d.RetryAfterMs, 10) + `}`)
}

func writeProblem(w http.ResponseWriter, d Decision) {
	body := problemBody(d)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
}

func defaultError(w http.ResponseWriter, r *http.Request, err error) {
	log.Printf("quotalease: %s %s: %v", r.Method, r.URL.Path, err)
	http.Error(w, "internal server error: rate limiter", http.StatusInternalServerError)
}

// Middleware limits every request by HTTPKey(key(r)) (a key over 512 bytes
// is limited under its SHA-256, as in every language): it sets the IETF
// RateLimit-Policy and RateLimit headers on every limited response, and
// answers 429 Too Many Requests with Retry-After when the request is denied.
//
//	mux := http.NewServeMux()
//	http.ListenAndServe(":8080", quotalease.Middleware(lim, quotalease.ByRemoteIP)(mux))
func Middleware(lim *Limiter, key KeyFunc, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	m := &middleware{lim: lim, key: key, onError: defaultError}
	if m.key == nil {
		m.key = ByRemoteIP
	}
	for _, o := range opts {
		o(m)
	}
	if m.concurrent {
		var given []string
		if m.cost != nil {
			given = append(given, "WithCost")
		}
		if m.wait > 0 {
			given = append(given, "WithWait")
		}
		if len(given) > 0 {
			panic("quotalease: " + strings.Join(given, " and ") + " cannot be combined with WithConcurrency " +
				"(a request takes one permit); stack a second Middleware without WithConcurrency for a rate limit too")
		}
	}
	if m.proxies.enabled() && reflect.ValueOf(m.key).Pointer() == reflect.ValueOf(ByRemoteIP).Pointer() {
		m.key = m.proxies.ClientIP
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			raw := m.key(r)
			if raw == "" {
				next.ServeHTTP(w, r)
				return
			}
			cost := uint64(1)
			if m.cost != nil {
				cost = m.cost(r)
			}
			tier := ""
			if m.tier != nil {
				tier = m.tier(r)
			}
			k, err := HTTPKey(raw)
			if err == nil && m.concurrent {
				m.serveConcurrent(w, r, next, k, tier)
				return
			}
			var d Decision
			if err == nil && m.wait > 0 {
				d, err = m.lim.AcquireWait(k, cost, tier, m.wait)
			} else if err == nil {
				d, err = m.lim.AcquireTierN(k, cost, tier)
			}
			if err != nil {
				m.onError(w, r, err)
				return
			}
			h := w.Header()
			for name, values := range d.Headers() {
				h[name] = values
			}
			if !d.Allowed {
				if m.denied != nil {
					m.denied.ServeHTTP(w, r)
				} else {
					writeProblem(w, d)
				}
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// serveConcurrent serves r under a permit of key k (WithConcurrency).
func (m *middleware) serveConcurrent(w http.ResponseWriter, r *http.Request, next http.Handler, k, tier string) {
	p, err := m.lim.AcquireConcurrentTier(k, tier)
	if err != nil {
		m.onError(w, r, err)
		return
	}
	defer p.Close() // releases an admitted permit, also when next panics
	if !p.Allowed {
		w.Header().Set("Retry-After", p.Decision.Headers().Get("Retry-After"))
		if m.denied != nil {
			m.denied.ServeHTTP(w, r)
		} else {
			writeProblem(w, p.Decision)
		}
		return
	}
	next.ServeHTTP(w, r)
}
