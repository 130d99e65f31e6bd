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
# sends them. Needs valgrind, redis-server, redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/bench-ledger-cpu.sh REV}
calls=${CALLS:-500}
for tool in valgrind redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git show "$rev:core/src/authority/lua/ledger.lua" >"$work/base.lua"
cp core/src/authority/lua/ledger.lua "$work/now.lua"

# commit_ms .. saturation_pct, spent (0), debt_pay_pct, rate_start_pct
tuning=$(python3 - <<'PY'
import re
src = open("core/src/ledger.rs").read()
table = src[src.index("pub const TUNING: Tuning = Tuning {"):]
table = table[: table.index("};")]
v = {k: int(n.replace("_", "")) for k, n in re.findall(r"(\w+): ([\d_]+),", table)}
names = ["commit_ms", "fallback_ms", "learn_ms", "min_period_ms", "max_period_ms",
         "grant_tokens", "carry_ms", "rate_cap_pct", "saturation_pct"]
print(" ".join([str(v[n]) for n in names] + ["0", str(v["debt_pay_pct"]), str(v["rate_start_pct"])]))
PY
)

chunk_ms=$(python3 -c 'import re; s = open("core/src/ledger.rs").read(); print(re.search(r"\n    chunk_ms: ([\d_]+),", s).group(1).replace("_", ""))')

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# instructions of one redis-server run: SCRIPT $1, N=$2 calls
run() {
  local script=$1 n=$2 port out pid sha per h
  port=$(free_port)
  out="$work/cg.$port"
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  sha=$(redis-cli -p "$port" script load "$(cat "$script")")
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
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",", "", $1); print $1}'
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
