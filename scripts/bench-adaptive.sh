#!/usr/bin/env bash
# Adaptive leasing against fixed leases on a real redis-server started by the
# test harness, side by side in one run (core/examples/adaptive_bench.rs).
# Usage: scripts/bench-adaptive.sh [seconds per case, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
export QUOTALEASE_HARNESS_STATE="${TMPDIR:-/tmp}/quotalease-bench-adaptive"
port=$(tests/harness/redisctl start)
trap 'tests/harness/redisctl stop "$port" >/dev/null 2>&1 || true' EXIT
cargo build -q --release -p quotalease --example adaptive_bench
echo "command: make bench-adaptive (scripts/bench-adaptive.sh $secs), $(date -u +%F)"
target/release/examples/adaptive_bench "redis://127.0.0.1:$port" "$secs"
