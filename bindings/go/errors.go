package quotalease

// #include "cshim.h"
import "C"

import (
	"fmt"
	"strings"
	"unsafe"
)

// Kind is the category of an Error, stable across languages (the names are
// the conformance vectors' error kinds).
type Kind int

const (
	// KindConfig: an invalid configuration value (the message names the option).
	KindConfig Kind = iota + 1
	// KindInvalidKey: the key is empty, longer than 512 bytes, or not valid UTF-8.
	KindInvalidKey
	// KindInvalidCost: the cost is 0 or larger than the key's limit.
	KindInvalidCost
	// KindClosed: the limiter was closed.
	KindClosed
	// KindBackend: the backend failed a call that must reach it (Flush, Close).
	KindBackend
	// KindInternal: a bug inside liblease or this package (please report it).
	KindInternal
	// KindMisconfigured: the backend is reachable but refuses the
	// configuration (wrong or missing password, a database it lacks, a
	// cluster URL at a standalone server, a port that does not speak Redis,
	// an ACL user without the scripts' permissions). Acquire (once local
	// tokens are spent) and Check return it while the backend answers so;
	// an outage is not an error.
	KindMisconfigured
	// KindReservation: a reservation cannot be settled so: it was settled
	// (or closed) already, it was denied (nothing was reserved), or the
	// actual cost is negative; or a permit cannot be released: it was
	// released (or closed) already, or it was denied (no permit was taken).
	KindReservation
)

// String returns "config", "invalid_key", "invalid_cost", "closed", "backend",
// "misconfigured", "reservation" or "internal".
func (k Kind) String() string {
	switch k {
	case KindConfig:
		return "config"
	case KindInvalidKey:
		return "invalid_key"
	case KindInvalidCost:
		return "invalid_cost"
	case KindClosed:
		return "closed"
	case KindBackend:
		return "backend"
	case KindInternal:
		return "internal"
	case KindMisconfigured:
		return "misconfigured"
	case KindReservation:
		return "reservation"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is every error this package returns. Match it with errors.Is against
// the sentinels (errors.Is(err, quotalease.ErrInvalidKey)) or errors.As to
// read Kind and Message.
type Error struct {
	// Kind is the category.
	Kind Kind
	// Message says what went wrong and what to fix.
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "quotalease: " + e.Kind.String()
	}
	return "quotalease: " + e.Message
}

// Is reports whether target is the sentinel of e's Kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Kind == e.Kind
}

// Sentinels for errors.Is.
var (
	ErrConfig      = &Error{Kind: KindConfig}
	ErrInvalidKey  = &Error{Kind: KindInvalidKey}
	ErrInvalidCost = &Error{Kind: KindInvalidCost}
	ErrClosed      = &Error{Kind: KindClosed}
	ErrBackend     = &Error{Kind: KindBackend}
	ErrInternal    = &Error{Kind: KindInternal}
	// ErrMisconfigured: errors.Is(err, ErrMisconfigured) after Acquire or
	// Check when the backend refuses the configuration.
	ErrMisconfigured = &Error{Kind: KindMisconfigured}
	// ErrReservation: errors.Is(err, ErrReservation) after Reservation.Settle
	// when it cannot settle (twice, a denied reservation, a negative actual),
	// and after Permit.Release when it cannot release (twice, a denied permit).
	ErrReservation = &Error{Kind: KindReservation}
)

// Where a status came from: LEASE_ERR_UTF8 is an invalid key for a key, and a
// configuration error for a configuration string.
type errContext int

const (
	ctxKey errContext = iota
	ctxConfig
)

// newError turns a liblease status and its message (malloc'd by the cgo
// wrapper, freed here) into an *Error.
func newError(status C.lease_status, msg *C.char, ctx errContext) error {
	text := ""
	if msg != nil {
		text = C.GoString(msg)
		C.free(unsafe.Pointer(msg))
	}
	if status == C.LEASE_OK {
		return nil
	}
	if text == "" {
		text = fmt.Sprintf("liblease status %d", int(status))
	}
	return &Error{Kind: kindOfStatus(int(status), ctx), Message: stripCFunction(text)}
}

// stripCFunction drops the C function liblease names first
// ("lease_limiter_new_from_options: invalid configuration: ..."): a Go
// caller called New, not the C ABI, and reads the engine's message as it
// reads in every other language.
func stripCFunction(text string) string {
	name, rest, ok := strings.Cut(text, ": ")
	if !ok || !strings.HasPrefix(name, "lease_") {
		return text
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return text
		}
	}
	return rest
}

// kindOfStatus is the Kind of a liblease status (TestKindsAreTheCABIs checks it
// against lease_error_kind_name for every status).
func kindOfStatus(status int, ctx errContext) Kind {
	kind := KindInternal
	switch status {
	case C.LEASE_ERR_CONFIG:
		kind = KindConfig
	case C.LEASE_ERR_INVALID_KEY:
		kind = KindInvalidKey
	case C.LEASE_ERR_INVALID_COST:
		kind = KindInvalidCost
	case C.LEASE_ERR_CLOSED:
		kind = KindClosed
	case C.LEASE_ERR_BACKEND:
		kind = KindBackend
	case C.LEASE_ERR_MISCONFIGURED:
		kind = KindMisconfigured
	case C.LEASE_ERR_RESERVATION:
		kind = KindReservation
	case C.LEASE_ERR_UTF8:
		kind = KindInvalidKey
		if ctx == ctxConfig {
			kind = KindConfig
		}
	}
	return kind
}

// cErrorKindName is the C ABI's (the engine's) name of the error kind a
// status reports, "" for none.
func cErrorKindName(status int) string {
	return C.GoString(C.lease_error_kind_name(C.uint32_t(status)))
}
