package quotalease

/*
#include "cshim.h"

// The URL as liblease prints it (lease_redact_url), malloc'd; NULL when the
// URL cannot be read (not UTF-8).
static inline char *ql_redact_url(const char *url) {
	size_t need = 0;
	char *out;
	if (lease_redact_url(url, NULL, 0, &need) != LEASE_ERR_BUFFER_TOO_SMALL) return NULL;
	out = malloc(need);
	if (out && lease_redact_url(url, out, need, &need) != LEASE_OK) {
		free(out);
		out = NULL;
	}
	return out;
}
*/
import "C"

import (
	"fmt"
	"io"
	"math"
	"strings"
	"unsafe"
)

// Mode is how limiters coordinate: ModeLease, ModeExact or ModeLocal.
type Mode string

// The modes.
const (
	ModeLease Mode = "lease" // local leases borrowed from the authority in chunks (default)
	ModeExact Mode = "exact" // one authority call per request: exact, for modest traffic
	ModeLocal Mode = "local" // an in-process bucket of Limit / ExpectedReplicas, no coordination
)

// FailurePolicy is what a limiter does while the backend is unreachable and
// its local tokens are spent.
type FailurePolicy string

// The failure policies.
const (
	PolicyStaticShare FailurePolicy = "static-share" // a local bucket of Limit / ExpectedReplicas per key (default)
	PolicyAllow       FailurePolicy = "allow"        // admit everything until the backend is back
	PolicyDeny        FailurePolicy = "deny"         // deny everything until the backend is back
)

// Auto, as LeaseSize or RefillThreshold, derives the value from Limit.
const Auto = ^uint64(0)

// NoPolicyStore as Config.PolicyRefreshMs says explicitly what 0, the
// default, does: no shared policy store (the policy_refresh_ms option 0):
// tiers come from Tiers and PolicyFile only, and the Policy* store writes
// are KindConfig errors.
const NoPolicyStore = ^uint64(0)

// Config holds every option of a Limiter. New sends the engine each field
// that is set, by name (the engine's option names, rules and messages are
// the same in every language); a field left at its zero value is not set
// and keeps the engine's default. The exceptions: RefillThreshold 0
// disables prefetch (Auto derives it), and LeaseSize Auto is not set either.
// Rate and Limit/WindowMs are alternatives: setting both is a KindConfig
// error. fmt prints a Config (every verb, %#v too) with URL redacted
// (RedactURL); a Config inside an unexported struct field is printed by fmt
// field by field, without its methods, so log such a struct's Config itself.
type Config struct {
	// URL: "memory://" (default: an in-process authority private to the
	// limiter), "memory://NAME" (shared by every limiter of the process with
	// that NAME), "redis://[user:pass@]host:port[/db]", "rediss://" (TLS),
	// "redis+cluster://host:port[,host:port...]",
	// "redis+sentinel://host:port[,host:port...]/service_name[/db]" (the
	// primary Redis Sentinel names; URL forms: docs/redis.md).
	URL string
	// Limit is the number of tokens per window for every key (required,
	// unless Rate is set).
	Limit uint64
	// WindowMs is the window in milliseconds (default 60000).
	WindowMs uint64
	// Rate, instead of Limit and WindowMs, gives both as a rate such as
	// "600/min", "10/s", "100/30s" or "5000/hour", or is a calendar quota:
	// "1000/month@Europe/Berlin" (day, week, month or year of an IANA
	// zone; "500/month@billing-day-15" for a billing month), at most N in
	// each period, all back at its start. A calendar quota needs adaptive
	// leasing (ModeLease, no LeaseSize).
	Rate string
	// LeaseSize pins fixed leases of this many tokens (0 or Auto: adaptive
	// leasing, leases sized by demand under OvershootBudget). Rarely needed.
	LeaseSize uint64
	// OvershootBudget is adaptive leasing's per-key budget: the most tokens
	// one instance leases ahead of its request, as a count ("40") or a share
	// of Limit ("0.5%"), a hard cap, or "auto" (2 % of Limit, or, when more,
	// an equal part of half what the key refills in a second, at most its
	// capacity, among its live holders); it
	// trades calls against false denials, never the bound. Empty: the
	// engine's default, "auto".
	OvershootBudget string
	// RefillThreshold: prefetch when local tokens drop below it (Auto:
	// LeaseSize / 4, at least 1). 0 disables prefetch: in a Config literal,
	// set it to Auto or start from DefaultConfig.
	RefillThreshold uint64
	// LeaseTTLMs: leased tokens unused this long are given back (default 2000).
	LeaseTTLMs uint64
	// OnBackendFailure is the policy while the backend is unreachable
	// (default PolicyStaticShare).
	OnBackendFailure FailurePolicy
	// ExpectedReplicas is the number of instances sharing a key; it sizes
	// the static share and ModeLocal (default 1).
	ExpectedReplicas uint64
	// BackendTimeoutMs bounds every backend round trip and a cold Acquire's
	// wait (default 250, at most 60000).
	BackendTimeoutMs uint64
	// KeyPrefix prefixes every Redis key (default "ql").
	KeyPrefix string
	// MaxKeys is the most keys tracked locally; idle ones are evicted (default 100000).
	MaxKeys uint64
	// Mode is ModeLease (default), ModeExact or ModeLocal.
	Mode Mode
	// ManualClock makes the limiter's clock move only with AdvanceClock:
	// for deterministic tests. It starts at 1000000 ms (as in every
	// language) unless ClockStartMs is set.
	ManualClock bool
	// ClockStartMs is the manual clock's first reading (0: the default,
	// 1000000). Setting it without ManualClock is a KindConfig error.
	ClockStartMs uint64
	// Tiers names plan tiers and their rules, tiers separated by ';', each
	// name=rules: "free=100/min; pro=6000/min, 1000000/day" (a rule may be a
	// calendar quota, as Rate: "pro=10/s, 25000/day@UTC"). A call names
	// one with AcquireTier; a key's entry in the policy store or file wins.
	Tiers string
	// DefaultTier is the tier of a key whose caller names none and that the
	// store does not assign (""; the key gets Limit/WindowMs). With a
	// default tier, Limit may be left out.
	DefaultTier string
	// PolicyFile is a TOML file of tiers and per-key rules, re-read when it
	// changes (its format: docs/policies.md).
	PolicyFile string
	// PolicyRefreshMs is how often the shared policy store (Redis, or the
	// memory://NAME authority) and PolicyFile are checked for changes. 0,
	// the default (as NoPolicyStore): no shared store, no poll, the file
	// is read once.
	PolicyRefreshMs uint64
	// Shadow puts every key in shadow mode: a request the rules deny is
	// admitted with ReasonShadow and counted in Metrics.ShadowDenied, to
	// watch what a limit would do before enforcing it. One tier or key can
	// be put in shadow mode alone by its rules ("shadow 100/min").
	Shadow bool
	// Concurrency is the most requests of one key in flight at once across
	// the fleet, taken with AcquireConcurrent (0, the default: none). It
	// needs adaptive leasing (ModeLease, no LeaseSize); otherwise New is a
	// KindConfig error.
	Concurrency uint64
	// OnEvent, when set, is called on every backend transition (degraded /
	// recovered), from the limiter's broker thread. It must return quickly.
	OnEvent func(Event)
}

