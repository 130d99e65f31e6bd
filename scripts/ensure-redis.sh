#!/usr/bin/env bash
# Make sure redis-server and redis-cli are on PATH (Debian's package), for the
# test harness tests/harness/redisctl. Installs them when missing and we can.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  exit 0
fi
echo "redis-server is missing: installing Debian's redis-server package..." >&2
if [ "$(id -u)" = 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  echo "error: redis-server is not installed and this user cannot install packages." >&2
  echo "       Install it with:  sudo apt-get install -y redis-server   (Debian/Ubuntu)" >&2
  echo "       or:               brew install redis                    (macOS)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "error: no apt-get here; install redis-server (>= 6.2) with your package manager." >&2
  exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
# The package starts a system service on 6379; the tests start their own servers.
command -v redis-server >/dev/null || { echo "error: redis-server still missing after install" >&2; exit 1; }
