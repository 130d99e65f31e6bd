#!/usr/bin/env bash
# `make bench-c-go`: acquire on a warm key from Rust, through the C ABI, from a
# real C program and from Go, in interleaved rounds of one run (min ns per
# call per contender), plus callgrind instruction counts (repeatable on a noisy
# machine) for Rust, the C ABI and the C program. Writes the "C and Go"
# section of docs/benchmarks.md. N=calls per round, ROUNDS=rounds.
# BASELINE=rev (`make bench-c-go BASELINE=rev`) also runs the C program and
# the Go package against liblease as it was at rev (built from a git worktree
# into target/baseline-build, so the main build is untouched), in the same
# rounds: the table gains two rows at rev, the before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
N=${N:-2000000}
ROUNDS=${ROUNDS:-7}
export GOTOOLCHAIN=local
prefix="$root/target/lease-prefix"
make -s install PREFIX="$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"

# Rust acquire and lease_acquire (through an opaque function pointer) in one process.
rs_bench=$(cargo bench -p quotalease-ffi --bench acquire --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "acquire":
        print(m["executable"])' | tail -n 1)
c_bench="$root/target/bench_acquire_c"
cc -O2 ffi/tests/c/bench_acquire.c $(pkg-config --cflags --libs lease) -o "$c_bench"
go_bench="$root/target/quotalease-go.test"
(cd bindings/go && go test -c -o "$go_bench" .)
go_base="" c_base=""
if [ -n "${BASELINE:-}" ]; then
  base_tree=$(mktemp -d)
  trap 'git worktree remove --force "$base_tree" >/dev/null 2>&1 || true' EXIT
  git worktree add --detach "$base_tree" "$BASELINE" >/dev/null
  base_prefix="$root/target/baseline-build/lease-prefix"
  (cd "$base_tree" && CARGO_TARGET_DIR="$root/target/baseline-build" make -s install PREFIX="$base_prefix")
  c_base="$root/target/bench_acquire_c_baseline"
  cc -O2 ffi/tests/c/bench_acquire.c $(PKG_CONFIG_PATH="$base_prefix/lib/pkgconfig" pkg-config --cflags --libs lease) \
    -o "$c_base"
  go_base="$root/target/quotalease-go-baseline.test"
  (cd "$base_tree/bindings/go" && PKG_CONFIG_PATH="$base_prefix/lib/pkgconfig" go test -c -o "$go_base" .)
fi

results="$root/target/bench-c-go.txt"
: > "$results"
for r in $(seq "$ROUNDS"); do
  "$rs_bench" "$N" 1 >> "$results"
  "$c_bench" "$N" 1 >> "$results"
  "$go_bench" -test.run '^$' -test.bench '^(BenchmarkAcquire|BenchmarkCgoNoop|BenchmarkAcquireParallel)$' \
    -test.benchtime "${N}x" | awk '/^Benchmark/{sub(/-[0-9]+$/, "", $1); print "go_" $1 "_ns=" $3}' >> "$results"
  if [ -n "$go_base" ]; then
    "$c_base" "$N" 1 | sed 's/^c_/cbase_/' >> "$results"
    "$go_base" -test.run '^$' -test.bench '^BenchmarkAcquire$' -test.benchtime "${N}x" |
      awk '/^Benchmark/{print "gobase_acquire_ns=" $3}' >> "$results"
  fi
  echo "round $r/$ROUNDS done" >&2
done

instr=""
if command -v valgrind >/dev/null; then
  count() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | awk '/Collected/{print $4}'; }
  for mode in rust-only ffi-only; do
    a=$(count "$rs_bench" "$mode" 100000); b=$(count "$rs_bench" "$mode" 200000)
    instr="$instr ${mode%-only}=$(( (b - a) / 100000 ))"
  done
  a=$(count "$c_bench" 100000 0); b=$(count "$c_bench" 200000 0)
  instr="$instr c=$(( (b - a) / 100000 ))"
else
  echo "valgrind not found: no instruction counts (apt-get install valgrind)" >&2
fi

