#!/usr/bin/env bash
# Node benchmarks, both with the same arguments:
# 1. bench/acquire.js: quotalease acquireSync / await acquire vs rate-limiter-flexible
#    (RateLimiterMemory, RateLimiterRedis over ioredis) on a warm key, side by side;
# 2. bench/peers.js: quotalease lease mode vs exact mode vs RateLimiterRedis under
#    the same closed-loop load against one redis-server (admitted/s, latency, Redis
#    commands per admitted request; target/bench/peers-node.json, docs/peers-node.svg).
# Builds the addon (npm install in bindings/node) first. Pass
# --write-docs docs/benchmarks.md to update the `## Node` section and the
# node-peers-bench block; peers.js also takes --concurrency N and --duration SECONDS.
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
node bench/acquire.js "${args[@]}"
exec node bench/peers.js "${args[@]}"
