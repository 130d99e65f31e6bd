#!/usr/bin/env bash
# `make bench-ledger-cpu BASELINE=rev`: instructions a real redis-server
# spends per ledger call (callgrind), for ledger.lua as it was at rev and as
# it is in the working tree, in one run. Repeatable where wall-clock
# microseconds per call are not (they move with the pace of calls and the
# machine's load: docs/benchmarks.md, "The ledger's cost per call").
#
# Each version runs in a redis-server of its own under callgrind: CALLS lease
# calls from 10 holders of one key (1000/s each on a 1000/s key: rates,
# chunks and reaping, the saturated mix), less the same server with the
# script loaded and no call. The tuning arguments are read from the one
# tuning table (core/src/ledger.rs TUNING), in the order `ledger::args`
# sends them. Then, for the working tree, the cost per call as one key's
# holders grow (issue 22: within 1.5x across 10, 100 and 1000 holders):
# each holder calls once a second on an explicit clock (the same calls
# whatever the machine's pace), ROUNDS seconds after as many of warm-up,
# less the warm-up alone. Needs valgrind, redis-server, redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/bench-ledger-cpu.sh REV}
calls=${CALLS:-500}
rounds=${ROUNDS:-3}
for tool in valgrind redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git show "$rev:core/src/authority/lua/ledger.lua" >"$work/base.lua"
cp core/src/authority/lua/ledger.lua "$work/now.lua"

# commit_ms .. saturation_pct, spent (0), debt_pay_pct, rate_start_pct; then
# chunk_ms (sent after low_seq)
{ read -r tuning; read -r chunk_ms; } < <(python3 - <<'PY'
import re
src = open("core/src/ledger.rs").read()
table = src[src.index("pub const TUNING: Tuning = Tuning {"):]
table = table[: table.index("};")]
v = {k: int(n.replace("_", "")) for k, n in re.findall(r"(\w+): ([\d_]+),", table)}
names = ["commit_ms", "fallback_ms", "learn_ms", "min_period_ms", "max_period_ms",
         "grant_tokens", "carry_ms", "rate_cap_pct", "saturation_pct"]
print(" ".join([str(v[n]) for n in names] + ["0", str(v["debt_pay_pct"]), str(v["rate_start_pct"])]))
print(v["chunk_ms"])
PY
)

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# a redis-server under callgrind with SCRIPT $1 loaded: sets port, pid, out, sha
serve() {
  port=$(free_port)
  out="$work/cg.$port"
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  sha=$(redis-cli -p "$port" script load "$(cat "$1")")
}

# stop the server `serve` started; print the instructions it ran
total() {
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",", "", $1); print $1}'
}

# instructions of one redis-server run: SCRIPT $1, N=$2 calls
run() {
  local script=$1 n=$2 port out pid sha per h
  serve "$script"
  per=$((n / 10))
  if [ "$n" -gt 0 ]; then
    for h in $(seq 1 10); do
      # op limit window now holder demand held want need single rate_now
      # carry_now used epoch version alive, then the tuning, spent,
      # debt_pay_pct, rate_start_pct, seq, applied, low, low_seq, chunk_ms,
      # kind (an older ledger.lua reads chunk_ms as the kind: a token bucket)
      redis-cli -p "$port" -r "$per" evalsha "$sha" 2 'b:{k}' 'b:{k}:x' \
        l 1000 1000 '' "$h" 1000000 0 40 1 0 0 0 0 0 0 0 $tuning 0 0 0 0 "$chunk_ms" '' >/dev/null
    done
  fi
  total
}

echo "command: make bench-ledger-cpu BASELINE=$rev ($(date -u +%F), at $(git rev-parse --short HEAD); CALLS=$calls; $(redis-server --version | awk '{print $3}'))"
printf '%-28s %12s\n' "ledger.lua" "instr/call"
for v in base now; do
  idle=$(run "$work/$v.lua" 0)
  busy=$(run "$work/$v.lua" "$calls")
  label=$v
  [ "$v" = base ] && label="at $rev"
  [ "$v" = now ] && label="working tree"
  printf '%-28s %12d\n' "$label" $(((busy - idle) / calls))
done

# instructions of one redis-server run: SCRIPT $1, N=$2 holders of one key,
# each calling once a second for R=$3 seconds of the script's clock
run_holders() {
  local script=$1 n=$2 r=$3 port out pid sha
  serve "$script"
  # (the call of the first bench above, on an explicit clock: one command a line)
  SHA=$sha N=$n R=$r TUNING="$tuning" CHUNK_MS=$chunk_ms python3 - >"$work/calls.$port" <<'PY'
import os
sha, n, r = os.environ["SHA"], int(os.environ["N"]), int(os.environ["R"])
tuning, chunk_ms = os.environ["TUNING"], os.environ["CHUNK_MS"]
for s in range(r):
    for i in range(n):
        now = 1_000_000 + s * 1000 + i * 1000 // n
        print(f'EVALSHA {sha} 2 b:{{k}} b:{{k}}:x l 1000 1000 {now} {i + 1} 1000000 0 40 1 0 0 0 0 0 0 0 '
              f'{tuning} 0 0 0 0 {chunk_ms} ""')
PY
  redis-cli -p "$port" <"$work/calls.$port" >/dev/null
  total
}

echo
echo "working tree, one key's holders each calling once a second ($rounds s measured after $rounds s of warm-up):"
printf '%-28s %12s %10s\n' "holders" "instr/call" "x 10"
first=0
for n in 10 100 1000; do
  idle=$(run_holders "$work/now.lua" "$n" "$rounds")
  busy=$(run_holders "$work/now.lua" "$n" $((2 * rounds)))
  per=$(((busy - idle) / (rounds * n)))
  [ "$first" -eq 0 ] && first=$per
  printf '%-28s %12d %9.2fx\n' "$n" "$per" "$(python3 -c "print($per / $first)")"
done
