"""quotalease against per-request Redis limiting, from Python: one redis-server,
the same offered load, one contestant after the other in one process.

Contestants (threads share one limiter object, as an application would):

* quotalease, lease mode (lease_size 20, default refill_threshold): ``acquire(key)``,
  admitted from a local lease; a broker thread leases tokens from Redis;
* quotalease, exact mode: one script call to Redis per request;
* the ``limits`` library with ``RedisStorage``: FixedWindowRateLimiter,
  MovingWindowRateLimiter and SlidingWindowCounterRateLimiter, ``hit(item, key)``
  (one script call per request).

Like the Rust peers bench (``quotalease bench``, cli/src/bench.rs): a closed loop
(each thread sends its next request when the last is decided), a limit that never
binds (1e9 per second) so admitted/s is each design's capacity, every thread
replaying the same key sequence for every contestant (one hot key; Zipf s=1.1
over 1000 keys from SplitMix64 with seed 1, the same sequences the Rust bench
generates). Latency is time.perf_counter_ns() around each decision; Redis
commands are ``INFO commandstats`` deltas around each run (after FLUSHALL and
CONFIG RESETSTAT).

Writes target/bench/peers-python.json (read by scripts/peers-chart.py), prints
Markdown tables, and with --write-docs FILE replaces the block between the
python-peers-bench markers there (inserted after the python-bench block if absent).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import cycle
from pathlib import Path
from typing import Any, Literal, cast

import limits
import limits.storage
import limits.strategies
import redis

import quotalease

ROOT = Path(__file__).resolve().parents[3]
REDISCTL = ROOT / "tests" / "harness" / "redisctl"
CHART = ROOT / "scripts" / "peers-chart.py"
DEFAULT_JSON = ROOT / "target" / "bench" / "peers-python.json"
START = "<!-- python-peers-bench:start -->"
END = "<!-- python-peers-bench:end -->"
AFTER = "<!-- python-bench:end -->"
COMMAND = "make bench-python"
LONG_COMMAND = (
    "make bench-python   # = scripts/bench-python.sh → bindings/python/bench/bench_acquire.py, then bench_peers.py"
)

LIMIT = 1_000_000_000  # per second: never binds during a run
WINDOW_MS = 1000
ZIPF_S = 1.1
GOAL_FEWER_COMMANDS = 20.0
GOAL_THROUGHPUT = 10.0
MASK64 = (1 << 64) - 1

# Commands that are not the limiters' work: the harness's own (INFO, FLUSHALL,
# CONFIG RESETSTAT) and connection set-up (redis-py sends CLIENT SETINFO).
IGNORED_PREFIXES = ("info", "ping", "hello", "select", "auth", "client", "config", "flushall", "flushdb")


# ------------------------------------------------------------------ offered load


class SplitMix64:
    """The Rust bench's generator (cli/src/rng.rs), bit for bit."""

    def __init__(self, seed: int, stream: int) -> None:
        self.state = (seed ^ (stream * 0xD1B5_4A32_D192_ED03)) & MASK64
        self.next_u64()

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E37_79B9_7F4A_7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & MASK64
        return z ^ (z >> 31)

    def unit(self) -> float:
        return (self.next_u64() >> 11) / float(1 << 53)


