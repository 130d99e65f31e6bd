package quotalease

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

const lb = "10.0.0.5" // the load balancer, the peer of every request

func mustTrust(p *TrustedProxies, err error) *TrustedProxies {
	if err != nil {
		panic(err)
	}
	return p
}

// The same table as Python's test_proxies.py and Node's proxies.test.js.
func TestTrustedProxiesClientAddress(t *testing.T) {
	hops := func(n int) *TrustedProxies { return mustTrust(TrustHops(n)) }
	cidrs := func(c ...string) *TrustedProxies { return mustTrust(TrustCIDRs(c...)) }
	cases := []struct {
		p                    *TrustedProxies
		peer, forwarded, xff string
		want                 string
	}{
		// None trusted (the default): the peer, whatever the headers say.
		{nil, lb, "", "1.2.3.4", lb},
		{hops(0), lb, "for=1.2.3.4", "", lb},
		// An untrusted peer's headers are ignored (spoofed).
		{cidrs("10.0.0.0/8"), "203.0.113.9", "", "1.2.3.4", "203.0.113.9"},
		{hops(1), "not an address", "", "1.2.3.4", "not an address"},
		// A trusted chain: past the trusted hops, the first untrusted one.
		{cidrs("10.0.0.0/8"), lb, "", "1.2.3.4", "1.2.3.4"},
		{cidrs("10.0.0.0/8"), lb, "", "6.6.6.6, 1.2.3.4, 10.1.1.1", "1.2.3.4"},
		{cidrs("10.0.0.0/8", "192.0.2.7"), lb, "", "1.2.3.4,192.0.2.7", "1.2.3.4"},
		{cidrs("10.0.0.0/8"), lb, "", "10.9.9.9, 10.1.1.1", "10.9.9.9"},
		{cidrs("10.0.0.0/8"), "::ffff:10.0.0.5", "", "1.2.3.4", "1.2.3.4"},
		// The hop count: skip exactly N hops from the right.
		{hops(1), lb, "", "6.6.6.6, 1.2.3.4", "1.2.3.4"},
		{hops(2), lb, "", "6.6.6.6, 1.2.3.4, 10.1.1.1", "1.2.3.4"},
		{hops(3), lb, "", "1.2.3.4", "1.2.3.4"},
		// X-Forwarded-For with ports and IPv6.
		{hops(1), lb, "", "1.2.3.4:5555", "1.2.3.4"},
		{hops(1), lb, "", "[2001:db8::1]:443", "2001:db8::1"},
		{hops(1), lb, "", "2001:DB8::0:1", "2001:db8::1"},
		{cidrs("::1"), "::1", "", "2001:db8::1", "2001:db8::1"},
		// Forwarded (RFC 7239): quoted values, IPv6 in brackets, other parameters.
		{hops(1), lb, "for=1.2.3.4", "", "1.2.3.4"},
		{hops(1), lb, `for="[2001:db8:cafe::17]:4711";proto=https`, "", "2001:db8:cafe::17"},
		{hops(1), lb, `for=6.6.6.6, For="1.2.3.4:80";by=10.0.0.5`, "", "1.2.3.4"},
		{hops(2), lb, `for=1.2.3.4;host="a,b", for=10.1.1.1`, "", "1.2.3.4"},
		// X-Forwarded-For wins over Forwarded when both are present.
		{hops(1), lb, "for=6.6.6.6", "1.2.3.4", "1.2.3.4"},
		// Malformed: the peer, never a panic.
		{hops(1), lb, "", "not-an-ip", lb},
		{hops(1), lb, "", "1.2.3.4, ", lb},
		{hops(1), lb, "", "1.2.3.4:port", lb},
		{hops(1), lb, "", "[::1", lb},
		{hops(1), lb, "for=unknown", "", lb},
		{hops(1), lb, "for=_hidden", "", lb},
		{hops(1), lb, `for="1.2.3.4`, "", lb},
		{hops(1), lb, "proto=https", "", lb},
		{hops(1), lb, "for=1.2.3.4;;", "", "1.2.3.4"},
		{hops(1), lb, "", "\u0661.2.3.4", lb},
		// Garbage to the left of the client is never read.
		{hops(1), lb, "", "garbage, 1.2.3.4", "1.2.3.4"},
		{hops(1), lb, "", "", lb},
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.peer
		if c.peer != "not an address" {
			r.RemoteAddr = "[" + c.peer + "]:40000"
		}
		if c.forwarded != "" {
			r.Header.Set("Forwarded", c.forwarded)
		}
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := c.p.ClientIP(r); got != c.want {
			t.Errorf("peer %q Forwarded %q X-Forwarded-For %q: got %q, want %q", c.peer, c.forwarded, c.xff, got, c.want)
		}
	}
}

