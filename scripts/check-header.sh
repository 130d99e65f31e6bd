#!/usr/bin/env bash
# Regenerate include/lease.h from ffi/src with the pinned cbindgen and fail
# when the committed header differs (a stale header). `--update` rewrites it.
# cbindgen is installed on first use into target/tools (project-local; under
# $CARGO_TARGET_DIR when that is set).
set -euo pipefail
cd "$(dirname "$0")/.."
CBINDGEN_VERSION=0.29.4
tools=${CARGO_TARGET_DIR:-target}/tools
bin=$tools/bin/cbindgen
if ! [ -x "$bin" ] || [ "$("$bin" --version 2>/dev/null)" != "cbindgen $CBINDGEN_VERSION" ]; then
  echo "installing cbindgen $CBINDGEN_VERSION into $tools (once)..." >&2
  cargo install cbindgen --version "=$CBINDGEN_VERSION" --locked --root "$tools" --quiet
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$bin" --quiet --config ffi/cbindgen.toml --crate quotalease-ffi --output "$tmp" ffi
if [ "${1:-}" = "--update" ]; then
  cp "$tmp" include/lease.h
  echo "include/lease.h regenerated (cbindgen $CBINDGEN_VERSION)"
  exit 0
fi
if ! diff -u include/lease.h "$tmp"; then
  echo "error: include/lease.h is stale: run scripts/check-header.sh --update and commit it" >&2
  exit 1
fi
echo "include/lease.h is up to date (cbindgen $CBINDGEN_VERSION)"
