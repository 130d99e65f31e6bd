#!/usr/bin/env bash
# Every artifact carries the workspace's one version (scripts/versions.py lists
# the places): fails, naming each place that disagrees, when any does.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/versions.py check
