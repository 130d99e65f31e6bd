// Package quotalease is the Go binding of quotalease, a distributed rate
// limiter whose limit holds across every instance of a service: each process
// keeps a local lease of tokens per key and admits requests from it with no
// network call, while a broker borrows chunks of tokens from one
// authoritative token bucket per key in Redis.
//
// The package is a thin cgo layer over liblease (the C ABI, include/lease.h):
// the semantics are the Rust engine's, identical in every language.
//
// # Building
//
// The package finds liblease with pkg-config (#cgo pkg-config: lease). From
// the repository root:
//
//	make install PREFIX=$HOME/.local
//	export PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig
//	go test ./...   # in bindings/go
//
// lease.pc carries an rpath, so binaries find liblease.so at run time
// without LD_LIBRARY_PATH. For a liblease installed elsewhere, point
// PKG_CONFIG_PATH at the directory that holds its lease.pc.
//
// # Usage
//
//	cfg := quotalease.DefaultConfig()
//	cfg.URL = "redis://127.0.0.1:6379"
//	cfg.Limit = 600
//	cfg.WindowMs = 60_000
//	lim, err := quotalease.New(cfg)
//	if err != nil { ... }
//	defer lim.Close()
//	d, err := lim.Acquire("user:42")
//	if err == nil && !d.Allowed { /* 429 */ }
//
// New hands each Config field that is set to the engine by name, so option
// names, the rules between options and the error messages are the same as in
// every language. A field left at its zero value keeps the engine's default,
// except RefillThreshold, whose 0 disables prefetch (DefaultConfig sets it to
// Auto). Rate and Limit/WindowMs are alternatives: setting both is an error.
//
// A Limiter is safe for concurrent use by many goroutines.
package quotalease
