"""Processes sharing one concurrency limit on a real Redis: each takes permits
of one key as fast as it is admitted and holds each for a random time (up to
9 s, past a commitment's 7 s), while a Redis counter tracks the permits in
flight across all of them. Prints each process's permits taken and denials,
and the most in flight it saw (the bound: at most ``concurrency``).

    python bench/permits_fleet.py redis://127.0.0.1:6379 [processes] [seconds]
"""

from __future__ import annotations

import multiprocessing
import random
import sys
import time

import redis

from quotalease import Limiter

CONCURRENCY = 3
HOLDS = [0.001, 0.01, 0.05, 0.3, 1.0, 4.0, 9.0]


def worker(url: str, prefix: str, secs: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    r = redis.Redis.from_url(url)
    lim = Limiter(url, limit=100_000, concurrency=CONCURRENCY, key_prefix=prefix)
    end = time.time() + secs
    taken = denied = worst = 0
    rng = random.Random()
    while time.time() < end:
        p = lim.acquire_concurrent("k")
        if not p.allowed:
            denied += 1
            time.sleep(0.005)
            continue
        taken += 1
        worst = max(worst, int(r.incr(f"{prefix}:inflight")))
        time.sleep(rng.choice(HOLDS) * rng.random())
        r.decr(f"{prefix}:inflight")
        p.release()
    lim.close()
    out.put((taken, denied, worst))


def main() -> None:
    url = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 40.0
    prefix = f"permits-fleet-{time.time_ns()}"
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    procs = [multiprocessing.Process(target=worker, args=(url, prefix, secs, out)) for _ in range(n)]
    for p in procs:
        p.start()
    rows = [out.get() for _ in procs]
    for p in procs:
        p.join()
    print(f"{n} processes, concurrency {CONCURRENCY}, {secs:g} s")
    print("taken per process:", sorted(t for t, _, _ in rows))
    print("most in flight seen:", max(w for _, _, w in rows), f"(bound {CONCURRENCY})")


if __name__ == "__main__":
    main()
