#!/usr/bin/env bash
# `make bench-python-baseline BASELINE=rev`: Python `acquire` on a warm key
# through the package as it was at rev and as it is now, side by side
# (bindings/python/bench/compare.py: alternating fresh interpreters). The
# extension at rev is built from a git worktree into target/baseline-build
# (the main build is untouched); each side's package (its .py files and
# `_native.abi3.so`) goes into target/python-baseline or target/python-now.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rev=${1:?usage: scripts/bench-python-baseline.sh REV}
bash scripts/python-env.sh >&2
tree=$(mktemp -d)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$tree" "$rev" >/dev/null
(cd "$tree" && CARGO_TARGET_DIR="$root/target/baseline-build" cargo build -p quotalease-python --release)
cargo build -p quotalease-python --release
for side in baseline now; do
  src=$root lib=$root/target/release/lib_native.so
  [ "$side" = baseline ] && src=$tree lib=$root/target/baseline-build/release/lib_native.so
  dst="$root/target/python-$side/quotalease"
  rm -rf "$dst"
  mkdir -p "$dst"
  cp "$src"/bindings/python/python/quotalease/*.py "$dst/"
  cp "$lib" "$dst/_native.abi3.so"
done
echo "command: make bench-python-baseline BASELINE=$rev ($(date -u +%F), at $(git rev-parse --short HEAD))"
"$root/.venv/bin/python" bindings/python/bench/compare.py "$root/target/python-baseline" "$root/target/python-now" "${ROUNDS:-9}"