// RedactURL is url as quotalease prints it everywhere (the engine's rule,
// the same in every language): the user name and password, everything
// between "://" and the last '@', become "***", and so do a port that is not
// a number, query values other than a valid protocol or db, and a fragment
// other than #insecure; hosts, ports and the database stay.
// "redis://user:pw@h:6379/0" becomes "redis://***@h:6379/0". A URL that
// cannot be read (not UTF-8) is "***".
func RedactURL(url string) string {
	c := C.CString(url)
	defer C.free(unsafe.Pointer(c))
	out := C.ql_redact_url(c)
	if out == nil {
		return "***"
	}
	defer C.free(unsafe.Pointer(out))
	return C.GoString(out)
}

// configFields is Config without its methods, so that formatting one does
// not call String again.
type configFields Config

func (c Config) redacted() configFields {
	c.URL = RedactURL(c.URL)
	return configFields(c)
}

// String shows every field by name, with URL redacted (RedactURL).
func (c Config) String() string {
	return fmt.Sprintf("%+v", c.redacted())
}

// GoString is the %#v form, with URL redacted (RedactURL).
func (c Config) GoString() string {
	return "quotalease.Config" + strings.TrimPrefix(fmt.Sprintf("%#v", c.redacted()), "quotalease.configFields")
}

// Format makes every verb (%v, %+v, %s, %d, ...) print String, and %#v
// GoString: a password in URL never reaches a log through fmt.
func (c Config) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		io.WriteString(f, c.GoString())
		return
	}
	io.WriteString(f, c.String())
}

// DefaultConfig returns a Config with the documented defaults filled in
// (LeaseSize and RefillThreshold are Auto), except the policy: set Limit
// (and WindowMs, else 60000) or Rate before New. A field left zero keeps the
// engine's default anyway, so DefaultConfig matters most for
// RefillThreshold, whose 0 disables prefetch.
func DefaultConfig() Config {
	var c C.lease_config
	C.lease_config_init(&c)
	return Config{
		URL:              C.GoString(c.url),
		LeaseSize:        uint64(c.lease_size),
		RefillThreshold:  uint64(c.refill_threshold),
		LeaseTTLMs:       uint64(c.lease_ttl_ms),
		OnBackendFailure: PolicyStaticShare,
		ExpectedReplicas: uint64(c.expected_replicas),
		BackendTimeoutMs: uint64(c.backend_timeout_ms),
		KeyPrefix:        C.GoString(c.key_prefix),
		MaxKeys:          uint64(c.max_keys),
		Mode:             ModeLease,
	}
}

