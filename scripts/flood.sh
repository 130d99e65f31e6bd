#!/usr/bin/env bash
# Key flood (issue 13): 10 million distinct keys at full speed against
# max_keys = 100 000 on memory://, then a shorter run against a real
# redis-server (FLOOD_REDIS_SECONDS, default 150), each sampling RSS and
# keys_tracked and timing one warm key before, during and after the flood
# (core/examples/key_flood.rs). Not part of `make test`.
# Usage: scripts/flood.sh [key_flood options for the memory:// run]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FLOOD_REDIS_SECONDS:-150}
cargo build -q --release -p quotalease --example key_flood
echo "command: make flood (scripts/flood.sh${*:+ $*}), $(date -u '+%F %H:%M UTC'), $(nproc) cores"
status=0
echo "== memory://"
target/release/examples/key_flood "$@" || status=1
bash scripts/ensure-redis.sh
export QUOTALEASE_HARNESS_STATE="${TMPDIR:-/tmp}/quotalease-flood"
port=$(tests/harness/redisctl start)
trap 'tests/harness/redisctl stop "$port" >/dev/null 2>&1 || true' EXIT
echo "== redis (a real redis-server on 127.0.0.1, at most $secs s)"
target/release/examples/key_flood --url "redis://127.0.0.1:$port" --seconds "$secs" || status=1
echo "redis-server after the flood: $(redis-cli -p "$port" dbsize) keys, $(redis-cli -p "$port" info memory | grep -E '^used_memory_human' | tr -d '\r')"
exit $status
