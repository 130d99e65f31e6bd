package quotalease

// liblease is found with pkg-config (lease.pc from `make install`); the
// wrappers in cshim.h are compiled into this package.

// #cgo pkg-config: lease
// #cgo noescape ql_acquire_into
// #cgo nocallback ql_acquire_into
// #cgo noescape ql_acquire_tier_into
// #cgo nocallback ql_acquire_tier_into
// #include "cshim.h"
import "C"

// cgoNoop is one empty cgo call: the floor every cgo call pays, measured by
// BenchmarkCgoNoop next to BenchmarkAcquire.
func cgoNoop() { C.ql_noop() }
