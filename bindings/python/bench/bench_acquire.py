"""acquire() on a warm key from Python, side by side in one run:

* quotalease (memory:// and Redis: the same hot path, a local lease),
* the `limits` library (MemoryStorage, and RedisStorage against the same
  redis-server, started by tests/harness/redisctl),
* a pure-Python token bucket (a dict and time.monotonic()).

Each figure is the best of several repeats of a timed loop (wall clock,
ns per call, loop overhead included). Prints a table with ratios; with
--write-docs FILE it also replaces the `## Python` section's figures there.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REDISCTL = ROOT / "tests" / "harness" / "redisctl"
START = "<!-- python-bench:start -->"
END = "<!-- python-bench:end -->"
COMMAND = "make bench-python   # = scripts/bench-python.sh → bindings/python/bench/bench_acquire.py"


def timed(fn: Callable[[str], object], n: int, repeats: int) -> float:
    """Best ns/call over `repeats` loops of n calls."""
    best = float("inf")
    for _ in range(repeats):
        gc.disable()
        t = time.perf_counter_ns()
        for _ in range(n):
            fn("user:42")
        dt = time.perf_counter_ns() - t
        gc.enable()
        best = min(best, dt / n)
    return best


class TokenBucket:
    """The usual pure-Python token bucket: one dict entry per key."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.capacity = float(limit)
        self.rate = limit / window_s
        self.state: dict[str, tuple[float, float]] = {}

    def acquire(self, key: str, cost: int = 1) -> bool:
        now = time.monotonic()
        tokens, last = self.state.get(key, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - last) * self.rate)
        if tokens >= cost:
            self.state[key] = (tokens - cost, now)
            return True
        self.state[key] = (tokens, now)
        return False


OPEN: list[object] = []  # limiters to close before the redis-server stops


def contestants(url: str | None) -> list[tuple[str, Callable[[str], object], int, str]]:
    """(name, acquire function, iterations at scale 1, note); url None: in-process only."""
    import limits
    import limits.storage
    import limits.strategies

    import quotalease

    big = 1_000_000_000  # never denies during the run: a warm key, admitted
    window_ms = 1_000_000
    hot = quotalease.Limiter("memory://", limit=big, window_ms=window_ms, lease_size=10_000)
    dflt = quotalease.Limiter("memory://", limit=big, window_ms=window_ms)
    OPEN.extend([hot, dflt])
    tb = TokenBucket(big, window_ms / 1000)
    item = limits.parse(f"{big}/hour")
    fixed_mem = limits.strategies.FixedWindowRateLimiter(limits.storage.MemoryStorage())
    moving_mem = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())

    def noop(key: str) -> None:
        return None

    cases: list[tuple[str, Callable[[str], object], int, str]] = [
        ("quotalease, memory://, lease_size=10000", hot.acquire, 2_000_000, "warm key: the local lease"),
        ("quotalease, memory://, default (adaptive leases)", dflt.acquire, 1_000_000, "no lease_size: sized by demand"),
    ]
    if url is not None:
        red_hot = quotalease.Limiter(url, limit=big, window_ms=window_ms, lease_size=10_000, key_prefix="b1")
        red_dflt = quotalease.Limiter(url, limit=big, window_ms=window_ms, key_prefix="b2")
        OPEN.extend([red_hot, red_dflt])
        cases += [
            ("quotalease, Redis, lease_size=10000", red_hot.acquire, 2_000_000, "warm key: the local lease"),
            (
                "quotalease, Redis, default (adaptive leases)",
                red_dflt.acquire,
                50_000,
                "no lease_size: sized by demand x round trip",
            ),
        ]
    cases += [
        ("pure-Python token bucket (dict)", tb.acquire, 1_000_000, "in-process only"),
        ("limits FixedWindow, MemoryStorage", lambda k: fixed_mem.hit(item, k), 200_000, "in-process only"),
        ("limits MovingWindow, MemoryStorage", lambda k: moving_mem.hit(item, k), 20_000, "in-process only"),
    ]
    if url is not None:
        red = limits.storage.RedisStorage(url)
        fixed_red = limits.strategies.FixedWindowRateLimiter(red)
        moving_red = limits.strategies.MovingWindowRateLimiter(red)
        cases += [
            (
                "limits FixedWindow, RedisStorage",
                lambda k: fixed_red.hit(item, "f", k),
                5_000,
                "a round trip a call",
            ),
            (
                "limits MovingWindow, RedisStorage",
                lambda k: moving_red.hit(item, "m", k),
                5_000,
                "a round trip a call",
            ),
        ]
    cases.append(("(a Python call of a no-op function)", noop, 2_000_000, "loop + call overhead"))
    return cases


INSTR_CASES = [
    "quotalease, memory://, lease_size=10000",
    "pure-Python token bucket (dict)",
    "limits FixedWindow, MemoryStorage",
    "(a Python call of a no-op function)",
]


def inner(name: str, n: int) -> None:
    """Under callgrind: warm up, then n calls of one contestant."""
    fn = next(c[1] for c in contestants(None) if c[0] == name)
    for _ in range(1000):
        fn("user:42")
    for _ in range(n):
        fn("user:42")


