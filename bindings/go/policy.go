package quotalease

// #include "cshim.h"
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// Policy is the rules a key is held to and why (Limiter.Policy, and the
// policy fields of Inspection).
type Policy struct {
	// Rules is every rule, as the options write them: "6000/min, 1000000/day".
	Rules string
	// Tier is the key's tier, if its rules are a tier's ("" if not).
	Tier string
	// Source says where the assignment and the rules came from: "tier pro
	// (assigned by store, defined in config)", "own rules (from set_limit)".
	Source string
}

// policyOf reads the text of lease_policy_describe / lease_inspect_policy:
// lines "rules: ...", "tier: ..." (only for a tier) and "source: ...".
func policyOf(text string) Policy {
	var p Policy
	for _, line := range strings.Split(text, "\n") {
		name, value, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		switch name {
		case "rules":
			p.Rules = value
		case "tier":
			p.Tier = value
		case "source":
			p.Source = value
		}
	}
	return p
}

// cText is a Go string as a C string for the store calls: a NUL byte
// inside would cut it short in C, so it is a KindConfig error naming arg.
func cText(arg, s string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, &Error{Kind: KindConfig, Message: fmt.Sprintf(
			"invalid configuration: `%s` contains a NUL byte (%q)", arg, shownValue(s))}
	}
	return C.CString(s), nil
}

// PolicySetTier defines (or redefines) plan tier name in the shared policy
// store as rules ("6000/min, 1000000/day": one to four rates with distinct
// windows) and returns the store's version after the change. Every limiter
// on the same store (the same Redis and KeyPrefix, or the same
// memory://NAME) applies it within its PolicyRefreshMs; this one before
// returning. Keys in the tier keep their buckets' state: lowering clamps,
// raising refills at the new rate. Errors: KindConfig (a bad name or
// rules, or no store: PolicyRefreshMs NoPolicyStore), KindClosed,
// KindBackend.
func (l *Limiter) PolicySetTier(name, rules string) (uint64, error) {
	if l == nil {
		return 0, errNil
	}
	n, err := cText("name", name)
	if err != nil {
		return 0, err
	}
	defer C.free(unsafe.Pointer(n))
	r, err := cText("rules", rules)
	if err != nil {
		return 0, err
	}
	defer C.free(unsafe.Pointer(r))
	res := C.ql_policy_set_tier(l.ptr, n, r)
	runtime.KeepAlive(l)
	return uint64(res.version), newError(res.status, res.err, ctxConfig)
}

// PolicyDeleteTier removes tier name from the shared store (keys in it fall
// back to Tiers' or the policy file's definition of it, if any) and returns
// the store's version. Errors as PolicySetTier.
func (l *Limiter) PolicyDeleteTier(name string) (uint64, error) {
	if l == nil {
		return 0, errNil
	}
	n, err := cText("name", name)
	if err != nil {
		return 0, err
	}
	defer C.free(unsafe.Pointer(n))
	res := C.ql_policy_delete_tier(l.ptr, n)
	runtime.KeepAlive(l)
	return uint64(res.version), newError(res.status, res.err, ctxConfig)
}

// PolicyAssign gives key its own entry in the shared store: assignment is
// "tier:NAME" or rules of its own ("10/s, 1000/day"). The entry wins over
// the tier callers name. Returns the store's version. Errors:
// KindInvalidKey, KindConfig (a malformed assignment, or no store),
// KindClosed, KindBackend.
func (l *Limiter) PolicyAssign(key, assignment string) (uint64, error) {
	if l == nil {
		return 0, errNil
	}
	a, err := cText("assignment", assignment)
	if err != nil {
		return 0, err
	}
	defer C.free(unsafe.Pointer(a))
	res := C.ql_policy_assign(l.ptr, key, a)
	runtime.KeepAlive(l)
	return uint64(res.version), newError(res.status, res.err, ctxKey)
}

// PolicyUnassign removes key's entry from the shared store (nil when it has
// none) and returns the store's version.
func (l *Limiter) PolicyUnassign(key string) (uint64, error) {
	if l == nil {
		return 0, errNil
	}
	res := C.ql_policy_unassign(l.ptr, key)
	runtime.KeepAlive(l)
	return uint64(res.version), newError(res.status, res.err, ctxKey)
}

// PolicyGet returns key's entry in the shared store as stored ("tier:pro"
// or "10/s, 1000/day"); ok is false when the store holds none. It reads
// the store (a Redis round trip).
func (l *Limiter) PolicyGet(key string) (entry string, ok bool, err error) {
	if l == nil {
		return "", false, errNil
	}
	var buf [512]byte
	res := C.ql_policy_get(l.ptr, key, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	runtime.KeepAlive(l)
	if res.status != C.LEASE_OK {
		return "", false, newError(res.status, res.err, ctxKey)
	}
	entry = string(buf[:res.needed-1])
	return entry, entry != "", nil
}

// RefreshPolicies checks the policy store (and file) now and applies what
// changed before returning; without it the limiter does so every
// PolicyRefreshMs.
func (l *Limiter) RefreshPolicies() error {
	if l == nil {
		return errNil
	}
	r := C.ql_refresh_policies(l.ptr)
	runtime.KeepAlive(l)
	return newError(r.status, r.err, ctxKey)
}

// Policy returns the rules key is held to on a call naming tier ("": none)
// and why. It reads what this limiter knows (no call to the store).
// Errors: KindInvalidKey, KindConfig (an unknown tier), KindClosed.
func (l *Limiter) Policy(key, tier string) (Policy, error) {
	if l == nil {
		return Policy{}, errNil
	}
	var buf [512]byte
	res := C.ql_policy_describe(l.ptr, key, tier, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	runtime.KeepAlive(l)
	if res.status != C.LEASE_OK {
		return Policy{}, newError(res.status, res.err, ctxKey)
	}
	return policyOf(string(buf[:res.needed-1])), nil
}
