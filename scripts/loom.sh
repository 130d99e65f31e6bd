#!/usr/bin/env bash
# `make loom`: the loom model of one key's token / in-flight / retired protocol
# (core/tests/loom_entry.rs) under every interleaving. Not part of `make test`.
# --cfg loom changes the flags of every crate, so it builds into its own target
# directory (target/loom) and never invalidates the shared one: about 3 minutes
# the first time on a 2-core machine, then the model runs for 2 to 2.5 minutes
# (105 s and 150 s measured on a 2-core machine with other builds running).
# Extra arguments go to the test binary (e.g. a test name).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"
exec "${CARGO:-cargo}" test -p quotalease --release --no-default-features --test loom_entry -- "$@"
