#!/usr/bin/env bash
# quotalease against per-request Redis limiting, from Rust: lease mode vs exact
# mode vs a per-request GCRA Lua script (cli/src/gcra.rs), side by side in one
# run against one redis-server, on one hot key and on a Zipf spread of keys.
# Writes docs/peers.svg (and docs/peers.png when rsvg-convert is there) and the
# block between the peers-bench markers of docs/benchmarks.md (nothing else).
# THREADS, DURATION and KEYS override the defaults (4, 5s, 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-4}
DURATION=${DURATION:-5s}
KEYS=${KEYS:-1000}
DOC=docs/benchmarks.md
BIN=./target/release/quotalease

bash scripts/ensure-redis.sh
cargo build -q --release -p quotalease-cli

# This script's own harness index, so no other suite's stop-all touches the server.
export QUOTALEASE_HARNESS_STATE="${TMPDIR:-/tmp}/quotalease-bench-peers.$$"
port=$(tests/harness/redisctl start)
cleanup() {
  tests/harness/redisctl stop "$port" || true
  rm -rf "$QUOTALEASE_HARNESS_STATE"
}
trap cleanup EXIT

common=(--threads "$THREADS" --duration "$DURATION" --keys "$KEYS" --dist hot,zipf --lease-size 20)
main_cmd="$BIN bench --redis redis://127.0.0.1:\$PORT ${common[*]} --chart docs/peers.svg --markdown"
ceil_cmd="$BIN bench --redis redis://127.0.0.1:\$PORT ${common[*]} --refill-threshold 1 --markdown"

echo "bench-peers: $main_cmd" >&2
main=$("$BIN" bench --redis "redis://127.0.0.1:$port" "${common[@]}" --chart docs/peers.svg --markdown)
echo "bench-peers: $ceil_cmd" >&2
ceil=$("$BIN" bench --redis "redis://127.0.0.1:$port" "${common[@]}" --refill-threshold 1 --markdown)
if command -v rsvg-convert >/dev/null; then
  rsvg-convert -o docs/peers.png docs/peers.svg
else
  echo "bench-peers: rsvg-convert not found (apt-get install librsvg2-bin): docs/peers.png not updated" >&2
fi

redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "n/a")
block=$(cat <<EOF
<!-- peers-bench:start -->
## Against per-request Redis limiting (Rust)

The common way to rate-limit with Redis is one script call per request. The
contender here is a GCRA Lua script written for this comparison
([\`cli/src/gcra.rs\`](../cli/src/gcra.rs)): one \`EVALSHA\` per request, the key's
theoretical arrival time stored in Redis, \`TIME\` from Redis, emission interval =
window / limit, burst = limit (so it admits what quotalease's token bucket
admits, with no overshoot), reloaded on \`NOSCRIPT\`. Each of its threads has its own
synchronous connection. quotalease's exact mode is the other per-request design;
lease mode is the one under test. \`quotalease bench\` runs the three strategies one
after the other in one process against one redis-server, on the same offered load:
the same threads, each replaying the same key sequence (one hot key; Zipf s=1.1 over
$KEYS keys, seed 1), in a closed loop (a thread sends its next request when the last
is decided). The limit (1e9 per second) never binds, so admitted/s is the capacity of
each design. p50/p99 are timed around each decision. Redis commands come from
\`INFO commandstats\` deltas around each run: "script calls" are the round trips
(\`EVALSHA\`), "all commands" also counts what the scripts ran (lease and exact: \`TIME\`,
\`GET\`, \`SET\` with \`PX\`; gcra: \`TIME\`, \`GET\`, \`SET\`). The overshoot bound is
instances × lease_size for lease (one instance here) and 0 for exact and gcra.

Command: \`make bench-peers\` (= \`scripts/bench-peers.sh\`: starts a redis-server with
\`tests/harness/redisctl start\`, builds with \`cargo build --release -p quotalease-cli\`,
runs the commands below, stops the server). Measured $(date -u +%Y-%m-%d) on $(nproc) cores
(load average $load at the end, other work running), Redis $redis_version on the
same cores.

\`\`\`sh
$main_cmd
\`\`\`

$main

![quotalease lease vs exact vs per-request GCRA: admitted/s and Redis commands per admitted request](peers.svg)

**Reading the goals.** The issue asks for ≥ 20× fewer Redis commands per admitted
request than any per-request design at lease_size 20, and ≥ 10× their throughput.
A lease call brings at most lease_size tokens, so at lease_size 20 the first goal is
reached only when every call brings all 20. With the default refill_threshold
(lease_size / 4 = 5) a prefetch tops the lease up before it runs dry, so each call
brings lease_size − refill_threshold + 1 = 16 tokens: 16× fewer round trips. The
lease script runs the same commands inside as the GCRA script (\`TIME\`, \`GET\`, and
one \`SET\` that also sets the expiry), so counting every command gives the same 16×.
Prefetching only when the lease is nearly empty (\`--refill-threshold 1\`) brings the
full 20 tokens per call, at the cost of callers waiting for a lease more often. That
is the ceiling, 20×, less the tokens still leased when a run ends:

\`\`\`sh
$ceil_cmd
\`\`\`

$ceil

Throughput on the hot key is capped by lease round trips: one lease is in flight per
key at a time, each bringing at most lease_size tokens, so admitted/s ≈ tokens per
call / lease round-trip time, and that round trip varies with the load on this shared
machine. By Little's law a per-request design with C callers has at most C requests
in flight, so it admits ≈ C / round trip, while lease mode on one key has at most
lease_size tokens held or on their way (the overshoot bound): on one hot key the
ratio is about (tokens per call / C) × (per-request round trip / lease round trip),
16 / 4 = 4× at equal round trips with these 4 threads. The ≥ 10× goal on a single hot
key therefore needs lease_size ≥ 10 × callers, whatever the implementation. On the Zipf spread many keys lease in parallel. Larger leases (\`--lease-size 1000\`, see the CLI section) remove
the cap at the cost of a larger overshoot bound.
<!-- peers-bench:end -->
EOF
)

BLOCK="$block" python3 - "$DOC" <<'PY'
import os, pathlib, sys
doc = pathlib.Path(sys.argv[1])
start, end = "<!-- peers-bench:start -->", "<!-- peers-bench:end -->"
block = os.environ["BLOCK"].rstrip("\n") + "\n"
text = doc.read_text() if doc.exists() else "# Benchmarks\n\n"
if start in text and end in text:
    a, rest = text.split(start, 1)
    _, b = rest.split(end, 1)
    text = a + block + ("\n" + b.lstrip("\n") if b.strip() else "")
else:
    text = text.rstrip("\n") + "\n\n" + block
doc.write_text(text)
PY
echo "$main"
echo "$ceil"
echo "bench-peers: wrote docs/peers.svg, docs/peers.png and the peers-bench block of $DOC" >&2
