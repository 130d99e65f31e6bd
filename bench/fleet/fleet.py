#!/usr/bin/env python3
"""make bench-fleet: saturated fleets of several languages on one Redis key,
fixed leases against adaptive leasing in one run (issue 12's last two targets).

(a) 3 Python + 3 Node processes (worker.py, worker.js), one key, limit 1000 per
    1000 ms, offered 2x in total with uneven per-process rates.
(b) HTTP: 4 FastAPI workers (app.py, gunicorn with uvicorn workers), 4 Express
    workers (app.js, node:cluster) and 4 Go net/http processes (go/, one port
    shared with SO_REUSEPORT), every request limited on one key, limit 200 per
    1000 ms, offered 13x by a paced keep-alive load generator (go/ load).
(c) equal demand: 3 Python + 3 Node processes at the same rate, 2x a 600 per
    60 000 ms key drained before the load (so the limit binds from the start):
    each process's admitted against an equal share of the fleet's, over one
    window of the key (60 s; also printed after the first --secs seconds).
--hog runs each case's adaptive leasing again with a CPU hog (a busy process
per core) competing for the whole run: production containers are throttled.

Calls per admitted come from the limiters' own metrics (backend_calls /
admitted, summed over processes, counted up to the end of the load) and are
cross-checked with Redis' INFO commandstats (EVALSHA + EVAL, counted from a
CONFIG RESETSTAT before the load to after every limiter's close()). Allowance
on a fresh key over the D seconds between the first request and the last
answer: limit (the bucket starts full) + limit / window x D; O = the default
overshoot budget, 2 % of the limit (at least 1).

Standard library only; run by scripts/bench-fleet.sh, which builds everything
and starts redis-server. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VPY = ROOT / ".venv" / "bin" / "python"
GO = ROOT / "target" / "bench-fleet" / "fleetgo"


def budget(limit: int) -> int:
    return max(limit * 2 // 100, 1)


def whole_second_after(delay_s: float) -> int:
    """A wall-clock start in unix ms: a whole second at least delay_s from now."""
    return (int(time.time() + delay_s) + 1) * 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hog:
    """A busy process per core for the duration of a `with` block (none when `on` is false)."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Hog:
        spin = "while True: pass"
        cores = (os.cpu_count() or 1) if self.on else 0
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


