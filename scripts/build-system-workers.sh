#!/usr/bin/env bash
# Build the cross-language system test's workers (tests/system/README.md):
# Rust (an example of the core), C and Go (against an installed liblease),
# Python (the venv of scripts/test-python.sh) and Node (bindings/node).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=tests/system/workers/build
mkdir -p "$out"

# Release, as services run it (make install below builds the same dependencies).
cargo build -q --release -p quotalease --example system_worker

prefix="$root/target/system-prefix"
make -s install PREFIX="$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -O2 -Wall -Wextra -o "$out/worker_c" tests/system/workers/worker.c ffi/tests/c/json.c \
  -Iffi/tests/c $(pkg-config --cflags --libs lease) -Wl,-rpath,"$prefix/lib"

if [ -d tests/system/workers/go ]; then
  (cd tests/system/workers/go && CGO_CFLAGS="$(pkg-config --cflags lease)" \
    CGO_LDFLAGS="$(pkg-config --libs lease) -Wl,-rpath,$prefix/lib" go build -o "$root/$out/worker_go" .)
fi