func TestTrustedProxiesBadSettingsAreConfigErrors(t *testing.T) {
	if _, err := TrustHops(-1); !errors.Is(err, ErrConfig) {
		t.Fatalf("TrustHops(-1): %v", err)
	}
	for _, bad := range []string{"10.0.0.0/33", "nonsense", "10.0.0.0/8/1", ""} {
		_, err := TrustCIDRs("10.0.0.0/8", bad)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindConfig {
			t.Fatalf("TrustCIDRs(%q): %v", bad, err)
		}
	}
}

func TestMiddlewareBehindTrustedProxies(t *testing.T) {
	c := manual(1, 60000)
	c.LeaseSize = 1
	l := mustNew(t, c)
	loopback := mustTrust(TrustCIDRs("127.0.0.1", "::1"))
	elsewhere := mustTrust(TrustCIDRs("10.0.0.0/8"))
	twoHops := mustTrust(TrustHops(2))
	trusted := serve(t, Middleware(l, ByRemoteIP, WithTrustedProxies(loopback))(hello))
	untrusted := serve(t, Middleware(l, nil, WithTrustedProxies(elsewhere))(hello))
	counted := serve(t, Middleware(l, nil, WithTrustedProxies(twoHops))(hello))
	status := func(url string, h map[string]string) int {
		resp, _ := get(t, url, h)
		return resp.StatusCode
	}
	steps := []struct {
		url  string
		h    map[string]string
		want int
	}{
		// Spoofed headers from an untrusted peer (127.0.0.1 here): its own bucket every time.
		{untrusted.URL, map[string]string{"X-Forwarded-For": "1.1.1.1"}, 200},
		{untrusted.URL, map[string]string{"X-Forwarded-For": "2.2.2.2"}, 429},
		// A trusted peer: each client its own bucket, a spoofed left part changes nothing.
		{trusted.URL, map[string]string{"X-Forwarded-For": "1.2.3.4"}, 200},
		{trusted.URL, map[string]string{"X-Forwarded-For": "5.6.7.8"}, 200},
		{trusted.URL, map[string]string{"X-Forwarded-For": "6.6.6.6, 1.2.3.4"}, 429},
		{trusted.URL, map[string]string{"Forwarded": `for="[2001:db8::1]:80"`}, 200},
		// Malformed: the peer's bucket (spent above), not an error.
		{trusted.URL, map[string]string{"Forwarded": "for=unknown"}, 429},
		// Two hops: the peer and 10.1.1.1 are skipped.
		{counted.URL, map[string]string{"X-Forwarded-For": "6.6.6.6, 9.9.9.9, 10.1.1.1"}, 200},
		{counted.URL, map[string]string{"X-Forwarded-For": "9.9.9.9, 10.1.1.2"}, 429},
	}
	for i, s := range steps {
		if got := status(s.url, s.h); got != s.want {
			t.Fatalf("step %d (%v): %d, want %d", i, s.h, got, s.want)
		}
	}
	ins, err := l.Inspect("2001:db8::1")
	if err != nil || ins.Admitted != 1 {
		t.Fatalf("inspect: %+v %v", ins, err)
	}
}
