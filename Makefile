# quotalease — top-level tasks. `make demo` and `make test` are all a newcomer needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PREFIX ?= /usr/local
CARGO ?= cargo

.PHONY: help demo test test-parts test-rust lint fmt sweep bench bench-rust bench-baseline bench-adaptive bench-fleet redis install test-c test-go bench-c-go test-python bench-python test-node bench-node bench-node-baseline bench-ledger-cpu bench-python-baseline bench-peers soak flood loom dist test-dist check-compat bench-dist

help:
	@echo "make demo    - show the multi-instance problem and the leasing fix (no Redis needed)"
	@echo "make test    - every test in every language (installs redis-server, venv, npm packages)"
	@echo "make bench   - benchmarks, written to docs/benchmarks.md"
	@echo "make install PREFIX=... - liblease.so/.a, lease.h and lease.pc"
	@echo "make dist    - release artifacts into dist/ (wheel, sdist, npm tarballs, liblease archive, SHA256SUMS)"
	@echo "make test-dist - install dist/ with no Rust toolchain and take a lease from Redis in each language"
	@echo "make loom    - the loom model of a key's token / in-flight / retired protocol"
	@echo "make soak    - all five languages on one Redis for SOAK_MINUTES (10) with faults, memory sampled"
	@echo "make flood   - 10 million distinct keys against max_keys, memory and the warm key's hot path"

redis:
	@bash scripts/ensure-redis.sh

## The multi-instance problem and the leasing fix, side by side, in virtual
## time on the embedded authority (no Redis). Built without the Redis client
## (--no-default-features) in the dev profile, so a fresh clone's first build
## stays short; the simulation itself takes about a second.
demo:
	$(CARGO) run -q -p quotalease-cli --no-default-features --bin quotalease -- simulate

## Rust: formatting, lints (clippy and rustdoc), import circles, unit/property/integration
## tests and the vectors (with the doctests, among them the README's Rust quick start).
lint:
	# no import circle between the modules of core/src (CONTRIBUTING.md, "Layers in the core")
	python3 scripts/check-cycles.py
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	# the binding crates are not default members: linted by name
	$(CARGO) clippy -p quotalease-python -p quotalease-node --all-targets -- -D warnings
	# the build make demo runs (no Redis client)
	$(CARGO) clippy -p quotalease-cli --no-default-features -- -D warnings
	# rustdoc of every workspace library (broken intra-doc links, bad code blocks);
	# --lib: the CLI's binary is also named quotalease and would collide with the engine's docs
	# RUSTC_BOOTSTRAP=1 as in scripts/api-surface.py (rustdoc's JSON for the Rust API
	# snapshot, make check-compat): the same settings, so both reuse one build of the deps
	RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --lib

fmt:
	$(CARGO) fmt --all

## QUOTALEASE_REQUIRE_REDIS=1: a Redis test without a redis-server fails here
## (a plain `cargo test` skips it; CONTRIBUTING.md, "Tests with and without Redis").
test-rust: redis lint
	QUOTALEASE_REQUIRE_REDIS=1 $(CARGO) test

## The loom model of one key's token / in-flight / retired protocol
## (core/tests/loom_entry.rs), under every interleaving. Not part of `make test`:
## its own target directory (target/loom), about 3 minutes to build the first
## time, then 2 to 2.5 minutes of checking (scripts/loom.sh).
loom:
	CARGO="$(CARGO)" bash scripts/loom.sh

## C ABI: liblease.so/.a, include/lease.h and lease.pc into PREFIX (DESTDIR honoured).
install:
	PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" CARGO="$(CARGO)" bash scripts/install-c.sh

## C tests (plain and AddressSanitizer) and Go tests, each against an installed liblease.
test-c: redis
	bash scripts/test-c.sh

test-go: redis
	bash scripts/test-go.sh

bench-c-go:
	BASELINE=$(BASELINE) bash scripts/bench-c-go.sh

TEST_PARTS := test-rust test-c test-go test-python test-node check-compat test-system
test: $(TEST_PARTS)

## The parts of `make test`, one per line (.ci/run times each).
test-parts:
	@printf '%s\n' $(TEST_PARTS)

## Release (docs/release.md, RELEASING.md): every artifact into dist/, built
## once (zig-linked for glibc 2.17, stripped); then installed from dist/ with
## cargo and rustc off PATH and used against a real redis-server.
dist:
	CARGO="$(CARGO)" bash scripts/dist.sh

test-dist: redis
	bash scripts/test-dist.sh

