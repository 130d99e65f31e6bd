package quotalease

/*
#include <stdint.h>
#include <lease.h>
// Defined in events_bridge.c (a file with //export may only declare).
extern lease_status qlSetEventHandle(const lease_limiter *l, uintptr_t handle);
*/
import "C"

import "runtime/cgo"

// EventKind is a backend transition.
type EventKind string

// The transitions.
const (
	EventDegraded  EventKind = "degraded"  // the backend failed: the failure policy is in force
	EventRecovered EventKind = "recovered" // the backend answers again: back to leasing
)

// Event is a backend transition with a message saying what happened and
// what the limiter does now. Transitions are also logged by the engine and
// counted in Metrics (FallbackTransitions, FallbackActive).
type Event struct {
	Kind    EventKind
	Message string
}

//export goLeaseEvent
func goLeaseEvent(handle C.uintptr_t, kind C.lease_event_kind, message *C.char) {
	// A panic must not unwind into liblease's broker thread.
	defer func() { _ = recover() }()
	f, ok := cgo.Handle(handle).Value().(func(Event))
	if !ok || f == nil {
		return
	}
	k := EventDegraded
	if kind == C.LEASE_EVENT_RECOVERED {
		k = EventRecovered
	}
	f(Event{Kind: k, Message: C.GoString(message)})
}

// setEventHandle registers (handle != 0) or removes (0) the callback. Once
// it returns, the previous callback is not running and will not run again.
func setEventHandle(l *C.lease_limiter, h cgo.Handle) {
	C.qlSetEventHandle(l, C.uintptr_t(h))
}
