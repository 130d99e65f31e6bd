#!/usr/bin/env bash
# Release check for the npm package (not part of `make test`: it compiles the
# engine from scratch, several minutes): `npm pack` bindings/node, install the
# tarball into an empty project (no prebuilt binary: the install script builds
# the shipped Rust sources with cargo), and use it against a real Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
work=$(mktemp -d)
export TMPDIR=$work QUOTALEASE_HARNESS_STATE=$work/harness
port=""
cleanup() { [ -n "$port" ] && "$ROOT/tests/harness/redisctl" stop "$port" || true; rm -rf "$work"; }
trap cleanup EXIT
(cd bindings/node && npm pack --pack-destination "$work" --loglevel=error >&2)
tarball=$(ls "$work"/quotalease-*.tgz)
mkdir "$work/app"
cd "$work/app"
npm init -y >/dev/null
npm install "$tarball" --no-audit --no-fund --foreground-scripts >&2
port=$("$ROOT/tests/harness/redisctl" start)
cat > smoke.js <<JS
const assert = require('node:assert/strict')
const { Limiter } = require('quotalease')
const { rateLimit } = require('quotalease/express')
;(async () => {
  const l = new Limiter({ url: 'redis://127.0.0.1:$port', rate: '3/min' })
  const seen = []
  for (let i = 0; i < 4; i++) seen.push((await l.acquire('k')).allowed)
  assert.deepEqual(seen, [true, true, true, false])
  assert.equal(typeof rateLimit, 'function')
  await l.close()
  console.log('1 passed, 0 failed')
})()
JS
node smoke.js
