#!/usr/bin/env bash
# Python benchmark: quotalease acquire vs limits (memory and Redis storage)
# vs a pure-Python token bucket, side by side in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
bash scripts/python-env.sh
exec "$ROOT/.venv/bin/python" bindings/python/bench/bench_acquire.py "$@"
