#!/usr/bin/env bash
# Before/after against a baseline revision, in one run: instructions per
# warm acquire (one key, and a 100 000-key working set) counted by callgrind
# (repeatable on a noisy machine), then on one real redis-server the hot key
# (memory:// against Redis, calls per admitted) and the saturated key (100
# instances at 1.5x the limit, adaptive: Redis calls per admitted) of
# core/examples/adaptive_bench.rs, baseline and this checkout one after the
# other. The baseline is built from a git worktree with this checkout's
# examples/hot_loop.rs.
# Usage: scripts/bench-baseline.sh [REV]   (default: the last tag, else HEAD~1)
#   ADAPTIVE_SECS=N  seconds per adaptive case (default 20; 0 skips them)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-$(git describe --tags --abbrev=0 2>/dev/null || git rev-parse HEAD~1)}
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 1; }
base=target/baseline
rm -rf "$base/src"; git worktree prune
git worktree add -q --detach "$base/src" "$rev"
trap 'git worktree remove --force "$base/src" >/dev/null 2>&1 || true' EXIT
cp core/examples/hot_loop.rs "$base/src/core/examples/hot_loop.rs"
if ! (cd "$base/src" && CARGO_TARGET_DIR="$PWD/../target" cargo build -q --release -p quotalease --example hot_loop 2>/dev/null); then
  # This checkout's loop uses API the baseline lacks (acquire_with, tiers):
  # the baseline's own loop measures the same two cases.
  echo "baseline: this checkout's hot_loop.rs does not build there; using the baseline's own" >&2
  git -C "$base/src" checkout -q -- core/examples/hot_loop.rs
  (cd "$base/src" && CARGO_TARGET_DIR="$PWD/../target" cargo build -q --release -p quotalease --example hot_loop)
fi
cargo build -q --release -p quotalease --example hot_loop
per_call() { # binary mode -> instructions per acquire
  a=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$2" 100000 2>&1 | awk '/Collected/{print $4}')
  b=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" "$2" 200000 2>&1 | awk '/Collected/{print $4}')
  echo $(( (b - a) / 100000 ))
}
echo "instructions per warm acquire (callgrind), baseline $(git rev-parse --short "$rev") vs $(git rev-parse --short HEAD)"
printf '%-18s %10s %10s\n' case baseline now
for mode in quotalease quotalease-100k; do
  printf '%-18s %10s %10s\n' "$mode" "$(per_call "$base/target/release/examples/hot_loop" $mode)" \
    "$(per_call target/release/examples/hot_loop $mode)"
done

secs=${ADAPTIVE_SECS:-20}
[ "$secs" = 0 ] && exit 0
(cd "$base/src" && CARGO_TARGET_DIR="$PWD/../target" cargo build -q --release -p quotalease --example adaptive_bench)
cargo build -q --release -p quotalease --example adaptive_bench
export QUOTALEASE_HARNESS_STATE="${TMPDIR:-/tmp}/quotalease-bench-baseline"
port=$(tests/harness/redisctl start)
trap 'tests/harness/redisctl stop "$port" >/dev/null 2>&1 || true; git worktree remove --force "$base/src" >/dev/null 2>&1 || true' EXIT
for side in baseline now; do
  bin=target/release/examples/adaptive_bench
  [ "$side" = baseline ] && bin=$base/target/release/examples/adaptive_bench
  echo
  echo "### $side ($([ "$side" = baseline ] && git rev-parse --short "$rev" || git rev-parse --short HEAD)), $secs s per case, one redis-server"
  "$bin" "redis://127.0.0.1:$port" "$secs" hot
  "$bin" "redis://127.0.0.1:$port" "$secs" fleet 1.5 adaptive
done
