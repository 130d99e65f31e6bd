package quotalease

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// tiered is a manual-clock config on a private memory authority with tiers.
func tiered(tiers string) Config {
	c := manual(100, 1000)
	c.LeaseSize = 1
	c.Tiers = tiers
	c.PolicyRefreshMs = 1000
	return c
}

func TestAcquireTierPicksTheRules(t *testing.T) {
	c := tiered("free=2/s; pro=5/s")
	c.Limit, c.WindowMs = 0, 0 // the default tier stands in for Limit
	c.DefaultTier = "free"
	l := mustNew(t, c)
	d, err := l.Acquire("a")
	if err != nil || !d.Allowed || d.Limit != 2 || d.Remaining != 1 || d.Rule != 0 ||
		!reflect.DeepEqual(d.Rules, []Rule{{2, 1000}}) {
		t.Fatalf("default tier: %+v %v", d, err)
	}
	if d, err = l.AcquireTier("a", ""); err != nil || d.Limit != 2 || d.Remaining != 0 {
		t.Fatalf(`AcquireTier(key, "") is Acquire: %+v %v`, d, err)
	}
	if d, err = l.AcquireTier("b", "pro"); err != nil || !d.Allowed || d.Limit != 5 || d.Remaining != 4 {
		t.Fatalf("pro: %+v %v", d, err)
	}
	if d, err = l.TryAcquireTierN("b", 2, "pro"); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("pro, cost 2: %+v %v", d, err)
	}
	if d, err = l.AcquireTierN("b", 3, "pro"); err != nil || d.Allowed || d.Reason != ReasonExhausted {
		t.Fatalf("pro, cost 3 of 2 left: %+v %v", d, err)
	}
	if _, err = l.AcquireTierN("b", 6, "pro"); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("cost above the tier's limit: %v", err)
	}
	p, err := l.Policy("b", "pro")
	if err != nil || p != (Policy{Rules: "5/s", Tier: "pro", Source: "tier pro (assigned by caller, defined in config)"}) {
		t.Fatalf("Policy: %+v %v", p, err)
	}
	in, err := l.Inspect("b")
	if err != nil || in.Rules != "5/s" || in.Tier != "pro" || !strings.Contains(in.PolicySource, "tier pro") {
		t.Fatalf("Inspect: %+v %v", in, err)
	}
}

