#!/usr/bin/env bash
# `make bench-dist`: the shipped Python wheel and Node addon (from dist/,
# installed the way test-dist installs them) against the dev builds, side by
# side in one run on the same redis-server: the warm-key acquire of
# bindings/python/bench/bench_acquire.py and bindings/node/bench/acquire.js
# (leases large enough that the loop never waits for Redis).
#   Python  interleaved rounds, one process per side and round (two builds of
#           one module cannot share an interpreter), best round per side;
#   Node    both addons loaded into one process, interleaved rounds.
# Dev builds: .venv (scripts/python-env.sh) and bindings/node (npm install);
# DEV_VENV=dir / DEV_NODE=dir use others. ROUNDS (default 7).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
dist=$ROOT/dist
dev_venv=${DEV_VENV:-$ROOT/.venv}
dev_node=${DEV_NODE:-$ROOT/bindings/node}
rounds=${ROUNDS:-7}
[ -f "$dist/SHA256SUMS" ] || { echo "error: no dist/: run make dist first" >&2; exit 1; }
[ -x "$dev_venv/bin/python" ] || { echo "error: no dev venv at $dev_venv (make test-python builds it)" >&2; exit 1; }
ls "$dev_node"/quotalease.*.node >/dev/null 2>&1 || { echo "error: no dev addon in $dev_node (npm install there builds it)" >&2; exit 1; }
version=$(python3 scripts/versions.py check | sed -n 's/^versions: [0-9]* places agree on //p')

