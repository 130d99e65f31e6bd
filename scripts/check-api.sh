#!/usr/bin/env bash
# The public API of the Python package (its .py and .pyi modules), of the
# Node package (its .d.ts files) and of the Rust crate (rustdoc's JSON, built
# with RUSTC_BOOTSTRAP=1 by the stable toolchain) against the snapshots
# committed under tests/api/, so that an API change shows in review as a
# snapshot diff.
# scripts/api-surface.py prints the normalised surface (no bodies, docs or
# comments). `--update` rewrites the snapshots after an intended change.
set -euo pipefail
cd "$(dirname "$0")/.."
snapshots=(python:tests/api/python.pyi.snapshot node:tests/api/node.d.ts.snapshot rust:tests/api/rust.snapshot)
if [ "${1:-}" = "--update" ]; then
  mkdir -p tests/api
  for s in "${snapshots[@]}"; do
    python3 scripts/api-surface.py "${s%%:*}" >"${s#*:}"
    echo "api: ${s#*:} updated (commit it with the API change)"
  done
  exit 0
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
changed=0
for s in "${snapshots[@]}"; do
  lang=${s%%:*} file=${s#*:}
  python3 scripts/api-surface.py "$lang" >"$tmp"
  if [ ! -f "$file" ]; then
    echo "error: $file is missing" >&2
    changed=1
  elif ! diff -u --label "$file (committed)" --label "$lang API now" "$file" "$tmp"; then
    changed=1
  else
    echo "api: $lang matches $file"
  fi
done
if [ "$changed" != 0 ]; then
  echo "error: the public API differs from its snapshot (diff above)." >&2
  echo "  If the change is intended: scripts/check-api.sh --update and commit tests/api/ with it" >&2
  echo "  (a removed or changed signature breaks users: say so in CHANGELOG.md)." >&2
  exit 1
fi
