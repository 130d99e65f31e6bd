#!/usr/bin/env bash
# Rust engine benchmarks: criterion (wall time, side by side with governor and
# a Mutex<HashMap>) and callgrind instruction counts (repeatable on a noisy
# machine), written into docs/benchmarks.md between the rust-bench markers.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -p quotalease --bench hot_path -- --noplot 2>&1 | tee target/bench-rust.log
instr=""
if command -v valgrind >/dev/null; then
  cargo build -q --release -p quotalease --example hot_loop
  for w in quotalease quotalease-tier quotalease-2rules governor mutex; do
    a=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/hot_loop "$w" 100000 2>&1 | awk '/Collected/{print $4}')
    b=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/hot_loop "$w" 200000 2>&1 | awk '/Collected/{print $4}')
    instr="$instr $w=$(( (b - a) / 100000 ))"
  done
else
  echo "valgrind not found: skipping instruction counts (apt-get install valgrind)" >&2
fi
python3 scripts/bench-report.py "$instr"