class Redis:
    def __init__(self, port: int) -> None:
        self.port = port

    def cli(self, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def reset_stats(self) -> None:
        self.cli("CONFIG", "RESETSTAT")

    def script_calls(self) -> dict[str, int]:
        """EVALSHA and EVAL calls since the last reset, and those that failed or were rejected."""
        out = {"calls": 0, "failed": 0}
        for line in self.cli("INFO", "commandstats").splitlines():
            m = re.match(r"cmdstat_(evalsha|eval):(.*)", line.strip())
            if m:
                f = dict(kv.split("=") for kv in m.group(2).split(","))
                out["calls"] += int(f["calls"])
                out["failed"] += int(f.get("failed_calls", 0)) + int(f.get("rejected_calls", 0))
        return out


def summarize(
    name: str, limit: int, window_ms: int, offered: int, admitted: int, span_ms: int, calls: int, redis: dict
) -> dict:
    allowance = limit + limit * span_ms // window_ms
    return {
        "leases": name,
        "offered": offered,
        "admitted": admitted,
        "span_s": span_ms / 1000,
        "allowance": allowance,
        "ratio": admitted / allowance,
        "within": admitted <= allowance,
        "calls": calls,
        "cpa": calls / admitted if admitted else float("inf"),
        "redis_calls": redis["calls"],
        "redis_failed": redis["failed"],
        "redis_cpa": redis["calls"] / admitted if admitted else float("inf"),
    }


def table(rows: list[dict]) -> list[str]:
    out = [
        f"{'leases':<10} {'offered':>8} {'admitted':>9} {'D (s)':>6} {'allowance':>9} {'adm/allow':>9} "
        f"{'<= A':>6} {'calls/adm':>9} {'redis calls/adm':>15}"
    ]
    for r in rows:
        out.append(
            f"{r['leases']:<10} {r['offered']:>8} {r['admitted']:>9} {r['span_s']:>6.2f} {r['allowance']:>9} "
            f"{r['ratio']:>9.3f} {'yes' if r['within'] else 'NO':>6} {r['cpa']:>9.4f} {r['redis_cpa']:>15.4f}"
        )
    return out


def timeline(label: str, deltas: list[int]) -> str:
    return f"{label}: " + " ".join(str(d) for d in deltas)


# ---------------------------------------------------------------- case (a)

A_LIMIT, A_WINDOW = 1000, 1000
# Requests per second offered by each process: 2000/s in total, 2x the limit.
A_RATES = [("python", 100), ("python", 300), ("python", 600), ("node", 150), ("node", 350), ("node", 500)]


def run_workers(
    url: str, redis: Redis, secs: int, lease: int | None, prefix: str, limit: int, window: int, rates: list
) -> list[dict]:
    """One paced worker process per (lang, rate) on one key; their JSON results."""
    start = whole_second_after(3.0)  # time for every interpreter to load its binding
    procs = []
    for lang, rate in rates:
        job = {
            "url": url,
            "key_prefix": prefix,
            "key": "fleet",
            "limit": limit,
            "window_ms": window,
            "lease_size": lease,
            "rate": rate,
            "start_at_ms": start,
            "duration_ms": secs * 1000,
        }
        cmd = [str(VPY), str(HERE / "worker.py")] if lang == "python" else ["node", str(HERE / "worker.js")]
        procs.append(subprocess.Popen([*cmd, json.dumps(job)], stdout=subprocess.PIPE, text=True))
    redis.reset_stats()  # no limiter calls Redis before start
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=secs + 60)
        if p.returncode != 0:
            raise SystemExit(f"bench-fleet: a worker exited with {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def case_a(url: str, redis: Redis, secs: int, lease: int | None, tag: str, hog: bool = False) -> tuple[dict, list[str]]:
    name = (f"fixed {lease}" if lease else "adaptive") + (" + hog" if hog else "")
    with Hog(hog):
        results = run_workers(url, redis, secs, lease, f"fleet-a-{tag}", A_LIMIT, A_WINDOW, A_RATES)
    stats = redis.script_calls()
    span = max(r["last_ms"] for r in results) - min(r["first_ms"] for r in results)
    row = summarize(
        name,
        A_LIMIT,
        A_WINDOW,
        sum(r["offered"] for r in results),
        sum(r["admitted"] for r in results),
        span,
        sum(r["metrics"]["backend_calls"] for r in results),
        stats,
    )
    lines = [f"per process, {name}:", process_header()]
    for r in results:
        lines.append(process_line(f"{r['lang']} {r['rate']}/s", r["offered"], r["metrics"]))
    for r in results:
        # per_second[i]: [backend_calls, admitted] at the end of second i of the load (the last: at its end)
        cum = [r["per_second"][min(i, len(r["per_second"]) - 1)] for i in range(secs)]
        r["label"] = f"{r['lang']} {r['rate']}/s"
        r["series"] = [[b - a for a, b in itertools.pairwise([0, *(c[k] for c in cum)])] for k in (0, 1)]
    lines += seconds(results, lease is None)
    lines.append(denials_line(results))
    lines += event_lines(results)
    lines.append(redis_line(row, sum(r["metrics_closed"]["backend_calls"] for r in results)))
    return row, lines


def event_lines(results: list[dict]) -> list[str]:
    """The outages each worker process saw (its `on_event` callbacks), one line each."""
    return [
        f"  event {r['lang']} {r['rate']:g}/s at {ev[0]} ms: {ev[1]} {ev[2]}"
        for r in results
        for ev in r.get("events", [])
    ]


def denials_line(results: list[dict]) -> str:
    """The fleet's denials by the decision's reason (`exhausted`: the key's tokens were spent; `pending`: a lease
    call did not answer in time; `fallback`: the failure policy decided during an outage)."""
    total: dict[str, int] = {}
    for r in results:
        for reason, n in r.get("denied_by", {}).items():
            total[reason] = total.get(reason, 0) + n
    return "denied by reason: " + (", ".join(f"{k} {v}" for k, v in sorted(total.items())) or "none")


# ---------------------------------------------------------------- case (c)

C_LIMIT, C_WINDOW = 600, 60_000
# 6 processes at the same rate: 20/s in total, 2x the key's refill of 10/s.
C_RATES = [("python", 10 / 3)] * 3 + [("node", 10 / 3)] * 3


def drain(url: str, prefix: str) -> tuple[int, int, int]:
    """Spend the fresh key's bucket (a limiter of the same configuration), so the limit binds from the start:
    (admitted, tokens it gave back at close, unix ms when it was closed)."""
    code = (
        "import time; from quotalease import Limiter\n"
        f"l = Limiter({url!r}, limit={C_LIMIT}, window_ms={C_WINDOW}, key_prefix={prefix!r})\n"
        "n = 0\n"
        "while l.acquire('fleet').allowed: n += 1\n"
        "l.close(); print(n, l.metrics()['tokens_returned'], int(time.time() * 1000))\n"
    )
    out = subprocess.run([str(VPY), "-c", code], check=True, capture_output=True, text=True).stdout
    n, back, at = (int(x) for x in out.split())
    return n, back, at


def spread_of(admitted: list[int]) -> float:
    """The largest distance of one process's admitted from the mean, as a fraction of the mean."""
    mean = sum(admitted) / len(admitted)
    return max(abs(a - mean) for a in admitted) / mean if mean else float("inf")


def case_c(url: str, redis: Redis, secs: int, tag: str, hog: bool) -> tuple[dict, list[str]]:
    """Runs over one window of the key (at least `secs`): an equal share is a share of what the key allows per
    window. The spread after the first `secs` seconds is read from the same run (each worker's admitted at every
    whole second): the start, where the first callers take the refill since the drain, weighs most there."""
    name = "adaptive" + (" + hog" if hog else "")
    prefix = f"fleet-c-{tag}"
    run_s = max(secs, C_WINDOW // 1000)
    drained, back, drained_at = drain(url, prefix)
    with Hog(hog):
        results = run_workers(url, redis, run_s, None, prefix, C_LIMIT, C_WINDOW, C_RATES)
    admitted = [r["admitted"] for r in results]
    early = [r["per_second"][min(secs, len(r["per_second"])) - 1][1] for r in results]
    # What one exact bucket allows from the drain on: what the drainer gave
    # back, then the refill up to the last answer (the workers start seconds later).
    allowed = back + C_LIMIT * (max(r["last_ms"] for r in results) - drained_at) / C_WINDOW
    calls = sum(r["metrics"]["backend_calls"] for r in results)
    row = {"leases": name, "admitted": admitted, "worst": spread_of(admitted), "allowed": allowed, "calls": calls,
           "drained": drained, "early": early, "early_worst": spread_of(early), "secs": secs, "run_s": run_s}  # fmt: skip
    lines = [f"per process, {name}:", process_header()]
    for r in results:
        lines.append(process_line(f"{r['lang']} {r['rate']:.2f}/s", r["offered"], r["metrics"]))
    lines.append(denials_line(results))
    lines += event_lines(results)
    return row, lines


def table_c(rows: list[dict]) -> list[str]:
    out = [f"{'leases':<16} {'drained':>7} {'admitted per process':<28} {'allowed':>7} {'adm/allow':>10} "
           f"{'worst off share':>15} {'calls/adm':>9}"]  # fmt: skip
    for r in rows:
        total = sum(r["admitted"])
        out.append(
            f"{r['leases']:<16} {r['drained']:>7} {' '.join(str(a) for a in r['admitted']):<28} {r['allowed']:>7.0f} "
            f"{total / r['allowed']:>10.3f} {r['worst'] * 100:>14.1f}% {r['calls'] / max(total, 1):>9.4f}"
        )
    for r in rows:
        out.append(
            f"{r['leases']:<16} after the first {r['secs']} s: {' '.join(str(a) for a in r['early'])}, "
            f"{r['early_worst'] * 100:.1f} % from an equal share"
        )
    out.append(
        f"target (each process within 10 % of an equal share over one window of the key, {rows[0]['run_s']} s): "
        + ", ".join(f"{r['leases']}: {'met' if r['worst'] <= 0.10 else 'MISSED'}" for r in rows)
    )
    return out


# Lines that start with this are printed but not recorded in docs/benchmarks.md.
PRINT_ONLY = "\0"


def seconds(procs: list[dict], each: bool) -> list[str]:
    """Backend calls in each second of the load, for the fleet and (each) per process with its admissions."""
    fleet = [sum(col) for col in zip(*(r["series"][0] for r in procs), strict=True)]
    lines = [timeline("fleet calls in each second", fleet)]
    if each:
        for r in procs:
            lines.append(PRINT_ONLY + timeline(f"  {r['label']:<14} calls", r["series"][0]))
            lines.append(PRINT_ONLY + timeline(f"  {r['label']:<14} admitted", r["series"][1]))
    return lines


def process_header() -> str:
    return (
        f"  {'process':<14} {'offered':>8} {'admitted':>8} {'denied':>7} {'calls':>6} {'calls/adm':>9} "
        f"{'leased':>7} {'returned':>8} {'expired':>7} {'errors':>6} {'fallbacks':>9}"
    )


def process_line(label: str, offered: int | str, m: dict) -> str:
    cpa = m["backend_calls"] / m["admitted"] if m["admitted"] else float("nan")
    return (
        f"  {label:<14} {offered:>8} {m['admitted']:>8} {m['denied']:>7} {m['backend_calls']:>6} {cpa:>9.4f} "
        f"{m['tokens_leased']:>7} {m['tokens_returned']:>8} {m['tokens_expired']:>7} "
        f"{m['backend_errors']:>6} {m['fallback_transitions']:>9}"
    )


def redis_line(row: dict, closed_calls: int) -> str:
    return (
        f"Redis: {row['redis_calls']} EVALSHA + EVAL ({row['redis_failed']} answered NOSCRIPT or an error); "
        f"the limiters counted {row['calls']} up to the end of the load, {closed_calls} after close()"
    )


# ---------------------------------------------------------------- case (b)

B_LIMIT, B_WINDOW, B_OFFERED, B_WORKERS, B_CONNS = 200, 1000, 13, 4, 16


def wait_for(cond, what: str, timeout_s: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"bench-fleet: {p.args[0]} exited with {p.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench-fleet: timed out waiting for {what}")
        time.sleep(0.05)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def case_b(url: str, redis: Redis, secs: int, lease: int | None, tag: str, hog: bool = False) -> tuple[dict, list[str]]:
    if hog:
        with Hog():
            row, lines = case_b(url, redis, secs, lease, tag)
        row["leases"] += " + hog"
        return row, lines
    name = f"fixed {lease}" if lease else "adaptive"
    out = Path(tempfile.mkdtemp(prefix="quotalease-bench-fleet-"))
    ports = {"python": free_port(), "node": free_port(), "go": free_port()}
    env = dict(
        os.environ,
        FLEET_URL=url,
        FLEET_PREFIX=f"fleet-b-{tag}",
        FLEET_LIMIT=str(B_LIMIT),
        FLEET_WINDOW_MS=str(B_WINDOW),
        FLEET_LEASE_SIZE=str(lease or ""),
        FLEET_OUT=str(out),
        FLEET_WORKERS=str(B_WORKERS),
        FLEET_PORT=str(ports["node"]),
    )
    servers = [
        subprocess.Popen(
            [
                str(VPY.parent / "gunicorn"),
                "--workers",
                str(B_WORKERS),
                "--worker-class",
                "uvicorn_worker.UvicornWorker",
                "--bind",
                f"127.0.0.1:{ports['python']}",
                "--chdir",
                str(HERE),
                "--log-level",
                "warning",
                "--graceful-timeout",
                "10",
                "app:app",
            ],
            env=env,
        ),
        subprocess.Popen(["node", str(HERE / "app.js")], env=env),
    ]
    for _ in range(B_WORKERS):
        servers.append(
            subprocess.Popen(
                [
                    str(GO), "serve", "-url", url, "-prefix", env["FLEET_PREFIX"],
                    "-limit", str(B_LIMIT), "-window", str(B_WINDOW), "-lease", str(lease or 0),
                    "-port", str(ports["go"]), "-out", str(out),
                ]
            )
        )  # fmt: skip
    try:
        ready = lambda: len(list(out.glob("ready-*"))) == 3 * B_WORKERS  # noqa: E731
        wait_for(ready, "12 web workers to serve", 60, servers)
        wait_for(lambda: all(healthy(p) for p in ports.values()), "/health on every port", 30, servers)
        redis.reset_stats()
        targets = ",".join(f"{lang}=http://127.0.0.1:{port}/" for lang, port in ports.items())
        start = whole_second_after(0.5)
        load = subprocess.run(
            [
                str(GO), "load", "-targets", targets, "-rate", str(B_OFFERED * B_LIMIT * 1000 / B_WINDOW),
                "-duration", str(secs), "-conns", str(B_CONNS), "-start-at", str(start),
            ],
            check=True, capture_output=True, text=True, timeout=secs + 60,
        )  # fmt: skip
        gen = json.loads(load.stdout)
    finally:
        for p in servers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in servers:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    records = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    shutil.rmtree(out, ignore_errors=True)
    if len(records) != 3 * B_WORKERS:
        raise SystemExit(f"bench-fleet: {len(records)} of {3 * B_WORKERS} web workers wrote their metrics")
    stats = redis.script_calls()
    t = gen["targets"]
    row = summarize(
        name,
        B_LIMIT,
        B_WINDOW,
        sum(c["sent"] for c in t.values()),
        sum(c["ok"] for c in t.values()),
        gen["last_ms"] - gen["first_ms"],
        sum(r["metrics"]["backend_calls"] for r in records),
        stats,
    )
    lines = [f"per server, {name}:"]
    lines.append(
        f"  {'server':<8} {'sent':>7} {'200':>6} {'429':>6} {'other':>5} {'errors':>6} "
        f"{'limiter adm':>11} {'calls':>6} {'calls/adm':>9}"
    )
    for lang, c in t.items():
        mine = [r for r in records if r["lang"] == lang]
        adm = sum(r["metrics"]["admitted"] for r in mine)
        calls = sum(r["metrics"]["backend_calls"] for r in mine)
        lines.append(
            f"  {lang:<8} {c['sent']:>7} {c['ok']:>6} {c['limited']:>6} {c['other']:>5} {c['errors']:>6} "
            f"{adm:>11} {calls:>6} {calls / adm if adm else float('nan'):>9.4f}"
        )
    lines.append(f"per worker, {name}:")
    lines.append(process_header())
    for r in records:
        m = r["metrics"]
        lines.append(process_line(f"{r['lang']} {r['pid']}", m["admitted"] + m["denied"], m))
    first_s = start // 1000
    for r in records:
        # [backend_calls, admitted] at each whole second from the start of the load to its end:
        # a worker's last sample at or before that second (past its last one, its count at the end)
        cum = []
        for sec in range(first_s, first_s + secs + 1):
            before = [x[1:] for x in r["per_second"] if x[0] <= sec]
            if not r["per_second"] or sec > r["per_second"][-1][0]:
                cum.append([r["metrics"]["backend_calls"], r["metrics"]["admitted"]])
            else:
                cum.append(before[-1] if before else [0, 0])
        r["label"] = f"{r['lang']} {r['pid']}"
        r["series"] = [[b - a for a, b in itertools.pairwise(c[k] for c in cum)] for k in (0, 1)]
    lines += seconds(records, lease is None)
    lines.append(redis_line(row, sum(r["metrics_closed"]["backend_calls"] for r in records)))
    admitted = sum(r["metrics"]["admitted"] for r in records)
    if admitted != row["admitted"]:
        lines.append(f"MISMATCH: the limiters admitted {admitted}, the load generator got {row['admitted']} 200s")
    return row, lines


# ---------------------------------------------------------------- report


def target_line(row: dict, limit: int) -> str:
    met = row["cpa"] <= 0.05 and row["within"] and row["ratio"] >= 0.97
    return (
        f"target for {row['leases']} (calls/adm <= 0.05, 0.97 <= admitted / allowance <= 1): "
        f"{'met' if met else 'MISSED'}: {row['cpa']:.4f} calls/adm, admitted {row['admitted']} of {row['allowance']} "
        f"({row['ratio']:.3f})"
    )


def revision() -> str:
    """The commit the bindings were built from, and whether the engine's sources differed from it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no", "--", "core", "ffi", "bindings"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{head or 'unknown'}{' + uncommitted changes in core/ffi/bindings' if dirty else ''}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--secs", type=int, default=20)
    ap.add_argument("--only", choices=["a", "b", "c"])
    ap.add_argument("--hog", action="store_true", help="also run adaptive leasing with a busy process per core")
    ap.add_argument("--hog-only", action="store_true", help="run only the rows with the hog (implies --hog)")
    ap.add_argument("--command", default="", help="the command line to record")
    ap.add_argument("--write-docs", type=Path)
    args = ap.parse_args()
    if args.hog_only and args.write_docs:
        ap.error("--hog-only writes no docs: its report lacks the rows without the hog")
    args.hog = args.hog or args.hog_only

    def plain(rows: list) -> list:
        """The rows without the hog, unless --hog-only."""
        return [] if args.hog_only else rows

    began = time.monotonic()
    url = f"redis://127.0.0.1:{args.redis_port}"
    redis = Redis(args.redis_port)
    tag = str(int(time.time()))
    report = [f"command: {args.command or ' '.join(sys.argv)}, {datetime.date.today()}, engine {revision()}"]
    print(report[0], flush=True)

    def emit(lines: list[str]) -> None:
        for line in lines:
            print(line.removeprefix(PRINT_ONLY), flush=True)
        report.extend(line for line in lines if not line.startswith(PRINT_ONLY))

    if args.only in (None, "a"):
        emit(["", f"## (a) mixed fleet: 3 Python + 3 Node processes, one key, limit {A_LIMIT} per {A_WINDOW} ms, "
              f"offered 2x ({', '.join(f'{lang} {r}/s' for lang, r in A_RATES)}), {args.secs} s each, "
              f"O = {budget(A_LIMIT)}"])  # fmt: skip
        rows, detail = [], []
        for lease, hog in plain([(20, False), (None, False)]) + [(None, True)] * args.hog:
            row, lines = case_a(url, redis, args.secs, lease, f"{tag}-{lease or 'adaptive'}-{hog}", hog)
            rows.append(row)
            detail += lines
        emit(table(rows))
        emit(detail)
        emit([target_line(r, A_LIMIT) for r in rows if not r["leases"].startswith("fixed")])
    if args.only in (None, "b"):
        emit(["", f"## (b) HTTP: {B_WORKERS} FastAPI (gunicorn, uvicorn workers) + {B_WORKERS} Express "
              f"(node:cluster) + {B_WORKERS} Go net/http processes, one key, limit {B_LIMIT} per {B_WINDOW} ms, "
              f"offered {B_OFFERED}x over {3 * B_CONNS} keep-alive connections, {args.secs} s each, "
              f"O = {budget(B_LIMIT)}"])  # fmt: skip
        rows, detail = [], []
        for lease, hog in plain([(budget(B_LIMIT), False), (None, False)]) + [(None, True)] * args.hog:
            row, lines = case_b(url, redis, args.secs, lease, f"{tag}-{lease or 'adaptive'}-{hog}", hog)
            rows.append(row)
            detail += lines
        emit(table(rows))
        emit(detail)
        emit([target_line(r, B_LIMIT) for r in rows if not r["leases"].startswith("fixed")])
    if args.only in (None, "c"):
        emit(["", f"## (c) equal demand: 3 Python + 3 Node processes at {C_RATES[0][1]:.2f}/s each (2x), one key, "
              f"limit {C_LIMIT} per {C_WINDOW} ms drained first, {max(args.secs, C_WINDOW // 1000)} s each "
              "(one window of the key)"])  # fmt: skip
        rows, detail = [], []
        for hog in plain([False]) + [True] * args.hog:
            row, lines = case_c(url, redis, args.secs, f"{tag}-{hog}", hog)
            rows.append(row)
            detail += lines
        emit(table_c(rows))
        emit(detail)
    if args.write_docs:
        write_docs(args.write_docs, report)
    print(f"bench-fleet: {time.monotonic() - began:.0f} s", file=sys.stderr)


def write_docs(doc: Path, report: list[str]) -> None:
    block = "\n".join(
        [
            "<!-- fleet-bench:start -->",
            "## Mixed-language fleets and web workers on one key (issues 12 and 22)",
            "",
            "`make bench-fleet` (`scripts/bench-fleet.sh`, `bench/fleet/`): a redis-server from the test",
            "harness; fixed leases and adaptive leasing (the default: no `lease_size`) in the same run.",
            "(a) 3 Python + 3 Node processes offering 2x the limit at uneven, paced rates; (b) 4 FastAPI",
            "workers (gunicorn, uvicorn workers, `quotalease.asgi`), 4 Express workers (node:cluster,",
            "`quotalease/express`) and 4 Go net/http processes (`Middleware`) on one key at 13x the",
            "limit, from a paced keep-alive load generator; (c) 3 Python + 3 Node processes of equal",
            "demand at 2x a 600/min key drained first: each process's admitted against an equal share",
            "over one window of the key (60 s), and after the run's first seconds.",
            'Rows "+ hog" ran with a busy process per core competing for the whole run.',
            "Calls per admitted: the limiters'",
            '`backend_calls / admitted`, summed over processes up to the end of the load; "redis',
            'calls/adm" counts EVALSHA + EVAL in `INFO commandstats` from before the load to after',
            "every `close()`. Allowance A = limit + limit / window x D (a fresh key starts full), D =",
            "first request to last answer; O = 2 % of the limit. The fixed rows lease 2 % of the",
            'limit (20 in (a), 4 in (b)). Per process, "leased", "returned" and "expired" are its',
            '`tokens_*` metrics. "fleet calls in each second": the backend calls in each second of',
            "the load (for adaptive leasing the command also prints calls and admissions per process",
            "and second).",
            "",
            "```text",
            *report,
            "```",
            "<!-- fleet-bench:end -->",
        ]
    )
    text = doc.read_text()
    if "<!-- fleet-bench:start -->" in text:
        text = re.sub(r"<!-- fleet-bench:start -->.*?<!-- fleet-bench:end -->", lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)


if __name__ == "__main__":
    main()
