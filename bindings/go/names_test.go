package quotalease

import "testing"

// The Go constants stay Go constants; these tests keep them equal to the
// engine's names, read through the C ABI for every code.

func TestReasonsAreTheCABIs(t *testing.T) {
	seen := map[Reason]bool{}
	code := uint32(0)
	for ; cReasonName(code) != "unknown"; code++ {
		r := reasonOf(code)
		if name := cReasonName(code); string(r) != name {
			t.Errorf("code %d: Go %q, C ABI %q", code, r, name)
		}
		if r.code() != code {
			t.Errorf("%q: Go code %d, C ABI code %d", r, r.code(), code)
		}
		seen[r] = true
	}
	if code == 0 {
		t.Fatal("lease_reason_name names no code")
	}
	for _, r := range []Reason{ReasonLease, ReasonExhausted, ReasonFallback, ReasonPending, ReasonExact, ReasonLocal, ReasonShadow, ReasonBlocked, ReasonUnlimited} {
		if !seen[r] {
			t.Errorf("%q is not a C ABI reason", r)
		}
	}
	if len(seen) != 9 {
		t.Errorf("the C ABI has %d reasons, Go 9", len(seen))
	}
	if reasonOf(code) != "unknown" {
		t.Errorf("code %d: %q", code, reasonOf(code))
	}
}

func TestKindsAreTheCABIs(t *testing.T) {
	seen := map[Kind]bool{}
	for status := 0; status < 256; status++ {
		name := cErrorKindName(status)
		if name == "" {
			continue // no kind of its own (LEASE_OK, _NULL, _UTF8, ...)
		}
		for _, ctx := range []errContext{ctxKey, ctxConfig} {
			if k := kindOfStatus(status, ctx); k.String() != name {
				t.Errorf("status %d: Go %q, C ABI %q", status, k, name)
			}
		}
		seen[kindOfStatus(status, ctxKey)] = true
	}
	for _, k := range []Kind{KindConfig, KindInvalidKey, KindInvalidCost, KindClosed, KindBackend, KindMisconfigured, KindReservation} {
		if !seen[k] {
			t.Errorf("%q is not a C ABI error kind", k)
		}
	}
}