func TestBadTiersAreConfigErrors(t *testing.T) {
	l := mustNew(t, tiered("free=2/s; pro=5/s"))
	for _, tier := range []string{"gold", "pr\xffo", "b@d", "pro\x00"} {
		for name, call := range map[string]func() (Decision, error){
			"AcquireTier":    func() (Decision, error) { return l.AcquireTier("k", tier) },
			"TryAcquireTier": func() (Decision, error) { return l.TryAcquireTier("k", tier) },
		} {
			d, err := call()
			var e *Error
			if !errors.Is(err, ErrConfig) || !errors.As(err, &e) || !reflect.DeepEqual(d, Decision{}) {
				t.Fatalf("%s(%q): %+v %v", name, tier, d, err)
			}
		}
	}
	_, err := l.AcquireTier("k", "gold")
	if msg := err.Error(); !strings.Contains(msg, "gold") || !strings.Contains(msg, "free") || !strings.Contains(msg, "pro") {
		t.Fatalf("the message names the tier and the known ones: %v", err)
	}
	if _, err := l.AcquireTier("", "pro"); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := l.Policy("k", "gold"); !errors.Is(err, ErrConfig) {
		t.Fatalf("Policy of an unknown tier: %v", err)
	}
	for _, tiers := range []string{"x=1/fortnight", "x=1/s, 2/s", "b@d=1/s", "free", "x=1/s,1/2s,1/3s,1/4s,1/5s", "x=1/s\x00"} {
		if _, err := New(tiered(tiers)); !errors.Is(err, ErrConfig) {
			t.Fatalf("Tiers %q: %v", tiers, err)
		}
	}
	c := tiered("free=1/s")
	c.DefaultTier = "gold"
	if _, err := New(c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "gold") {
		t.Fatalf("DefaultTier gold: %v", err)
	}
	var nl *Limiter
	if _, err := nl.AcquireTier("k", "pro"); !errors.Is(err, ErrClosed) {
		t.Fatalf("nil limiter: %v", err)
	}
	l.Close()
	if _, err := l.AcquireTier("k", "pro"); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

func TestTwoRulesRefundAndHeaders(t *testing.T) {
	c := tiered("burst=2/s, 3/10s")
	c.RefillThreshold = 0
	l := mustNew(t, c)
	two := []Rule{{2, 1000}, {3, 10000}}
	for i := 0; i < 2; i++ {
		d, err := l.AcquireTier("k", "burst")
		if err != nil || !d.Allowed || d.Rule != 0 || !reflect.DeepEqual(d.Rules, two) {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
	}
	if d, _ := l.AcquireTier("k", "burst"); d.Allowed || d.Rule != 0 {
		t.Fatalf("the 1 s rule denies: %+v", d)
	}
	if err := l.AdvanceClock(1000); err != nil {
		t.Fatal(err)
	}
	d, err := l.AcquireTier("k", "burst")
	if err != nil || !d.Allowed || d.Rule != 1 || d.Limit != 3 || d.WindowMs != 10000 || d.Remaining != 0 {
		t.Fatalf("the 10 s rule binds: %+v %v", d, err)
	}
	h := d.Headers()
	if got := h.Get("RateLimit-Policy"); got != `"1s";q=2;w=1, "10s";q=3;w=10` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if got := h.Get("RateLimit"); !strings.HasPrefix(got, `"10s";r=0;`) {
		t.Fatalf("RateLimit %q", got)
	}
	// The 10 s rule denies; the token the 1 s rule took goes back.
	d, err = l.AcquireTier("k", "burst")
	if err != nil || d.Allowed || d.Rule != 1 {
		t.Fatalf("denied by the 10 s rule: %+v %v", d, err)
	}
	if h := d.Headers(); h.Get("Retry-After") == "" || !strings.HasPrefix(h.Get("RateLimit"), `"10s";r=0;`) {
		t.Fatalf("denied headers: %v", h)
	}
	if m := l.Metrics(); m.Admitted != 3 || m.Denied != 2 || m.OvershootBound != 1 {
		t.Fatalf("each request counted once, the refunded token held: %+v", m)
	}
}

func TestHeadersOfAHandMadeDecision(t *testing.T) {
	d := Decision{Allowed: false, Limit: 10000, RetryAfterMs: 8640, ResetAfterMs: 86400000, WindowMs: 86400000,
		Reason: ReasonExhausted, Rule: 1, Rules: []Rule{{10, 1000}, {10000, 86400000}}}
	h := d.Headers()
	if h.Get("RateLimit-Policy") != `"1s";q=10;w=1, "1day";q=10000;w=86400` ||
		h.Get("RateLimit") != `"1day";r=0;t=86400` || h.Get("Retry-After") != "9" {
		t.Fatalf("%v", h)
	}
	d.Rule = 5 // out of range: the engine refuses it, no headers rather than wrong ones
	if h := d.Headers(); len(h) != 0 {
		t.Fatalf("bad Rule: %v", h)
	}
}

func TestStoreIsSharedAfterRefresh(t *testing.T) {
	c := tiered("free=2/s; pro=4/s")
	a, b := mustNew(t, c), mustNew(t, c) // one memory:// store
	if d, _ := b.AcquireTier("k", "free"); d.Limit != 2 {
		t.Fatalf("before: %+v", d)
	}
	if e, ok, err := a.PolicyGet("k"); err != nil || ok || e != "" {
		t.Fatalf("no entry: %q %v %v", e, ok, err)
	}
	v1, err := a.PolicyAssign("k", "tier:pro")
	if err != nil {
		t.Fatal(err)
	}
	v2, err := a.PolicySetTier("gold", "3/s, 20/min")
	if err != nil || v2 <= v1 || v1 == 0 {
		t.Fatalf("versions %d then %d: %v", v1, v2, err)
	}
	if e, ok, err := b.PolicyGet("k"); err != nil || !ok || e != "tier:pro" {
		t.Fatalf("entry: %q %v %v", e, ok, err)
	}
	if err := b.RefreshPolicies(); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.AcquireTier("k", "free"); d.Limit != 4 {
		t.Fatalf("the store's tier:pro wins over the free named: %+v", d)
	}
	if d, err := b.AcquireTier("g", "gold"); err != nil || !reflect.DeepEqual(d.Rules, []Rule{{3, 1000}, {20, 60000}}) {
		t.Fatalf("gold from the store: %+v %v", d, err)
	}
	if in, err := b.Inspect("k"); err != nil || in.Tier != "pro" ||
		in.PolicySource != "tier pro (assigned by store, defined in config)" {
		t.Fatalf("Inspect: %+v %v", in, err)
	}
	if _, err := b.PolicyUnassign("k"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PolicyDeleteTier("gold"); err != nil {
		t.Fatal(err)
	}
	if err := a.RefreshPolicies(); err != nil {
		t.Fatal(err)
	}
	if d, _ := a.AcquireTier("k", "free"); d.Limit != 2 {
		t.Fatalf("unassigned: %+v", d)
	}
	if _, err := a.AcquireTier("g", "gold"); !errors.Is(err, ErrConfig) {
		t.Fatalf("deleted tier: %v", err)
	}
	// Bad input: typed errors, the store unchanged.
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"set_tier b@d", errOf(a.PolicySetTier("b@d", "1/s")), ErrConfig},
		{"set_tier fortnight", errOf(a.PolicySetTier("ok", "1/fortnight")), ErrConfig},
		{"set_tier two of one window", errOf(a.PolicySetTier("ok", "1/s, 2/s")), ErrConfig},
		{"set_tier NUL", errOf(a.PolicySetTier("ok\x00", "1/s")), ErrConfig},
		{"set_tier not UTF-8", errOf(a.PolicySetTier("o\xffk", "1/s")), ErrConfig},
		{"delete_tier empty", errOf(a.PolicyDeleteTier("")), ErrConfig},
		{"assign tier:", errOf(a.PolicyAssign("k", "tier:")), ErrConfig},
		{"assign garbage", errOf(a.PolicyAssign("k", "garbage")), ErrConfig},
		{"assign NUL", errOf(a.PolicyAssign("k", "1/s\x00")), ErrConfig},
		{"assign empty key", errOf(a.PolicyAssign("", "1/s")), ErrInvalidKey},
		{"assign bad key", errOf(a.PolicyAssign("\xff", "1/s")), ErrInvalidKey},
		{"unassign empty key", errOf(a.PolicyUnassign("")), ErrInvalidKey},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if e, ok, _ := a.PolicyGet("k"); ok {
		t.Fatalf("bad input changed the store: %q", e)
	}
	a.Close()
	if _, err := a.PolicyAssign("k", "1/s"); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
	if err := a.RefreshPolicies(); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

func errOf(_ uint64, err error) error { return err }

func TestPolicyFileAndNoStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.toml")
	if err := os.WriteFile(path, []byte("[tiers]\nteam = \"3/s\"\n[keys]\n\"vip\" = \"7/s, 70/min\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := tiered("")
	c.PolicyFile = path
	c.PolicyRefreshMs = NoPolicyStore
	l := mustNew(t, c)
	if d, err := l.AcquireTier("vip", "team"); err != nil || !reflect.DeepEqual(d.Rules, []Rule{{7, 1000}, {70, 60000}}) {
		t.Fatalf("the file's key entry wins: %+v %v", d, err)
	}
	if d, err := l.AcquireTier("x", "team"); err != nil || d.Limit != 3 {
		t.Fatalf("the file's tier: %+v %v", d, err)
	}
	if p, err := l.Policy("vip", ""); err != nil || p != (Policy{Rules: "7/s, 70/min", Source: "own rules (from file)"}) {
		t.Fatalf("Policy: %+v %v", p, err)
	}
	if _, err := l.PolicySetTier("gold", "1/s"); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "policy_refresh_ms") {
		t.Fatalf("no store: %v", err)
	}
	c.PolicyFile = filepath.Join(t.TempDir(), "missing.toml")
	if _, err := New(c); !errors.Is(err, ErrConfig) {
		t.Fatalf("a missing policy file: %v", err)
	}
}

// A warm key's decision allocates nothing, tier or not, one rule or two:
// the Rules slice is shared by decisions with the same rules.
func TestWarmAcquireTierAllocatesNothing(t *testing.T) {
	l := mustNew(t, tiered("burst=1000000/s, 10000000/10s; one=1000000/s"))
	for _, tier := range []string{"", "one", "burst"} {
		if _, err := l.AcquireTier("warm", tier); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(200, func() { _, _ = l.AcquireTier("warm", tier) }); n != 0 {
			t.Errorf("tier %q: %v allocations per AcquireTier", tier, n)
		}
	}
}

// Shadow mode: Config.Shadow admits what the rules deny (ReasonShadow, no
// headers, counted), and a "shadow ..." tier leaves the others enforced.
func TestShadowModeAdmitsWhatTheRulesDeny(t *testing.T) {
	c := tiered("beta=shadow 2/s; free=2/s")
	l := mustNew(t, c)
	shadowed := 0
	for i := 0; i < 5; i++ {
		d, err := l.AcquireTier("k", "beta")
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
		if d.Reason == ReasonShadow {
			shadowed++
			if len(d.Headers()) != 0 || d.Remaining != 0 || d.RetryAfterMs == 0 {
				t.Fatalf("a shadow admission: %+v headers %v", d, d.Headers())
			}
		}
	}
	if shadowed != 3 {
		t.Fatalf("2 of 5 fit the 2/s rule: %d shadowed", shadowed)
	}
	if d, _ := l.AcquireTier("j", "free"); !d.Allowed {
		t.Fatal("free admits its first")
	}
	l.AcquireTier("j", "free")
	if d, _ := l.AcquireTier("j", "free"); d.Allowed {
		t.Fatalf("free is enforced: %+v", d)
	}
	if m := l.Metrics(); m.ShadowDenied != 3 || m.Denied != 4 || m.Map()["shadow_denied"] != 3 {
		t.Fatalf("metrics %+v", m)
	}
	all := manual(1, 60000)
	all.Shadow = true
	la := mustNew(t, all)
	la.Acquire("x")
	if d, _ := la.Acquire("x"); !d.Allowed || d.Reason != ReasonShadow {
		t.Fatalf("Config.Shadow: %+v", d)
	}
	if !strings.Contains(la.MetricsPrometheus(), "quotalease_shadow_denied_total 1\n") {
		t.Fatal(la.MetricsPrometheus())
	}
}

// Allow and deny entries: "blocked" denies with ReasonBlocked, "unlimited"
// admits with ReasonUnlimited and spends nothing; Policy names the entry.
func TestAllowAndDenyEntries(t *testing.T) {
	c := tiered("free=2/s")
	a, b := mustNew(t, c), mustNew(t, c)
	if _, err := a.PolicyAssign("bot", "blocked"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PolicyAssign("ops", "unlimited"); err != nil {
		t.Fatal(err)
	}
	if err := b.RefreshPolicies(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if d, err := b.Acquire("bot"); err != nil || d.Allowed || d.Reason != ReasonBlocked || d.Headers().Get("Retry-After") == "" {
			t.Fatalf("bot: %+v %v", d, err)
		}
	}
	for i := 0; i < 300; i++ {
		if d, err := b.Acquire("ops"); err != nil || !d.Allowed || d.Reason != ReasonUnlimited || len(d.Headers()) != 0 {
			t.Fatalf("ops %d: %+v %v", i, d, err)
		}
	}
	if m := b.Metrics(); m.TokensLeased != 0 || m.Denied != 3 {
		t.Fatalf("metrics %+v", m)
	}
	if p, err := b.Policy("bot", ""); err != nil || !strings.Contains(p.Source, "blocked (from store)") {
		t.Fatalf("policy %+v %v", p, err)
	}
}
