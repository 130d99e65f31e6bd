package quotalease

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies says which hops in front of the application may be
// believed about the client's address. Behind a load balancer every
// request's peer is the balancer, so keying by r.RemoteAddr puts every
// client in one bucket; with WithTrustedProxies, Middleware keys by the
// client's address from X-Forwarded-For (else RFC 7239 Forwarded "for=")
// instead, read only through trusted hops: the chain (the header's
// addresses, then the peer) is walked from the right past trusted hops to
// the first untrusted address. An untrusted peer's headers are ignored, and
// a malformed entry on the walk gives the peer, so a client cannot pick its
// own key. Make one with TrustHops or TrustCIDRs; nil trusts nobody. The
// Python and Node middleware follow the same rules.
type TrustedProxies struct {
	hops     int
	prefixes []netip.Prefix
}

// TrustHops trusts exactly n proxies in front of the application (1: one
// load balancer): the client is the address n hops left of the peer. A
// negative n is a KindConfig error.
func TrustHops(n int) (*TrustedProxies, error) {
	if n < 0 {
		return nil, &Error{Kind: KindConfig, Message: fmt.Sprintf("TrustHops: the hop count must be >= 0, got %d", n)}
	}
	return &TrustedProxies{hops: n}, nil
}

// TrustCIDRs trusts the proxies whose addresses are in cidrs, each a CIDR
// ("10.0.0.0/8", "fd00::/8") or one address ("192.0.2.7", "::1"). An entry
// that is neither is a KindConfig error.
func TrustCIDRs(cidrs ...string) (*TrustedProxies, error) {
	p := &TrustedProxies{}
	for _, c := range cidrs {
		s := strings.TrimSpace(c)
		var prefix netip.Prefix
		var err error
		if strings.Contains(s, "/") {
			prefix, err = netip.ParsePrefix(s)
		} else {
			var ip netip.Addr
			if ip, err = netip.ParseAddr(s); err == nil {
				ip = ip.Unmap()
				prefix = netip.PrefixFrom(ip, ip.BitLen())
			}
		}
		if err != nil {
			return nil, &Error{Kind: KindConfig, Message: fmt.Sprintf(
				"TrustCIDRs: %q is not an IP address or CIDR (e.g. \"10.0.0.0/8\", \"::1\")", c)}
		}
		p.prefixes = append(p.prefixes, prefix.Masked())
	}
	return p, nil
}

// WithTrustedProxies makes the default key (a nil KeyFunc, or ByRemoteIP)
// the client's address behind p (see TrustedProxies). A KeyFunc of your own
// can call p.ClientIP(r).
func WithTrustedProxies(p *TrustedProxies) MiddlewareOption {
	return func(m *middleware) { m.proxies = p }
}

func (p *TrustedProxies) enabled() bool {
	return p != nil && (p.hops > 0 || len(p.prefixes) > 0)
}

func (p *TrustedProxies) trusted(ip netip.Addr, hop int) bool {
	if p.hops > 0 {
		return hop < p.hops
	}
	for _, prefix := range p.prefixes {
		if prefix.Contains(ip) {
			return true
		}
	}
	return false
}

// ClientIP is the client's address of r: the host of r.RemoteAddr unless
// that peer is trusted and X-Forwarded-For (else Forwarded) names an
// untrusted hop before any malformed one.
func (p *TrustedProxies) ClientIP(r *http.Request) string {
	peer := ByRemoteIP(r)
	if !p.enabled() {
		return peer
	}
	return p.client(peer, strings.Join(r.Header.Values("Forwarded"), ","),
		strings.Join(r.Header.Values("X-Forwarded-For"), ","))
}

func (p *TrustedProxies) client(peer, forwarded, xForwardedFor string) string {
	peerIP, ok := parseIP(peer)
	if !ok || !p.trusted(peerIP, 0) {
		return peer
	}
	hops := forwardingChain(forwarded, xForwardedFor)
	var found netip.Addr
	for i, hop := len(hops)-1, 1; i >= 0; i, hop = i-1, hop+1 {
		ip, ok := parseIP(hops[i])
		if !ok {
			return peer
		}
		found = ip
		if !p.trusted(ip, hop) {
			break
		}
	}
	// Every hop trusted: the furthest one is as near the client as we can tell.
	if !found.IsValid() {
		return peer
	}
	return found.String()
}

// parseIP reads 1.2.3.4, 1.2.3.4:80, ::1, [::1] or [::1]:80 (IPv4-mapped
// IPv6 as IPv4).
func parseIP(text string) (netip.Addr, bool) {
	s := strings.TrimSpace(text)
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		if rest := s[end+1:]; rest != "" && !(rest[0] == ':' && digits(rest[1:])) {
			return netip.Addr{}, false
		}
		s = s[1:end]
	} else if strings.Count(s, ":") == 1 {
		host, port, _ := strings.Cut(s, ":")
		if !digits(port) {
			return netip.Addr{}, false
		}
		s = host
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// forwardingChain is the header's hops, nearest last: X-Forwarded-For when
// present, else Forwarded's for= values ("" for an element without one).
func forwardingChain(forwarded, xForwardedFor string) []string {
	if strings.TrimSpace(xForwardedFor) != "" {
		return strings.Split(xForwardedFor, ",")
	}
	if strings.TrimSpace(forwarded) == "" {
		return nil
	}
	elements, ok := splitQuoted(forwarded, ',')
	if !ok {
		return []string{""}
	}
	hops := make([]string, len(elements))
	for i, e := range elements {
		hops[i] = forwardedFor(e)
	}
	return hops
}

// splitQuoted splits value at sep outside quoted strings; false when a
// quote is left open.
func splitQuoted(value string, sep byte) ([]string, bool) {
	var parts []string
	start, quoted, escaped := 0, false, false
	for i := 0; i < len(value); i++ {
		switch c := value[i]; {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			parts = append(parts, value[start:i])
			start = i + 1
		}
	}
	if quoted {
		return nil, false
	}
	return append(parts, value[start:]), true
}

// forwardedFor is the for= value of one Forwarded element, unquoted.
func forwardedFor(element string) string {
	pairs, _ := splitQuoted(element, ';')
	for _, pair := range pairs {
		name, value, ok := strings.Cut(pair, "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "for") {
			continue
		}
		value = strings.TrimSpace(value)
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			value = strings.ReplaceAll(value[1:len(value)-1], `\`, "")
		}
		return value
	}
	return ""
}
