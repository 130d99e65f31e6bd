#!/usr/bin/env bash
# `make bench-node-baseline BASELINE=rev`: Node `acquireSync` on a warm key
# through the package as it was at rev and as it is now, side by side in one
# process (bindings/node/bench/compare.js). The addon at rev is built from a
# git worktree into target/baseline-build (the main build is untouched) and
# copied with the package's JS files into target/node-baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rev=${1:?usage: scripts/bench-node-baseline.sh REV}
tree=$(mktemp -d)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$tree" "$rev" >/dev/null
(cd "$tree" && CARGO_TARGET_DIR="$root/target/baseline-build" cargo build -p quotalease-node --release)
(cd bindings/node && npm install --no-audit --no-fund --loglevel=error >&2)
cargo build -p quotalease-node --release
base="$root/target/node-baseline" now="$root/target/node-now"
rm -rf "$base" "$now"
mkdir -p "$base" "$now"
cp "$tree"/bindings/node/*.js "$tree"/bindings/node/package.json "$base/"
cp "$root/target/baseline-build/release/libquotalease_node.so" "$base/quotalease.linux-x64-gnu.node"
cp bindings/node/*.js bindings/node/package.json "$now/"
cp "$root/target/release/libquotalease_node.so" "$now/quotalease.linux-x64-gnu.node"
echo "command: make bench-node-baseline BASELINE=$rev ($(date -u +%F), at $(git rev-parse --short HEAD))"
node bindings/node/bench/compare.js "$base" "$now" --rounds "${ROUNDS:-9}"
