package quotalease

// #include "cshim.h"
import "C"

import "unsafe"

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

// Config holds every option of a Limiter. Start from DefaultConfig and set
// what you need: a zero field is passed on as zero and rejected where zero is
// invalid, never silently replaced by a default.
type Config struct {
	// URL: "memory://" (default: an in-process authority private to the
	// limiter), "memory://NAME" (shared by every limiter of the process with
	// that NAME), "redis://[user:pass@]host:port[/db]", "rediss://" (TLS),
	// "redis+cluster://host:port[,host:port...]".
	URL string
	// Limit is the number of tokens per window for every key (required).
	Limit uint64
	// WindowMs is the window in milliseconds (default 60000).
	WindowMs uint64
	// Rate, when not empty, sets Limit and WindowMs from a rate such as
	// "600/min", "10/s", "100/30s" or "5000/hour".
	Rate string
	// LeaseSize is the number of tokens borrowed per lease (default Auto:
	// 2 % of Limit, between 1 and 20). Your accuracy budget: the fleet
	// overshoots by at most instances × LeaseSize.
	LeaseSize uint64
	// RefillThreshold: prefetch when local tokens drop below it (default
	// Auto: LeaseSize / 4, at least 1). 0 disables prefetch.
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
	// ManualClock makes the limiter's clock move only with AdvanceClock,
	// starting at ClockStartMs: for deterministic tests.
	ManualClock bool
	// ClockStartMs is the manual clock's first reading.
	ClockStartMs uint64
	// OnEvent, when set, is called on every backend transition (degraded /
	// recovered), from the limiter's broker thread. It must return quickly.
	OnEvent func(Event)

	fromDefaults bool
}

// DefaultConfig returns a Config with every documented default; set Limit
// (and usually URL, WindowMs and ExpectedReplicas) before New.
func DefaultConfig() Config {
	var c C.lease_config
	C.lease_config_init(&c)
	return Config{
		URL:              C.GoString(c.url),
		Limit:            uint64(c.limit),
		WindowMs:         uint64(c.window_ms),
		LeaseSize:        uint64(c.lease_size),
		RefillThreshold:  uint64(c.refill_threshold),
		LeaseTTLMs:       uint64(c.lease_ttl_ms),
		OnBackendFailure: PolicyStaticShare,
		ExpectedReplicas: uint64(c.expected_replicas),
		BackendTimeoutMs: uint64(c.backend_timeout_ms),
		KeyPrefix:        C.GoString(c.key_prefix),
		MaxKeys:          uint64(c.max_keys),
		Mode:             ModeLease,
		fromDefaults:     true,
	}
}

// toC fills a C config; the returned func frees its strings.
func (cfg *Config) toC() (C.lease_config, func(), error) {
	var c C.lease_config
	C.lease_config_init(&c)
	var allocs []unsafe.Pointer
	free := func() {
		for _, p := range allocs {
			C.free(p)
		}
	}
	cstr := func(s string) *C.char {
		p := C.CString(s)
		allocs = append(allocs, unsafe.Pointer(p))
		return p
	}
	c.limit = C.uint64_t(cfg.Limit)
	c.window_ms = C.uint64_t(cfg.WindowMs)
	if cfg.Rate != "" {
		var limit, window C.uint64_t
		r := C.ql_parse_rate(cstr(cfg.Rate), &limit, &window)
		if r.status != C.LEASE_OK {
			free()
			return c, nil, newError(r.status, r.err, ctxConfig)
		}
		c.limit, c.window_ms = limit, window
	}
	r := C.ql_mode_parse(cstr(string(cfg.Mode)), &c.mode)
	if r.status == C.LEASE_OK {
		r = C.ql_policy_parse(cstr(string(cfg.OnBackendFailure)), &c.on_backend_failure)
	}
	if r.status != C.LEASE_OK {
		free()
		return c, nil, newError(r.status, r.err, ctxConfig)
	}
	c.url = cstr(cfg.URL)
	c.key_prefix = cstr(cfg.KeyPrefix)
	c.lease_size = C.uint64_t(cfg.LeaseSize)
	c.refill_threshold = C.uint64_t(cfg.RefillThreshold)
	c.lease_ttl_ms = C.uint64_t(cfg.LeaseTTLMs)
	c.expected_replicas = C.uint64_t(cfg.ExpectedReplicas)
	c.backend_timeout_ms = C.uint64_t(cfg.BackendTimeoutMs)
	c.max_keys = C.uint64_t(cfg.MaxKeys)
	if cfg.ManualClock {
		c.clock = C.LEASE_CLOCK_MANUAL
		c.clock_start_ms = C.uint64_t(cfg.ClockStartMs)
	}
	return c, free, nil
}
