#!/usr/bin/env bash
# Node benchmark: quotalease acquireSync / await acquire vs rate-limiter-flexible
# (RateLimiterMemory, RateLimiterRedis over ioredis) side by side in one run.
# Builds the addon (npm install in bindings/node) first. Pass
# --write-docs docs/benchmarks.md to update the `## Node` section.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
bash scripts/ensure-redis.sh
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --write-docs) args+=("$1" "$ROOT/$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
cd bindings/node
npm install --no-audit --no-fund --loglevel=error >&2
exec node bench/acquire.js "${args[@]}"
