#!/usr/bin/env bash
# `make bench-fleet`: saturated fleets of several languages on one key of a real
# redis-server (started by the test harness), fixed leases against adaptive
# leasing in one run (bench/fleet/fleet.py): (a) 3 Python + 3 Node processes at
# 2x the limit; (b) FastAPI under gunicorn, Express under node:cluster and Go
# net/http, 4 workers each, at 13x; (c) 6 processes of equal demand at 2x a
# drained 600/min key; adaptive leasing of each again under a CPU hog. Builds what it runs: the Python venv and
# wheel (scripts/python-env.sh) plus uvicorn, the Node addon (npm install in
# bindings/node, which also brings express), and the Go server and load
# generator against an installed liblease. Writes its section of docs/benchmarks.md.
# Usage: scripts/bench-fleet.sh [seconds per case, default 20] [--no-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
secs=${1:-20}
docs=(--write-docs docs/benchmarks.md)
[ "${2:-}" = --no-docs ] && docs=()
export GOTOOLCHAIN=local CGO_ENABLED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

bash scripts/ensure-redis.sh
bash scripts/python-env.sh
echo "bench-fleet: uvicorn into .venv (the ASGI server of the FastAPI workers)" >&2
.venv/bin/python -m pip install -q 'uvicorn>=0.30' 'uvicorn-worker>=0.2' httptools uvloop
echo "bench-fleet: npm install in bindings/node (the addon, express)" >&2
(cd bindings/node && npm install --no-audit --no-fund --loglevel=error >&2)
prefix="$root/target/lease-prefix"
make -s install PREFIX="$prefix" >&2
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
mkdir -p target/bench-fleet
(cd bench/fleet/go && go build -o "$root/target/bench-fleet/fleetgo" .)

export QUOTALEASE_HARNESS_STATE="${TMPDIR:-/tmp}/quotalease-bench-fleet"
port=$(tests/harness/redisctl start)
trap 'tests/harness/redisctl stop "$port" >/dev/null 2>&1 || true' EXIT
python3 bench/fleet/fleet.py --redis-port "$port" --secs "$secs" --hog \
  --command "make bench-fleet (scripts/bench-fleet.sh $secs)" "${docs[@]}"