// option is one option by name, as the C ABI's lease_options takes it.
type option struct {
	name  string
	str   string
	num   uint64
	isStr bool
}

// options lists the fields that are set, by the engine's option names.
func (cfg *Config) options() []option {
	opts := make([]option, 0, 16)
	str := func(name, v string) {
		if v != "" {
			opts = append(opts, option{name: name, str: v, isStr: true})
		}
	}
	num := func(name string, v uint64) {
		if v != 0 {
			opts = append(opts, option{name: name, num: v})
		}
	}
	str("url", cfg.URL)
	num("limit", cfg.Limit)
	num("window_ms", cfg.WindowMs)
	str("rate", cfg.Rate)
	if cfg.LeaseSize != Auto {
		num("lease_size", cfg.LeaseSize)
	}
	str("overshoot_budget", cfg.OvershootBudget)
	if cfg.RefillThreshold != Auto {
		opts = append(opts, option{name: "refill_threshold", num: cfg.RefillThreshold}) // 0 disables prefetch
	}
	num("lease_ttl_ms", cfg.LeaseTTLMs)
	str("on_backend_failure", string(cfg.OnBackendFailure))
	num("expected_replicas", cfg.ExpectedReplicas)
	num("backend_timeout_ms", cfg.BackendTimeoutMs)
	str("key_prefix", cfg.KeyPrefix)
	num("max_keys", cfg.MaxKeys)
	str("mode", string(cfg.Mode))
	if cfg.ManualClock {
		str("clock", "manual")
	}
	num("clock_start_ms", cfg.ClockStartMs)
	str("tiers", cfg.Tiers)
	str("default_tier", cfg.DefaultTier)
	str("policy_file", cfg.PolicyFile)
	if cfg.PolicyRefreshMs == NoPolicyStore {
		opts = append(opts, option{name: "policy_refresh_ms", num: 0})
	} else {
		num("policy_refresh_ms", cfg.PolicyRefreshMs)
	}
	if cfg.Shadow {
		opts = append(opts, option{name: "shadow", num: 1})
	}
	num("concurrency", cfg.Concurrency)
	return opts
}

// shownValue is how an error this package writes itself shows a value the
// caller gave: redacted by the engine's rule (RedactURL) when it looks like
// a URL (it holds '@' or "://": REDIS_URL given to the wrong field, say).
// The engine's own errors need no such care: it redacts what it echoes.
func shownValue(s string) string {
	if strings.Contains(s, "@") || strings.Contains(s, "://") {
		return RedactURL(s)
	}
	return s
}

// newFromOptions builds a limiter from options by name (lease_options): the
// engine checks every name, value and rule between options, and its errors
// show no URL's credentials, whichever option holds the URL.
func newFromOptions(opts []option) (*C.lease_limiter, error) {
	var o *C.lease_options
	if r := C.ql_options_new(&o); r.status != C.LEASE_OK {
		return nil, newError(r.status, r.err, ctxConfig)
	}
	defer C.lease_options_free(o)
	for _, op := range opts {
		var r C.ql_result
		switch {
		case strings.IndexByte(op.str, 0) >= 0:
			return nil, &Error{Kind: KindConfig, Message: fmt.Sprintf(
				"invalid configuration: `%s` contains a NUL byte (%q)", op.name, shownValue(op.str))}
		case !op.isStr && op.num > math.MaxInt64:
			return nil, &Error{Kind: KindConfig, Message: fmt.Sprintf(
				"invalid configuration: `%s` must be at most %d (got %d)", op.name, int64(math.MaxInt64), op.num)}
		}
		name := C.CString(op.name)
		if op.isStr {
			v := C.CString(op.str)
			r = C.ql_options_set_str(o, name, v)
			C.free(unsafe.Pointer(v))
		} else {
			r = C.ql_options_set_int(o, name, C.int64_t(op.num))
		}
		C.free(unsafe.Pointer(name))
		if r.status != C.LEASE_OK {
			return nil, newError(r.status, r.err, ctxConfig)
		}
	}
	var p *C.lease_limiter
	if r := C.ql_new_from_options(o, &p); r.status != C.LEASE_OK {
		return nil, newError(r.status, r.err, ctxConfig)
	}
	return p, nil
}
