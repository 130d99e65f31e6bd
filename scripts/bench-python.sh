#!/usr/bin/env bash
# Python benchmarks, each side by side in one run:
# - bench_acquire.py: quotalease acquire vs limits (memory and Redis storage)
#   vs a pure-Python token bucket, on a warm key (gets all the arguments);
# - bench_peers.py: quotalease lease and exact mode vs limits' Redis limiters
#   from 4 threads against one redis-server, hot key and Zipf keys (gets the
#   same --write-docs FILE, its own block of it; PEERS_ARGS adds options,
#   e.g. PEERS_ARGS="--duration 1").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
bash scripts/python-env.sh

args=("$@")
peers=()
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --write-docs) peers+=(--write-docs "${args[i + 1]:-}"); i=$((i + 1)) ;;
    --write-docs=*) peers+=("${args[i]}") ;;
  esac
done
read -r -a extra <<<"${PEERS_ARGS:-}"

"$ROOT/.venv/bin/python" bindings/python/bench/bench_acquire.py "$@"
exec "$ROOT/.venv/bin/python" bindings/python/bench/bench_peers.py ${peers[@]+"${peers[@]}"} ${extra[@]+"${extra[@]}"}