work=$(mktemp -d "${TMPDIR:-/tmp}/quotalease-bench-dist.XXXXXX")
export QUOTALEASE_HARNESS_STATE=$work/harness
cleanup() { "$ROOT/tests/harness/redisctl" stop-all >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  "$dist/quotalease-$version-cp311-abi3-manylinux_2_17_x86_64.whl"
mkdir "$work/app"
(cd "$work/app" && npm init -y >/dev/null && npm install --offline --no-audit --no-fund --loglevel=error \
  --cache "$work/npm-cache" "$dist/quotalease-linux-x64-gnu-$version.tgz" "$dist/quotalease-$version.tgz" >/dev/null)

port=$("$ROOT/tests/harness/redisctl" start)
url="redis://127.0.0.1:$port"

cat >"$work/py_child.py" <<'PY'
import gc, json, sys, time
import quotalease
url, prefix = sys.argv[1], sys.argv[2]
big, window = 1_000_000_000, 1_000_000
cases = {
    "memory://, lease_size=10000": quotalease.Limiter("memory://", limit=big, window_ms=window, lease_size=10_000),
    "Redis, lease_size=10000": quotalease.Limiter(url, limit=big, window_ms=window, lease_size=10_000, key_prefix=prefix),
}
out = {"file": quotalease._native.__file__}
for name, lim in cases.items():
    for _ in range(2000):
        lim.acquire("user:42")
    n, best = 1_000_000, float("inf")
    for _ in range(2):
        gc.disable()
        t = time.perf_counter_ns()
        for _ in range(n):
            lim.acquire("user:42")
        best = min(best, (time.perf_counter_ns() - t) / n)
        gc.enable()
    out[name] = best
    lim.close()
print(json.dumps(out))
PY

echo "bench-dist: Python, $rounds interleaved rounds (dev: $dev_venv, shipped: the wheel in a fresh venv)" >&2
python3 - "$rounds" "$url" "$dev_venv/bin/python" "$work/venv/bin/python" "$work/py_child.py" >"$work/py.md" <<'PY'
import json, subprocess, sys
rounds, url, dev, shipped, child = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
best = {"dev": {}, "shipped": {}}
files = {}
for r in range(rounds):
    for side, py in (("dev", dev), ("shipped", shipped)):
        out = json.loads(subprocess.run([py, child, url, f"bd-{side}"], check=True, capture_output=True, text=True, cwd="/").stdout)
        files[side] = out.pop("file")
        for k, v in out.items():
            best[side][k] = min(best[side].get(k, float("inf")), v)
print("| Python `acquire` on a warm key | dev build, ns | shipped wheel, ns | shipped / dev |")
print("| --- | ---: | ---: | ---: |")
for k in best["dev"]:
    d, s = best["dev"][k], best["shipped"][k]
    print(f"| {k} | {d:.0f} | {s:.0f} | {s / d:.2f} |")
print()
for side in ("dev", "shipped"):
    print(f"- {side}: `{files[side]}`")
PY

echo "bench-dist: Node, $rounds interleaved rounds in one process" >&2
node - "$rounds" "$url" "$dev_node" "$work/app/node_modules/quotalease" >"$work/node.md" <<'JS'
const [rounds, url, devDir, shippedDir] = [Number(process.argv[2]), ...process.argv.slice(3)]
const sides = { dev: require(devDir), shipped: require(shippedDir) }
const addonOf = {
  dev: require('node:fs').readdirSync(devDir).filter((f) => f.endsWith('.node')).map((f) => `${devDir}/${f}`)[0],
  shipped: require.resolve('quotalease-linux-x64-gnu', { paths: [shippedDir] }),
}
const big = { limit: 1e9, windowMs: 1000, leaseSize: 1e6 }
;(async () => {
  const cases = []
  for (const [side, { Limiter }] of Object.entries(sides)) {
    const redis = new Limiter({ url, keyPrefix: `bd-node-${side}`, ...big })
    const mem = new Limiter({ ...big })
    for (const l of [redis, mem]) await l.acquire('user:42')
    cases.push({ side, name: '`acquireSync`, Redis, leaseSize 1e6', n: 1e6, sync: () => redis.acquireSync('user:42'), lim: redis })
    cases.push({ side, name: '`await acquire`, Redis, leaseSize 1e6', n: 2e5, run: () => redis.acquire('user:42') })
    cases.push({ side, name: '`acquireSync`, memory://, leaseSize 1e6', n: 1e6, sync: () => mem.acquireSync('user:42'), lim: mem })
  }
  for (const c of cases) c.best = Infinity
  for (let r = 0; r < rounds; r++) {
    for (const c of cases) {
      const t0 = process.hrtime.bigint()
      if (c.sync) { const f = c.sync; for (let i = 0; i < c.n; i++) f() } else { const f = c.run; for (let i = 0; i < c.n; i++) await f() }
      c.best = Math.min(c.best, Number(process.hrtime.bigint() - t0) / c.n)
    }
  }
  console.log('| Node on a warm key | dev build, ns | shipped package, ns | shipped / dev |')
  console.log('| --- | ---: | ---: | ---: |')
  for (const c of cases.filter((c) => c.side === 'dev')) {
    const s = cases.find((x) => x.side === 'shipped' && x.name === c.name)
    console.log(`| ${c.name} | ${c.best.toFixed(1)} | ${s.best.toFixed(1)} | ${(s.best / c.best).toFixed(2)} |`)
  }
  console.log('')
  for (const side of ['dev', 'shipped']) console.log(`- ${side}: \`${addonOf[side]}\``)
  for (const c of cases) if (c.lim) await c.lim.close()
})().catch((e) => { console.error(e); process.exit(1) })
JS
# Instructions per warm acquire on memory:// (callgrind; two call counts far
# apart, differenced, so start-up and warm-up cancel; PYTHONHASHSEED fixed):
# not moved by the load. Start-up still varies by a few million instructions
# between runs, so these carry about +-10 instructions per call.
cat >"$work/py_instr.py" <<'PY'
import sys
import quotalease
n = int(sys.argv[1])
lim = quotalease.Limiter("memory://", limit=1_000_000_000, window_ms=1_000_000, lease_size=10_000)
for _ in range(2000):
    lim.acquire("user:42")
for _ in range(n):
    lim.acquire("user:42")
lim.close()
PY
cat >"$work/node_instr.js" <<'JS'
const { Limiter } = require(process.argv[2])
const n = Number(process.argv[3])
const lim = new Limiter({ limit: 1e9, windowMs: 1000, leaseSize: 1e6 })
for (let i = 0; i < 20000; i++) lim.acquireSync('user:42')
for (let i = 0; i < n; i++) lim.acquireSync('user:42')
lim.close().then(() => process.exit(0))
JS
instr() { # n1 n2, then the command with N for the call count: instructions per call between n1 and n2
  local n1=$1 n2=$2 total=() k
  shift 2
  for k in "$n1" "$n2"; do
    total+=("$(PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null "${@/#N/$k}" 2>&1 >/dev/null |
      sed -n 's/.*Collected : \([0-9]*\).*/\1/p' | tail -n 1)")
  done
  python3 -c "import sys; a, b, n = map(int, sys.argv[1:]); print(f'{(b - a) / n:.0f}')" "${total[0]}" "${total[1]}" "$((n2 - n1))"
}
if command -v valgrind >/dev/null; then
  echo "bench-dist: instruction counts (callgrind)" >&2
  {
    echo "| instructions per warm \`acquire\`, memory:// (callgrind) | dev build | shipped | shipped / dev |"
    echo "| --- | ---: | ---: | ---: |"
    d=$(instr 100000 500000 "$dev_venv/bin/python" "$work/py_instr.py" N)
    s=$(instr 100000 500000 "$work/venv/bin/python" "$work/py_instr.py" N)
    echo "| Python \`acquire\` | $d | $s | $(python3 -c "print(f'{$s / $d:.3f}')") |"
    d=$(instr 200000 1000000 node "$work/node_instr.js" "$dev_node" N)
    s=$(instr 200000 1000000 node "$work/node_instr.js" "$work/app/node_modules/quotalease" N)
    echo "| Node \`acquireSync\` | $d | $s | $(python3 -c "print(f'{$s / $d:.3f}')") |"
  } >"$work/instr.md"
else
  echo "valgrind not found: no instruction counts (apt-get install valgrind)" >"$work/instr.md"
fi
cat "$work/py.md"
echo
cat "$work/node.md"
echo
cat "$work/instr.md"
echo
echo "(load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); $rounds rounds, best round per side)"
