#!/usr/bin/env python3
"""Turn criterion's estimates (target/criterion) and callgrind counts into the
Rust section of docs/benchmarks.md (between the rust-bench markers)."""
import json
import pathlib
import platform
import subprocess
import sys
import datetime

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRIT = ROOT / "target" / "criterion"
DOC = ROOT / "docs" / "benchmarks.md"
GROUPS = ["1_thread_warm_key", "2_threads_one_key", "2_threads_distinct_keys", "1_thread_100k_keys"]
WHO = ["quotalease", "governor", "mutex_hashmap"]
START, END = "<!-- rust-bench:start -->", "<!-- rust-bench:end -->"


def ns(group, who):
    p = CRIT / group / who / "new" / "estimates.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())["median"]["point_estimate"]


def main():
    instr = dict(kv.split("=") for kv in sys.argv[1].split()) if len(sys.argv) > 1 and sys.argv[1].strip() else {}
    lines = [
        START,
        "## Rust engine (admit path)",
        "",
        "Command: `make bench` (runs `scripts/bench-rust.sh`: `cargo bench -p quotalease --bench hot_path`,",
        "then callgrind on `core/examples/hot_loop.rs`). Median ns per admitted request, all contenders",
        "measured in the same run; wall-clock figures move with the machine's load, so read the ratios.",
        f"Run: {datetime.date.today()} on {platform.machine()}, `{subprocess.run(['rustc', '--version'], capture_output=True, text=True).stdout.strip()}`.",
        "",
        "| case | quotalease ns | governor ns | Mutex<HashMap> ns | quotalease / governor |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for g in GROUPS:
        v = [ns(g, w) for w in WHO]
        ratio = f"{v[0] / v[1]:.2f}" if v[0] and v[1] else "n/a"
        cells = [f"{x:.1f}" if x else "n/a" for x in v]
        lines.append(f"| {g} | {cells[0]} | {cells[1]} | {cells[2]} | {ratio} |")
    lines += [
        "",
        "(governor's column includes a lookup of the key's pre-built `String` in a `HashMap`: its",
        "`check_key` takes `&String`, and a caller holding a `&str` needs one; the interleaved",
        "rounds below and the instruction counts call it with the `String` directly.)",
    ]
    if instr:
        lines += [
            "",
            "Instructions per admitted request on a warm key (callgrind, difference of 200k and 100k",
            "iterations; repeatable whatever else the machine does):",
            "",
            "| quotalease | quotalease, tier named | quotalease, tier of two rules | governor | Mutex<HashMap> |",
            "| ---: | ---: | ---: | ---: | ---: |",
            f"| {instr.get('quotalease', 'n/a')} | {instr.get('quotalease-tier', 'n/a')} "
            f"| {instr.get('quotalease-2rules', 'n/a')} | {instr.get('governor', 'n/a')} | {instr.get('mutex', 'n/a')} |",
            "",
            "A tier named by the caller costs one lookup of the tier's id (a small map); a second rule",
            "one more bucket's compare-and-swap, reached through the key's entry (no second key lookup).",
        ]
    ahead = [g for g in GROUPS if ns(g, "quotalease") and ns(g, "governor") and ns(g, "quotalease") <= ns(g, "governor")]
    behind = [g for g in GROUPS if g not in ahead]
    lines += [
        "",
        f"In this run quotalease is at or below governor in {len(ahead)} of {len(GROUPS)} cases"
        + (f" (behind in: {', '.join(behind)})." if behind else "."),
        "",
        "Reading it: on a warm key the admit path is a map lookup and one compare-and-swap (no",
        "lock, no allocation, no syscall); the instruction count is the steady figure. The 100k-key",
        "working set is memory-bound for every contender on this VM (each lookup misses cache).",
        "quotalease's table (papaya) resizes in blocking mode: with papaya's default incremental",
        "resizing, a resize that no later insert finished left every lookup searching two tables,",
        "and this case measured 1.6 us per call (2.2x governor) before the change",
        "(`cargo bench -p quotalease --bench hot_path -- 1_thread_100k_keys`, 2026-11-30).",
    ]
    rounds = CRIT / "warm_key_rounds.txt"
    if rounds.exists():
        r, calls, qm, gm, qb, gb = rounds.read_text().split()
        ratio = float(qm) / float(gm)
        lines += [
            "",
            f"The warm key again, in {r} interleaved rounds of {int(calls):,} calls (the order alternating,",
            "so both contenders see the same machine; criterion's sequential figures above move",
            f"between runs): quotalease median {qm} ns (best {qb}), governor's `check_key` on a pre-built",
            f"`String` median {gm} ns (best {gb}): {ratio:.2f} x (issue 26's target: at most 0.4 x;",
            f"{'met' if ratio <= 0.4 else 'missed'} in this run).",
        ]
    ss = CRIT / "steady_state.txt"
    if ss.exists():
        admitted, calls, per = ss.read_text().split()
        lines += [
            "",
            f"Backend calls per admitted request at steady state (600/min key, lease_size 12,",
            f"refill_threshold 3, one request every 110 ms for 100 000 requests): **{per}**",
            f"({calls} calls for {admitted} admitted). A prefetch tops the lease up to lease_size,",
            "so each call brings lease_size − refill_threshold + 1 = 10 tokens: 1/10, against the",
            "issue's goal of 1/lease_size + 5 % = 0.0875. Topping up (rather than adding a whole",
            "lease) is what keeps every instance's holding ≤ lease_size, the overshoot bound.",
        ]
    lines.append(END)
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\n"
    block = "\n".join(lines) + "\n"
    if START in text and END in text:
        a, rest = text.split(START, 1)
        _, b = rest.split(END, 1)
        text = a + block + b.removeprefix("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    DOC.write_text(text)
    print(block)


if __name__ == "__main__":
    main()