def zipf_len(threads: int) -> int:
    """Per-thread sequence length, as cli/src/dist.rs."""
    return min(max((1 << 21) // max(threads, 1), 4096), 65_536)


def key_sequences(dist: str, keys: int, threads: int, seed: int) -> list[list[str]]:
    """Every thread's key sequence (replayed in a loop), the same for every contestant."""
    if dist == "hot":
        return [["bench:0"] for _ in range(threads)]
    acc = 0.0
    cdf = []
    for r in range(1, keys + 1):
        acc += r**-ZIPF_S
        cdf.append(acc)
    cdf = [c / acc for c in cdf]
    names = [f"bench:{i}" for i in range(keys)]
    seqs = []
    for t in range(threads):
        rng = SplitMix64(seed, t)
        seqs.append([names[min(bisect.bisect_right(cdf, rng.unit()), keys - 1)] for _ in range(zipf_len(threads))])
    return seqs


def describe(dist: str, keys: int) -> str:
    return "one hot key" if dist == "hot" else f"Zipf s={ZIPF_S} over {keys} keys"


# ------------------------------------------------------------------ contestants


@dataclass
class Contestant:
    name: str
    kind: str  # "lease" | "per-request"
    about: str
    # (redis url, lease_size, key prefix) -> (decide(key) -> truthy if admitted, close())
    make: Callable[[str, int, str], tuple[Callable[[str], object], Callable[[], None]]]
    bound: Callable[[int], int]


def quotalease_maker(
    mode: Literal["lease", "exact"],
) -> Callable[[str, int, str], tuple[Callable[[str], object], Callable[[], None]]]:
    def make(url: str, lease_size: int, prefix: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        lim = quotalease.Limiter(
            url,
            limit=LIMIT,
            window_ms=WINDOW_MS,
            lease_size=lease_size if mode == "lease" else None,
            mode=mode,
            key_prefix=prefix,
        )
        return lim.acquire, lim.close

    return make


def limits_maker(
    strategy: type[limits.strategies.RateLimiter],
) -> Callable[[str, int, str], tuple[Callable[[str], object], Callable[[], None]]]:
    def make(url: str, lease_size: int, prefix: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        storage = limits.storage.RedisStorage(url, key_prefix=prefix)
        limiter = strategy(storage)
        item = limits.RateLimitItemPerSecond(LIMIT, 1)
        client: redis.Redis = storage.storage

        def close() -> None:
            client.close()
            client.connection_pool.disconnect()

        return partial(limiter.hit, item), close

    return make


def contestants(lease_size: int) -> list[Contestant]:
    out = [
        Contestant(
            "quotalease lease",
            "lease",
            "quotalease, lease mode",
            quotalease_maker("lease"),
            lambda ls: ls * 1,  # lease_size x instances (one instance here)
        ),
        Contestant(
            "quotalease exact",
            "per-request",
            "quotalease, exact mode",
            quotalease_maker("exact"),
            lambda ls: 0,
        ),
        Contestant(
            "limits FixedWindow",
            "per-request",
            "limits FixedWindowRateLimiter, RedisStorage",
            limits_maker(limits.strategies.FixedWindowRateLimiter),
            lambda ls: 0,
        ),
        Contestant(
            "limits MovingWindow",
            "per-request",
            "limits MovingWindowRateLimiter, RedisStorage",
            limits_maker(limits.strategies.MovingWindowRateLimiter),
            lambda ls: 0,
        ),
    ]
    sliding = getattr(limits.strategies, "SlidingWindowCounterRateLimiter", None)
    if sliding is not None:
        out.append(
            Contestant(
                "limits SlidingWindowCounter",
                "per-request",
                "limits SlidingWindowCounterRateLimiter, RedisStorage",
                limits_maker(sliding),
                lambda ls: 0,
            )
        )
    return out


# ------------------------------------------------------------------ measuring


@dataclass
class Result:
    dist: str
    contestant: Contestant
    admitted: int
    denied: int
    seconds: float
    p50_ns: int
    p99_ns: int
    commands: dict[str, int]
    bound: int
    max_ns: int  # the slowest decision (progress output only)

    @property
    def admitted_per_s(self) -> float:
        return self.admitted / max(self.seconds, 1e-9)

    @property
    def script_calls(self) -> int:
        return sum(n for c, n in self.commands.items() if c.startswith("eval"))

    @property
    def script_calls_per_admitted(self) -> float:
        return self.script_calls / max(self.admitted, 1)

    @property
    def commands_per_admitted(self) -> float:
        return sum(self.commands.values()) / max(self.admitted, 1)

    def as_json(self) -> dict[str, Any]:
        return {
            "dist": self.dist,
            "contestant": self.contestant.name,
            "kind": self.contestant.kind,
            "admitted": self.admitted,
            "denied": self.denied,
            "seconds": round(self.seconds, 6),
            "admitted_per_s": round(self.admitted_per_s, 3),
            "p50_ns": self.p50_ns,
            "p99_ns": self.p99_ns,
            "script_calls_per_admitted": round(self.script_calls_per_admitted, 6),
            "commands_per_admitted": round(self.commands_per_admitted, 6),
            "commands": dict(sorted(self.commands.items())),
            "overshoot_bound": self.bound,
        }


def commandstats(admin: redis.Redis) -> dict[str, int]:
    info = cast(dict[str, Any], admin.info("commandstats"))
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_")}


def quantiles(samples: Sequence[array[int]], qs: Sequence[float]) -> list[int]:
    """Nearest-rank quantiles of every sample, without sorting millions of ints."""
    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(s)
    n = sum(counts.values())
    if n == 0:
        return [0 for _ in qs]
    out = []
    values = sorted(counts.items())
    for q in qs:
        rank = max(1, -(-int(q * n * 1_000_000) // 1_000_000))  # ceil(q * n)
        seen = 0
        for v, c in values:
            seen += c
            if seen >= rank:
                out.append(v)
                break
    return out


@dataclass
class Tally:
    admitted: int = 0
    denied: int = 0
    latencies: array[int] = field(default_factory=lambda: array("q"))
    error: BaseException | None = None


def worker(decide: Callable[[str], object], keys: list[str], deadline: int, stop: list[bool], tally: Tally) -> None:
    """Decide request after request, closed loop, until the deadline."""
    perf = time.perf_counter_ns
    record = tally.latencies.append
    admitted = denied = 0
    try:
        for key in cycle(keys):
            t0 = perf()
            ok = decide(key)
            t1 = perf()
            record(t1 - t0)
            if ok:
                admitted += 1
            else:
                denied += 1
            if t1 >= deadline or stop[0]:
                break
    except BaseException as e:  # reported by the main thread
        tally.error = e
        stop[0] = True
    tally.admitted, tally.denied = admitted, denied


def run_one(
    admin: redis.Redis,
    url: str,
    dist: str,
    c: Contestant,
    index: int,
    seqs: list[list[str]],
    duration_s: float,
    lease_size: int,
) -> Result:
    admin.flushall()
    admin.config_resetstat()
    prefix = f"qlpybench{os.getpid()}x{dist}x{index}"
    decide, close = c.make(url, lease_size, prefix)
    try:
        before = commandstats(admin)
        tallies = [Tally() for _ in seqs]
        stop = [False]
        start = time.perf_counter_ns()
        deadline = start + int(duration_s * 1e9)
        threads = [
            threading.Thread(target=worker, args=(decide, seq, deadline, stop, t), name=f"bench-{i}")
            for i, (seq, t) in enumerate(zip(seqs, tallies, strict=True))
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        seconds = (time.perf_counter_ns() - start) / 1e9
        after = commandstats(admin)
    finally:
        close()  # lease mode returns its unused tokens: after the `after` snapshot, as the Rust bench
    for t in tallies:
        if t.error is not None:
            raise RuntimeError(f"{c.name} on {dist}: a benchmark thread failed: {t.error!r}") from t.error
    commands = {}
    for cmd, calls in after.items():
        d = calls - before.get(cmd, 0)
        if d > 0 and not cmd.startswith(IGNORED_PREFIXES):
            commands[cmd] = d
    p50, p99, worst = quantiles([t.latencies for t in tallies], [0.5, 0.99, 1.0])
    return Result(
        dist=dist,
        contestant=c,
        admitted=sum(t.admitted for t in tallies),
        denied=sum(t.denied for t in tallies),
        seconds=seconds,
        p50_ns=p50,
        p99_ns=p99,
        commands=commands,
        bound=c.bound(lease_size),
        max_ns=worst,
    )


# ------------------------------------------------------------------ reporting


def dur(ns: int) -> str:
    if ns < 1_000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} us"
    return f"{ns / 1e6:.2f} ms"


def ratio(x: float) -> str:
    """A factor: one decimal from 1 up, two significant digits below 1 (as the Rust report)."""
    if x >= 100:
        return f"{x:.0f}x"
    if x >= 1 or x <= 0:
        return f"{x:.1f}x"
    digits = max(0, 1 - math.floor(math.log10(x)))
    return f"{x:.{digits}f}x"


def floor2(x: float) -> str:
    """Two decimals rounded down, so a factor just under a goal never reads as the goal."""
    return f"{int(x * 100 + 1e-9) / 100:.2f}x"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


@dataclass
class Versus:
    """Lease against the per-request designs on one distribution."""

    best_thr: Result  # the per-request contestant with the most admitted/s
    best_cmds: Result  # ... with the fewest commands per admitted request
    best_calls: Result  # ... with the fewest script calls per admitted request


def versus(rows: list[Result]) -> Versus:
    per = [r for r in rows if r.contestant.kind == "per-request"]
    return Versus(
        best_thr=max(per, key=lambda r: r.admitted_per_s),
        best_cmds=min(per, key=lambda r: r.commands_per_admitted),
        best_calls=min(per, key=lambda r: r.script_calls_per_admitted),
    )


def table(rows: list[Result]) -> str:
    v = versus(rows)
    out = [
        "| contestant | admitted | admitted/s | denied | p50 | p99 | overshoot bound | script calls / admitted "
        "| all commands / admitted | admitted/s vs best per-request | fewer commands than best per-request |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r.contestant.name} | {r.admitted} | {r.admitted_per_s:.0f} | {r.denied} | {dur(r.p50_ns)} "
            f"| {dur(r.p99_ns)} | {r.bound} | {r.script_calls_per_admitted:.4f} | {r.commands_per_admitted:.4f} "
            f"| {ratio(r.admitted_per_s / max(v.best_thr.admitted_per_s, 1e-9))} "
            f"| {ratio(v.best_cmds.commands_per_admitted / max(r.commands_per_admitted, 1e-12))} |"
        )
    return "\n".join(out)


def commands_line(rows: list[Result]) -> str:
    parts = []
    for r in rows:
        parts.append(f"{r.contestant.name}: " + ", ".join(f"{c} {n}" for c, n in sorted(r.commands.items())))
    return "Commands (INFO commandstats): " + "; ".join(parts) + "."


def goals_line(rows: list[Result], lease_size: int) -> str:
    lease = next(r for r in rows if r.contestant.kind == "lease")
    v = versus(rows)
    calls = v.best_calls.script_calls_per_admitted / max(lease.script_calls_per_admitted, 1e-12)
    cmds = v.best_cmds.commands_per_admitted / max(lease.commands_per_admitted, 1e-12)
    thr = lease.admitted_per_s / max(v.best_thr.admitted_per_s, 1e-9)
    names = ", ".join(r.contestant.name for r in rows if r.contestant.kind == "per-request")
    return (
        f"Goals for quotalease lease (lease_size {lease_size}) against every per-request design ({names}): "
        f"≥ {GOAL_FEWER_COMMANDS:.0f}× fewer Redis commands per admitted request: "
        f"{met(calls >= GOAL_FEWER_COMMANDS)} for round trips ({floor2(calls)} vs {v.best_calls.contestant.name}, "
        f"{lease.script_calls_per_admitted:.4f} vs {v.best_calls.script_calls_per_admitted:.4f}), "
        f"{met(cmds >= GOAL_FEWER_COMMANDS)} for all commands ({floor2(cmds)} vs {v.best_cmds.contestant.name}, "
        f"{lease.commands_per_admitted:.4f} vs {v.best_cmds.commands_per_admitted:.4f}); "
        f"≥ {GOAL_THROUGHPUT:.0f}× the admitted/s: {met(thr >= GOAL_THROUGHPUT)} "
        f"({floor2(thr)} vs {v.best_thr.contestant.name}, {lease.admitted_per_s:.0f} vs "
        f"{v.best_thr.admitted_per_s:.0f} admitted/s)."
    )


def markdown(results: list[Result], dists: list[str], keys: int, lease_size: int) -> str:
    out = []
    for d in dists:
        rows = [r for r in results if r.dist == d]
        out.append(f"**{d}**: {describe(d, keys)}\n")
        out.append(table(rows) + "\n")
        out.append(commands_line(rows) + "\n")
        out.append(goals_line(rows, lease_size) + "\n")
    return "\n".join(out)


def machine() -> dict[str, str]:
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "n/a"
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
        rv = next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), "?")
    except OSError:
        rv = "?"
    return {
        "nproc": str(os.cpu_count() or "?"),
        "load": load,
        "python": platform.python_version(),
        "limits": limits.__version__,
        "redis_py": redis.__version__,
        "redis_server": rv,
        "quotalease": quotalease.__version__,
    }


def docs_block(md: str, args: argparse.Namespace, date: str, m: dict[str, str], lease_size: int) -> str:
    threshold = max(lease_size // 4, 1)
    thr = lease_size - threshold + 1
    busy = ", other jobs running" if _load1(m["load"]) > float(m["nproc"] if m["nproc"].isdigit() else 1) else ""
    return f"""{START}
## Against limits with Redis storage (Python)

The Python counterpart of the Rust peers bench above: quotalease against the
[`limits`](https://pypi.org/project/limits/) library's Redis storage, every
contestant one after the other in one process (`bench_peers.py`) against one
redis-server, on the same offered load:

- **quotalease lease** (lease_size {lease_size}): one `Limiter(url, limit=1_000_000_000,
  window_ms=1000, lease_size={lease_size})` shared by the threads, each calling
  `acquire(key)`, which admits from the local lease and blocks (GIL released)
  only when the key has no local tokens; a broker thread leases up to
  lease_size tokens per `EVALSHA`, prefetching at the default refill_threshold
  ({threshold}).
- **quotalease exact**: the same `Limiter` with `mode="exact"`: one `EVALSHA` per
  request.
- **limits FixedWindow / MovingWindow / SlidingWindowCounter**:
  `FixedWindowRateLimiter`, `MovingWindowRateLimiter` and
  `SlidingWindowCounterRateLimiter` over one `RedisStorage("redis://127.0.0.1:PORT")`
  (redis-py; its pool gives each thread its own connection), each thread calling
  `hit(RateLimitItemPerSecond(1_000_000_000), key)`: one `EVALSHA` of limits' Lua
  script per request (FixedWindow: `INCRBY`, and `EXPIRE` when a window's counter
  is new; MovingWindow: `LINDEX`, `LPUSH`, `LTRIM`, `EXPIRE`; SlidingWindowCounter:
  `PTTL` ×3, `GET` ×2, `EXISTS`, `INCRBY` (`SET` for a new counter), and a `RENAME`
  and a `SET` when the window moves on).

Each of {args.threads} Python threads replays its own key sequence, the same for every
contestant (one hot key; Zipf s={ZIPF_S} over {args.keys} keys from SplitMix64 seed
{args.seed}, the Rust bench's sequences), in a closed loop for {args.duration:g} s per contestant
and distribution. The limit (1e9 per second) never binds, so admitted/s is each
design's capacity from Python. p50/p99 are `time.perf_counter_ns()` around each
decision, every sample kept. Redis commands are `INFO commandstats` deltas around
each run (after FLUSHALL and CONFIG RESETSTAT; INFO, CONFIG and connection set-up
such as redis-py's `CLIENT SETINFO` not counted): "script calls" are `EVAL` and
`EVALSHA` (the round trips), "all commands" also counts what the scripts ran and
any `SCRIPT LOAD`. The overshoot bound is instances × lease_size for lease (one
instance) and 0 for the others. The threads share one GIL: lease mode's local
admits run under it, one at a time, while every wait on Redis (quotalease's and
redis-py's) releases it, so the per-request designs overlap their round trips.

Command: `{LONG_COMMAND}` (bench_peers.py starts its own redis-server with
`tests/harness/redisctl start`, stops it at the end, and writes
`target/bench/peers-python.json`, this block and the chart). Measured {date} on {m["nproc"]}
cores (load average {m["load"]} at the end{busy}), Python {m["python"]},
quotalease {m["quotalease"]}, limits {m["limits"]}, redis-py {m["redis_py"]},
Redis {m["redis_server"]} on the same cores.

```sh
.venv/bin/python bindings/python/bench/bench_peers.py --threads {args.threads} --duration {args.duration:g} \\
    --keys {args.keys} --lease-size {lease_size} --write-docs docs/benchmarks.md
```

{md}
![quotalease lease and exact vs limits (FixedWindow, MovingWindow, SlidingWindowCounter) on Redis, \
from Python: admitted/s and Redis commands per admitted request](peers-python.svg)

**Reading the goals.** As in the Rust section, at lease_size {lease_size} with the
default refill_threshold each lease call brings at most
lease_size − refill_threshold + 1 = {thr} tokens (only a key's first lease brings
{lease_size}), so round trips fall about {thr}× below one per request, not 20×. Counting every command, the lease
script runs 4 per call (`EVALSHA`, `TIME`, `GET`, `SET`), so lease
mode needs about 4/{thr} = {4 / thr:.4f} commands per admitted request, while limits'
FixedWindow needs 2 (`EVALSHA`, `INCRBY`): the ceiling against it is
2 × {thr}/4 = {2 * thr / 4:.1f}×, whatever the machine. The throughput goal depends on
how much faster a local admit is than a Redis round trip from Python: on one hot
key lease mode is capped by lease round trips (one lease in flight per key, each
bringing at most {thr} tokens; its p99 is a thread waiting for that lease), while on
the Zipf spread many keys lease in parallel.
{END}
"""


def _load1(load: str) -> float:
    try:
        return float(load.split()[0])
    except (ValueError, IndexError):
        return 0.0


def write_docs(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if START in text and END in text:
        a, rest = text.split(START, 1)
        _, b = rest.split(END, 1)
        text = a + block.rstrip("\n") + b
    elif AFTER in text:
        a, b = text.split(AFTER, 1)
        text = a + AFTER + "\n\n" + block.rstrip("\n") + "\n\n" + b.lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


# ------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per contestant and distribution")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--keys", type=int, default=1000, help="keys of the Zipf spread")
    ap.add_argument("--seed", type=int, default=1, help="seed of the Zipf key sequences")
    ap.add_argument("--lease-size", type=int, default=20)
    ap.add_argument("--dist", default="hot,zipf", help="comma-separated: hot, zipf")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help="result file (default: %(default)s)")
    ap.add_argument("--write-docs", type=Path, help="update the python-peers-bench block of this benchmarks.md")
    args = ap.parse_args()
    dists = [d.strip() for d in args.dist.split(",") if d.strip()]
    if not dists or any(d not in ("hot", "zipf") for d in dists) or len(set(dists)) != len(dists):
        ap.error("--dist takes hot, zipf or both")
    if args.threads < 1 or args.duration <= 0 or args.keys < 2 or args.lease_size < 1:
        ap.error("--threads >= 1, --duration > 0, --keys >= 2, --lease-size >= 1")

    names = contestants(args.lease_size)
    state = tempfile.mkdtemp(prefix="quotalease-pybench-peers-")
    env = {**os.environ, "QUOTALEASE_HARNESS_STATE": state}
    port = ""
    results: list[Result] = []
    try:
        started = subprocess.run([str(REDISCTL), "start"], env=env, check=True, capture_output=True, text=True)
        port = started.stdout.strip()
        url = f"redis://127.0.0.1:{port}"
        admin = redis.Redis(host="127.0.0.1", port=int(port))
        print(
            f"bench_peers: {args.threads} threads x {args.duration:g} s per contestant and distribution, "
            f"limit {LIMIT} per {WINDOW_MS} ms, lease_size {args.lease_size}, against {url}",
            file=sys.stderr,
        )
        for c in names:
            print(f"  {c.name} = {c.about}", file=sys.stderr)
        for d in dists:
            seqs = key_sequences(d, args.keys, args.threads, args.seed)
            for i, c in enumerate(names):
                r = run_one(admin, url, d, c, i, seqs, args.duration, args.lease_size)
                results.append(r)
                print(
                    f"  {d:<5} {c.name:<32} {r.admitted_per_s:>12,.0f} admitted/s  p50 {dur(r.p50_ns):>9}  "
                    f"p99 {dur(r.p99_ns):>9}  max {dur(r.max_ns):>9}  {r.seconds:.2f} s  "
                    f"{r.commands_per_admitted:.4f} commands/admitted",
                    file=sys.stderr,
                )
        admin.close()
    finally:
        if port:
            subprocess.run([str(REDISCTL), "stop", port], env=env, check=False, capture_output=True)
        shutil.rmtree(state, ignore_errors=True)

    date = time.strftime("%Y-%m-%d", time.gmtime())
    m = machine()
    data = {
        "language": "Python",
        "command": COMMAND,
        "date": date,
        "threads": args.threads,
        "duration_s": float(args.duration),
        "runs": [r.as_json() for r in results],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    print(f"bench_peers: wrote {args.json}", file=sys.stderr)

    md = markdown(results, dists, args.keys, args.lease_size)
    print(md)
    if args.write_docs:
        write_docs(args.write_docs, docs_block(md, args, date, m, args.lease_size))
        print(f"bench_peers: wrote the python-peers-bench block of {args.write_docs}", file=sys.stderr)
        svg = args.write_docs.resolve().parent / "peers-python.svg"
        if CHART.exists():
            subprocess.run([sys.executable, str(CHART), str(args.json), str(svg)], check=True)
        else:
            print(f"bench_peers: {CHART} not found: {svg} not written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
