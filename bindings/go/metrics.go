package quotalease

// Metrics is a snapshot of a limiter's counters, with the names every
// language uses (Map gives them as in docs/design.md; the Prometheus names are
// quotalease_<name>, with _total for counters).
type Metrics struct {
	Admitted            uint64 // requests admitted
	Denied              uint64 // requests denied
	BackendCalls        uint64 // authority script calls
	BackendErrors       uint64 // authority calls that failed or timed out
	TokensLeased        uint64 // tokens granted by the authority
	TokensReturned      uint64 // tokens given back to the authority
	TokensExpired       uint64 // leased tokens dropped locally unused
	FallbackActive      uint64 // 1 while the failure policy is in force
	FallbackTransitions uint64 // entries into and exits from the failure policy
	KeysTracked         uint64 // keys tracked locally now
	OvershootBound      uint64 // tokens held unspent: this instance's share of the overshoot bound
	ShadowDenied        uint64 // requests admitted only because their rules are in shadow mode (counted in Denied too)
	TokensDebited       uint64 // tokens reserved requests used beyond their estimate, charged when settled
}

// Map returns the counters by their cross-language names ("admitted",
// "denied", "backend_calls", ...).
func (m Metrics) Map() map[string]uint64 {
	return map[string]uint64{
		"admitted":             m.Admitted,
		"denied":               m.Denied,
		"backend_calls":        m.BackendCalls,
		"backend_errors":       m.BackendErrors,
		"tokens_leased":        m.TokensLeased,
		"tokens_returned":      m.TokensReturned,
		"tokens_expired":       m.TokensExpired,
		"fallback_active":      m.FallbackActive,
		"fallback_transitions": m.FallbackTransitions,
		"keys_tracked":         m.KeysTracked,
		"overshoot_bound":      m.OvershootBound,
		"shadow_denied":        m.ShadowDenied,
		"tokens_debited":       m.TokensDebited,
	}
}
