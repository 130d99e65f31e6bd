#!/usr/bin/env bash
# Adaptive leasing against fixed leases on a real redis-server started by the
# test harness, side by side in one run (core/examples/adaptive_bench.rs); then
# the ledger's Redis cost per call and its health, six instances at 0.8x, a
# burst on a full bucket and a Redis restarted empty under 10x load (issue 22),
# each case without and with a CPU hog (a busy thread per core) in one run,
# side by side.
# Usage: scripts/bench-adaptive.sh [seconds per case, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
export QUOTALEASE_HARNESS_STATE="${TMPDIR:-/tmp}/quotalease-bench-adaptive"
port=$(tests/harness/redisctl start)
trap 'tests/harness/redisctl stop "$port" >/dev/null 2>&1 || true' EXIT
cargo build -q --release -p quotalease --example adaptive_bench
echo "command: make bench-adaptive (scripts/bench-adaptive.sh $secs), $(date -u +%F)"
bench=${CARGO_TARGET_DIR:-target}/release/examples/adaptive_bench
"$bench" "redis://127.0.0.1:$port" "$secs" hot fleet
"$bench" "redis://127.0.0.1:$port" "$secs" holders zipf six burst restart --hog-compare
