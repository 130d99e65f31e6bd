#!/usr/bin/env bash
# Python tests: build the wheel into .venv, check the stubs (mypy stubtest),
# type-check and lint the package (and examples/), then pytest (which starts its own
# redis-servers through tests/harness/redisctl). Ends with pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
bash scripts/python-env.sh
VPY=$ROOT/.venv/bin/python
cd bindings/python
echo "python: mypy stubtest quotalease._native" >&2
# From another directory, so the installed package (with its extension) is checked.
(cd "${TMPDIR:-/tmp}" && "$VPY" -m mypy.stubtest quotalease._native)
"$VPY" -m mypy --strict python/quotalease build-backend/quotalease_build.py examples
"$VPY" -m ruff check python tests bench build-backend examples
"$VPY" -m ruff format --check python tests bench build-backend examples
exec "$VPY" -m pytest tests -q -p no:cacheprovider
