#!/usr/bin/env bash
# Node tests: npm install in bindings/node (its install script builds the
# native addon from this working tree with napi-rs, release profile), check
# that the committed generated binding.js / binding.d.ts are current,
# type-check the bundled types with tsc, then `node --test` (which starts
# its own redis-servers through tests/harness/redisctl). Ends with the
# node test runner's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in node npm cargo; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required for the Node tests (Node >= 20, Rust)" >&2; exit 1; }
done
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "error: Node >= 20 is required (found $(node --version))" >&2
  exit 1
fi
bash scripts/ensure-redis.sh
cd bindings/node
echo "node: npm install (builds the addon)" >&2
npm install --no-audit --no-fund --loglevel=error >&2
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  if ! git diff --quiet -- binding.js binding.d.ts; then
    git --no-pager diff --stat -- binding.js binding.d.ts >&2
    echo "error: bindings/node/binding.js or binding.d.ts changed when rebuilt: commit the regenerated files" >&2
    exit 1
  fi
fi
echo "node: tsc -p test/tsconfig.json" >&2
npx --no-install tsc -p test/tsconfig.json
exec node --test test/*.test.js