## The shipped Python wheel and Node addon against the dev builds, in one run.
bench-dist: redis
	bash scripts/bench-dist.sh

## Compatibility: one version everywhere, the Python and Node API against
## tests/api/ snapshots, the C ABI against ffi/abi/ (abidiff).
check-compat:
	bash scripts/check-versions.sh
	bash scripts/check-api.sh
	CARGO="$(CARGO)" bash scripts/check-abi.sh

bench: bench-rust bench-baseline bench-adaptive bench-fleet bench-c-go bench-python bench-node bench-peers

## Adaptive against fixed leases on a real redis-server, side by side (issue 12's
## targets): a hot key, and 100 instances on one key at 0.8x and 1.5x the limit;
## then the ledger's Redis time per call with 10/100/1000 holders of one key and
## 200 zipf keys' false denials and loss detections, without and with a CPU hog
## (issue 22's targets).
bench-adaptive: redis
	bash scripts/bench-adaptive.sh

## Saturated fleets of several languages on one Redis key, fixed vs adaptive in one
## run (issue 12): 3 Python + 3 Node processes at 2x; FastAPI (gunicorn), Express
## (node:cluster) and Go net/http, 4 workers each, at 13x: about 2 minutes of load.
bench-fleet: redis
	bash scripts/bench-fleet.sh

## The hot path against a baseline revision, in one run (callgrind instruction
## counts), then the hot and the saturated key on Redis (ADAPTIVE_SECS per case,
## default 20): BASELINE=<rev> (default: the last tag, else HEAD~1).
bench-baseline: redis
	bash scripts/bench-baseline.sh $(BASELINE)

bench-rust:
	bash scripts/bench-rust.sh

## Every language on one Redis at once, with faults (tests/system/README.md).
## Runs after test-python and test-node, which build the venv and the addon.
test-system: redis
	bash scripts/build-system-workers.sh
	python3 tests/system/system_test.py --langs rust,c,go,python,node

## Soak (not part of `make test`): the system test's workers in all five languages
## on one Redis for SOAK_MINUTES (default 10) with faults on a schedule; passes when
## no worker's RSS grows 5 % after the warm-up, every ledger balances and every
## fault is recovered from (tests/soak/README.md, figures in docs/reliability.md).
soak: redis
	SOAK_MINUTES=$(or $(SOAK_MINUTES),10) bash scripts/soak.sh

## The ledger's random-schedule properties at many seeds, release build (not part of
## `make test`, which runs each at one fixed seed): SEEDS=first-last (1-20), WHICH=memory,
## redis or all. A failed seed's shrunk schedule stays in target/sweep/.
sweep:
	bash scripts/sweep.sh $(or $(SEEDS),1-20) $(or $(WHICH),memory)

## Key flood (not part of `make test`): 10 million distinct keys at full speed
## against max_keys 100 000 on memory://, then a shorter run on Redis.
flood: redis
	bash scripts/flood.sh

## Python: builds the wheel into .venv, stubtest, mypy, ruff, pytest (vectors, Redis,
## asyncio, threads, fork, gunicorn, middleware); bench: acquire vs limits, into docs/.
test-python: redis
	bash scripts/test-python.sh

bench-python: redis
	bash scripts/bench-python.sh --write-docs docs/benchmarks.md

## Node: npm install in bindings/node (builds the napi-rs addon), tsc on the bundled
## types, node --test (vectors, Redis, events, Express, cluster); bench: acquire vs
## rate-limiter-flexible, into docs/.
test-node: redis
	bash scripts/test-node.sh

bench-node: redis
	bash scripts/bench-node.sh --write-docs docs/benchmarks.md

## Python acquire now against the package at BASELINE=<rev>, side by side
bench-python-baseline:
	bash scripts/bench-python-baseline.sh $(BASELINE)

## Node acquireSync now against the package at BASELINE=<rev>, side by side
bench-node-baseline:
	bash scripts/bench-node-baseline.sh $(BASELINE)

## Instructions a real redis-server spends per ledger call (callgrind), ledger.lua at
## BASELINE and in the working tree: make bench-ledger-cpu BASELINE=rev (needs valgrind).
bench-ledger-cpu:
	bash scripts/bench-ledger-cpu.sh $(BASELINE)

## Rust against per-request Redis limiting: lease vs exact vs a GCRA Lua script,
## hot key and Zipf keys, one redis-server; docs/benchmarks.md, docs/peers.svg/png.
bench-peers: redis
	bash scripts/bench-peers.sh