python3 - "$results" "$instr" "$N" "$ROUNDS" "${BASELINE:-}" <<'PY'
import datetime, pathlib, platform, re, subprocess, sys
results, instr, n, rounds = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
baseline = sys.argv[5]
best = {}
for line in results.read_text().split():
    k, v = line.split("=")
    best[k] = min(best.get(k, float("inf")), float(v))
ins = dict(kv.split("=") for kv in instr.split()) if instr.strip() else {}
rust, ffi, c = best["rust_acquire_ns"], best["ffi_acquire_ns"], best["c_acquire_ns"]
go, noop = best["go_BenchmarkAcquire_ns"], best["go_BenchmarkCgoNoop_ns"]
gopar = best.get("go_BenchmarkAcquireParallel_ns")
gover = subprocess.run(["go", "version"], capture_output=True, text=True).stdout.strip()
rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
def i(k):
    return ins.get(k, "n/a")
lines = [
    "<!-- c-go-bench:start -->",
    "## C and Go",
    "",
    "Command: `make bench-c-go"+ (f" BASELINE={baseline}" if baseline else "") + "` (runs `scripts/bench-c-go.sh`; `N=` calls per round, `ROUNDS=`).",
    "`acquire` on a warm key (local tokens, no network) from each caller, in interleaved rounds",
    f"of one run ({rounds} rounds of {n} calls; the minimum per contender), then callgrind",
    "instruction counts per call, which do not move with the machine's load. Rust and",
    "`lease_acquire` through the C ABI run in one process (`ffi/benches/acquire.rs`, the C",
    "function called through an opaque pointer as a C caller would); the C program",
    "(`ffi/tests/c/bench_acquire.c`) and Go (`BenchmarkAcquire` in `bindings/go`) link the",
    "installed `liblease.so`.",
    f"Run: {datetime.date.today()} on {platform.machine()}, `{rustc}`, `{gover}`.",
    "",
    "| caller | ns per call | vs Rust | instructions per call |",
    "| --- | ---: | ---: | ---: |",
    f"| Rust `Limiter::acquire` | {rust:.1f} | — | {i('rust')} |",
    f"| C ABI `lease_acquire`, same process | {ffi:.1f} | {ffi - rust:+.1f} ns | {i('ffi')} |",
    f"| C program → `liblease.so` | {c:.1f} | {c - rust:+.1f} ns | {i('c')} |",
    f"| Go `Limiter.Acquire` (cgo) | {go:.1f} | {go - rust:+.1f} ns | — |",
    f"| Go: one empty cgo call | {noop:.1f} | | — |",
]
if baseline:
    cbase, gobase = best["cbase_acquire_ns"], best["gobase_acquire_ns"]
    lines.append(f"| C program → `liblease.so` at {baseline} | {cbase:.1f} | {cbase - rust:+.1f} ns | — |")
    lines.append(f"| Go `Limiter.Acquire` at {baseline} (and its liblease) | {gobase:.1f} | {gobase - rust:+.1f} ns | — |")
if gopar is not None:
    lines.append(f"| Go `Acquire`, `b.RunParallel` on 2 cores | {gopar:.1f} | | — |")
lines += [
    "",
    "Goals (issue 3): C within 5 ns of Rust, Go within 60 ns. The C ABI's own cost is the",
    "key check (a word-wise ASCII fast path; the general UTF-8 validator cost ~100",
    "instructions), the panic boundary and writing the decision; the C program adds the PLT",
    "and the shared library's thread-local accesses. Go pays one cgo transition (the empty",
    "call above) plus converting the decision (written on its stack). A batch call (several keys in one cgo",
    "transition) was measured and dropped: with its allocations and cgo's pointer checks,",
    "four keys in one `AcquireBatch` took about twice as long as four `Acquire` calls.",
    "<!-- c-go-bench:end -->",
]
doc = pathlib.Path("docs/benchmarks.md")
text = doc.read_text()
block = "\n".join(lines)
if "<!-- c-go-bench:start -->" in text:
    text = re.sub(r"<!-- c-go-bench:start -->.*?<!-- c-go-bench:end -->", lambda _: block, text, flags=re.S)
else:
    text = text.rstrip("\n") + "\n\n" + block + "\n"
doc.write_text(text)
print(block)
PY
