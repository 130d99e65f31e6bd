"""Memory per tracked key from Python (issue 26), as core/examples/key_memory.rs
measures it in Rust: one limiter on memory:// takes one token for each of N
distinct keys, all tracked at once; the growth of the process' resident set
over the keys (the key strings already built), divided by N, is the cost of a
key: the engine's table and the in-process authority.

Usage: python bench/key_memory.py [N]   (default 1 000 000)
"""

from __future__ import annotations

import sys

from quotalease import Limiter


def rss() -> int:
    """This process' resident set in bytes (Linux: /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    n = int(sys.argv[1].replace("_", "")) if len(sys.argv) > 1 else 1_000_000
    # lease_ttl_ms: none idle long enough to leave the table while the run
    # inserts the rest (an entry without tokens leaves after 30 lease TTLs, at
    # least a minute; a million keys take longer than that)
    limiter = Limiter(limit=100, window_ms=60_000, max_keys=n + n // 8 + 16, lease_ttl_ms=3_600_000)
    limiter.acquire("warm-up")
    keys = [f"user:{i:010}" for i in range(n)]
    before = rss()
    for k in keys:
        if not limiter.acquire(k).allowed:
            raise SystemExit(f"{k} was denied")
    after = rss()
    tracked = limiter.metrics()["keys_tracked"]
    if tracked < n:
        raise SystemExit(f"only {tracked} of {n} keys tracked")
    print(
        f"key_memory.py: {n} keys of 15 bytes on memory://, adaptive leasing: "
        f"{(after - before) / n:.0f} B per tracked key "
        f"(RSS {before >> 20} MiB with the key strings, {after >> 20} MiB with every key tracked)"
    )


if __name__ == "__main__":
    main()
