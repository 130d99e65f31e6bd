# quotalease — top-level tasks. `make demo` and `make test` are all a newcomer needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PREFIX ?= /usr/local
CARGO ?= cargo

.PHONY: help demo test test-rust lint fmt bench redis

help:
	@echo "make demo    - show the multi-instance problem and the leasing fix (no Redis needed)"
	@echo "make test    - every test in every language (installs redis-server, venv, npm packages)"
	@echo "make bench   - benchmarks, written to docs/benchmarks.md"
	@echo "make install PREFIX=... - liblease.so/.a, lease.h and lease.pc"

redis:
	@bash scripts/ensure-redis.sh

## Rust: formatting, lints, unit/property/integration tests and the vectors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

test-rust: redis lint
	$(CARGO) test

test: test-rust

bench:
	$(CARGO) bench -p quotalease --bench hot_path
