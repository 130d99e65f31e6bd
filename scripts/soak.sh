#!/usr/bin/env bash
# Soak (issue 13): the system test's workers in Rust, C, Go, Python and Node on
# one redis-server for SOAK_MINUTES (default 10), with faults on a schedule and
# every worker's RSS sampled (tests/soak/README.md). Not part of `make test`.
# Builds what it runs from this tree first: the Python wheel (.venv), the Node
# addon, and the Rust, C and Go workers.
# Usage: scripts/soak.sh [soak.py options, e.g. --minutes 30]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${SOAK_MINUTES:-10}
bash scripts/ensure-redis.sh
bash scripts/python-env.sh
(cd bindings/node && npm install --no-audit --no-fund --loglevel=error >&2)
bash scripts/build-system-workers.sh
# Its own harness index, so no other suite's stop-all touches its server.
export QUOTALEASE_HARNESS_STATE="${TMPDIR:-/tmp}/quotalease-soak"
echo "command: make soak SOAK_MINUTES=$minutes (scripts/soak.sh${*:+ $*}), $(date -u '+%F %H:%M UTC'), $(nproc) cores"
python3 tests/soak/soak.py --minutes "$minutes" "$@"
