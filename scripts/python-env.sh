#!/usr/bin/env bash
# Set up the Python side on a fresh machine: .venv at the repo root (created
# if missing), maturin and the test/bench dependencies, then build the
# quotalease wheel from bindings/python (release, abi3) and install it.
# Needs python3 >= 3.11 and cargo. Starts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}

command -v cargo >/dev/null || {
  echo "error: cargo is needed to build the Python extension; install Rust from https://rustup.rs" >&2
  exit 1
}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: $PY is $("$PY" --version 2>&1); quotalease needs Python >= 3.11" >&2
  exit 1
}
if [ ! -x .venv/bin/python ]; then
  echo "python: creating .venv" >&2
  if ! "$PY" -m venv .venv; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      rm -rf .venv
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      "$PY" -m venv .venv
    else
      echo "error: '$PY -m venv' failed; install your distribution's python3-venv package" >&2
      exit 1
    fi
  fi
fi
VPY=$ROOT/.venv/bin/python
export PATH=$ROOT/.venv/bin:$PATH
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "python: installing maturin and the test dependencies into .venv" >&2
"$VPY" -m pip install -q -r bindings/python/requirements-dev.txt
echo "python: building and installing the quotalease wheel (cargo, release)" >&2
"$VPY" -m pip install -q --no-build-isolation --no-deps --force-reinstall ./bindings/python
