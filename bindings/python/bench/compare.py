"""`acquire` on a warm key through two builds of the package, side by side.

    python bench/compare.py DIR_A DIR_B [ROUNDS]

Each DIR holds a `quotalease` package (its .py files and `_native.abi3.so`).
One interpreter cannot import two builds of one extension module, so each
round runs each build in a fresh interpreter, alternating; every round times
1 000 000 calls from a function (no global-variable stores in the loop). Prints
the min and median ns per call of each, and their ratio.
scripts/bench-python-baseline.sh REV builds DIR_A from a revision.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

LOOP = """
import time, quotalease
def main():
    l = quotalease.Limiter(limit=10**9, window_ms=1000, lease_size=10**6)
    if not l.acquire("user:42").allowed:
        raise SystemExit("the warm-up request was denied")
    acquire, n = l.acquire, 1_000_000
    t = time.perf_counter_ns()
    for _ in range(n):
        acquire("user:42")
    print((time.perf_counter_ns() - t) / n)
main()
"""


def run(pkg_dir: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", LOOP],
        env={"PYTHONPATH": pkg_dir},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python bench/compare.py DIR_A DIR_B [ROUNDS]")
    dirs = sys.argv[1:3]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    ns: dict[str, list[float]] = {d: [] for d in dirs}
    for _ in range(rounds):
        for d in dirs:
            ns[d].append(run(d))
    for d in dirs:
        lo, mid = min(ns[d]), statistics.median(ns[d])
        print(f"{d}: acquire min {lo:.1f} ns, median {mid:.1f} ns ({rounds} rounds of 1000000)")
    a, b = (statistics.median(ns[d]) for d in dirs)
    print(f"ratio (median): {b / a:.2f}")


if __name__ == "__main__":
    main()