def instructions(name: str, n: int) -> float | None:
    """Instructions per call: callgrind totals for n and 2n calls, differenced."""
    totals = []
    for k in (n, 2 * n):
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
            + ["--inner", name, str(k)],
            capture_output=True,
            text=True,
        )
        found = [ln for ln in out.stderr.splitlines() if "Collected" in ln]
        if out.returncode != 0 or not found:
            return None
        totals.append(int(found[-1].split()[-1]))
    return (totals[1] - totals[0]) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    ap.add_argument("--write-docs", type=Path, help="update this benchmarks.md")
    ap.add_argument("--inner", nargs=2, metavar=("NAME", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args.inner[0], int(args.inner[1]))
        return 0
    scale = 20 if args.quick else 1
    repeats = 3 if args.quick else 7

    import limits

    import quotalease

    state = tempfile.mkdtemp(prefix="quotalease-pybench-")
    env = {**os.environ, "QUOTALEASE_HARNESS_STATE": state}
    started = subprocess.run([str(REDISCTL), "start"], env=env, check=True, capture_output=True, text=True)
    port = started.stdout.strip()
    rows: list[tuple[str, float, str]] = []
    try:
        cases = contestants(f"redis://127.0.0.1:{port}")
        for _, fn, _, _ in cases:  # connections, scripts, keys, leases
            for _ in range(500):
                fn("user:42")
        # Interleaved rounds, the best round per contestant: a burst of load
        # from other processes hits every contestant alike.
        best = {name: float("inf") for name, _, _, _ in cases}
        for _ in range(repeats):
            for name, fn, n, _ in cases:
                best[name] = min(best[name], timed(fn, max(n // scale, 100), 1))
        for name, _, _, note in cases:
            rows.append((name, best[name], note))
            print(f"{name:<50} {best[name]:>12,.0f} ns/op", file=sys.stderr)
    finally:
        for lim in OPEN:
            lim.close()  # type: ignore[attr-defined]
        subprocess.run([str(REDISCTL), "stop", port], env=env, check=False, capture_output=True)
        shutil.rmtree(state, ignore_errors=True)

    ns_of = {name: ns for name, ns, _ in rows}
    instr: dict[str, float] = {}
    if shutil.which("valgrind"):
        for name in INSTR_CASES:
            n = 20_000 if name.startswith("limits") else 100_000
            got = instructions(name, max(n // scale, 1000))
            if got is not None:
                instr[name] = got
                print(f"{name:<50} {got:>12,.0f} instructions/op", file=sys.stderr)
    else:
        print("valgrind not found: no instruction counts (apt-get install valgrind)", file=sys.stderr)

    head = rows[0][0]
    base = ns_of[head]
    table = [
        "| contestant | ns per acquire | × quotalease | instructions per acquire | note |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, ns, note in rows:
        i = f"{instr[name]:,.0f}" if name in instr else ""
        table.append(f"| {name} | {ns:,.0f} | {ns / base:.1f}× | {i} | {note} |")
    lim_mem = ns_of["limits FixedWindow, MemoryStorage"]
    lim_red = ns_of["limits FixedWindow, RedisStorage"]
    red_hot = ns_of["quotalease, Redis, lease_size=10000"]
    summary = [
        f"quotalease `acquire` on a warm key: {base:.0f} ns (goal ≤ 150 ns, issue 26's ≤ 100 ns: "
        f"{'met' if base <= 100 else 'NOT met'}; "
        f"a no-op Python call costs {ns_of['(a Python call of a no-op function)']:.0f} ns in the same loop).",
        f"vs limits' fastest in-memory limiter (FixedWindow, MemoryStorage): {lim_mem / base:.1f}× faster by wall "
        f"clock (goal ≥ 10×, issue 26's ≥ 30×: {'met' if lim_mem / base >= 30 else 'NOT met'})"
        + (
            f", {instr['limits FixedWindow, MemoryStorage'] / instr[head]:.1f}× fewer instructions."
            if head in instr and "limits FixedWindow, MemoryStorage" in instr
            else "."
        ),
        f"Distributed, on a warm key: quotalease on Redis {red_hot:.0f} ns vs limits FixedWindow on the same "
        f"redis-server {lim_red:,.0f} ns ({lim_red / red_hot:.0f}×).",
        "The default rows give no lease_size: adaptive leasing sizes each key's leases by its demand × the "
        "round trip; the lease_size=10000 rows pin fixed leases no loop outruns.",
        "Wall-clock figures move with the machine's load (the warm-key acquire measured "
        "115–195 ns across runs on 2026-11-30); the instruction counts do not.",
    ]
    host = f"Python {platform.python_version()}, quotalease {quotalease.__version__}, limits {limits.__version__}"
    out = "\n".join(table) + "\n\n" + "\n".join(f"- {s}" for s in summary) + "\n"
    print(out)
    if args.write_docs:
        block = (
            f"{START}\n"
            f"Command: `{COMMAND}` ({host}; {time.strftime('%Y-%m-%d')}).\n\n"
            '`acquire("user:42")` on a warm key from a Python loop, every contestant in one process and '
            "one run: wall clock is the best of "
            f"{repeats} interleaved rounds (ns per call, loop overhead included); instructions per call come "
            "from callgrind (two runs of n and 2n calls, differenced), which do not move with the machine's "
            "load. The `limits` rows use one redis-server started by `tests/harness/redisctl`, the same one "
            "the quotalease Redis rows lease from.\n\n"
            f"{out}{END}"
        )
        path = args.write_docs
        text = path.read_text() if path.exists() else "# Benchmarks\n"
        if START in text and END in text:
            text = text[: text.index(START)] + block + text[text.index(END) + len(END) :]
        else:
            text = text.rstrip("\n") + "\n\n## Python\n\n" + block + "\n"
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
