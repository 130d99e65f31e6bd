#!/usr/bin/env python3
"""Soak: the system test's workers in all five languages on one Redis for a
long run (10 minutes by default), with faults injected on a schedule and the
resident memory of every worker sampled every few seconds. See README.md.

Usage: soak.py [--minutes 10] [--warmup-s 120] [--langs rust,c,go,python,node]
               [--sample-s 2] [--fault-every-s 40] [--json FILE]

Passes when, for every worker: its RSS after the warm-up never grows 5 % or
more above what it was at the end of the warm-up; its books balance after
close(); it recovers from every fault (awaited, under a hang guard); and it
never stops making progress (no hang). Prints the figures and exits 1 on any
failure. Stdlib only.
"""

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "system"))
import system_test as st  # noqa: E402  (worker commands and harness helpers)

LIMIT = 2000
WINDOW_MS = 1000
KEYS = ["hot", "warm", "k2", "k3", "k4", "k5"]
# The timeline is not the subject here: one slot per minute keeps each
# worker's per-slot counts (which grow with the run's length) to a few cells.
SLOT_MS = 60_000
# Workers print a progress line this often (the driver awaits recovery on them).
PROGRESS_MS = 500
# Hang guards (conditions are awaited; these only bound the wait).
RECOVERY_GUARD_S = 60
PROGRESS_GUARD_S = 30
GROWTH_LIMIT = 0.05

# Per worker, by language: pause between calls (us), key weights, failure policy.
PLAN = {
    "rust": (200, [8, 2, 1, 1, 1, 1], "static-share"),
    "c": (300, [4, 4, 1, 1, 1, 1], "deny"),
    "go": (300, [6, 1, 2, 1, 1, 1], "allow"),
    "python": (500, [3, 2, 1, 2, 1, 1], "static-share"),
    "node": (1000, [2, 2, 1, 1, 2, 2], "static-share"),
}


def now_ms():
    return int(time.time() * 1000)


def rss_kib(pid):
    """VmRSS of a process in KiB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Worker:
    """One worker process: its progress lines and final result, read as they come."""

    def __init__(self, lang, job):
        self.name = lang
        self.job = job
        self.p = subprocess.Popen(
            st.worker_cmd(lang) + [json.dumps(job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lock = threading.Lock()
        self.progress = None  # the latest progress line
        self.progress_gap_ms = 0  # the longest time between two progress lines
        self.result = None
        self.stderr = collections.deque(maxlen=200)
        self.rss = []  # (ms since start, KiB)
        threading.Thread(target=self._read_stdout, daemon=True).start()
        # Drained all along: a full stderr pipe would block the worker.
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self):
        for line in self.p.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            with self.lock:
                if "progress_at_ms" in msg:
                    if self.progress:
                        gap = msg["progress_at_ms"] - self.progress["progress_at_ms"]
                        self.progress_gap_ms = max(self.progress_gap_ms, gap)
                    self.progress = msg
                else:
                    self.result = msg

    def _read_stderr(self):
        for line in self.p.stderr:
            self.stderr.append(line.rstrip())

    def latest(self):
        with self.lock:
            return self.progress


class Faults:
    """The schedule: each fault in turn, every `every_s` seconds."""

    def __init__(self, port, proxy):
        def ctl(*a):
            return lambda: st.redisctl(*a)

        def fp(*a):
            return lambda: st.faultproxy(*a)

        self.kinds = [
            ("redis killed, restarted empty", ctl("kill", port), ctl("restart", port), 3.0),
            ("redis paused", ctl("pause", port), ctl("resume", port), 2.0),
            ("400 ms latency", fp("set", proxy, "latency", 400), fp("set", proxy, "pass"), 3.0),
            ("black hole", fp("set", proxy, "drop"), fp("set", proxy, "pass"), 2.0),
            ("connection resets", fp("set", proxy, "reset"), fp("set", proxy, "pass"), 1.0),
        ]


def await_recovery(workers, healed_ms, lease_at_heal):
    """Per worker, when (ms after the heal) a progress line showed it out of
    fallback and admitting from leases again; None if the guard ran out."""
    out = {}
    deadline = time.time() + RECOVERY_GUARD_S
    while time.time() < deadline and len(out) < len(workers):
        for w in workers:
            if w.name in out:
                continue
            p = w.latest()
            if (
                p
                and p["progress_at_ms"] > healed_ms
                and p["fallback_active"] == 0
                and p["reasons"].get("lease", 0) > lease_at_heal[w.name]
            ):
                out[w.name] = p["progress_at_ms"] - healed_ms
            elif w.p.poll() is not None:
                out[w.name] = None  # exited early: reported below
        time.sleep(0.05)
    return {w.name: out.get(w.name) for w in workers}


def redis_rss(port):
    try:
        return rss_kib(int(st.redisctl("pid", port)))
    except (RuntimeError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 10)))
    ap.add_argument("--warmup-s", type=float, help="default: 120, or a third of a run shorter than 6 minutes")
    ap.add_argument("--langs", default="rust,c,go,python,node")
    ap.add_argument("--sample-s", type=float, default=2)
    ap.add_argument("--fault-every-s", type=float, default=40)
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args()
    duration_ms = int(a.minutes * 60_000)
    warmup_ms = int((a.warmup_s if a.warmup_s is not None else min(120, a.minutes * 20)) * 1000)
    langs = a.langs.split(",")
    for lang in langs:
        st.worker_cmd(lang)

    port = st.redisctl("start")
    proxy = st.faultproxy("start", port)
    url = f"redis://127.0.0.1:{proxy}"
    failures = []
    workers = []
    try:
        start_at = now_ms() + 5000
        prefix = f"soak{os.getpid()}"
        for lang in langs:
            pause_us, weights, policy = PLAN[lang]
            job = {
                "url": url,
                "key_prefix": prefix,
                "keys": KEYS,
                "weights": weights,
                "pause_us": pause_us,
                "limit": LIMIT,
                "window_ms": WINDOW_MS,
                # no lease_size: adaptive leasing, the default
                "on_backend_failure": policy,
                "expected_replicas": len(langs),
                "backend_timeout_ms": 300,
                "start_at_ms": start_at,
                "duration_ms": duration_ms,
                "slot_ms": SLOT_MS,
                "settle_ms": 30_000,
                "progress_ms": PROGRESS_MS,
            }
            workers.append(Worker(lang, job))
        who = ", ".join(f"{w.name} {w.job['on_backend_failure']}" for w in workers)
        print(
            f"soak: {len(workers)} workers ({who}) "
            f"on one redis-server through a fault proxy, {a.minutes:g} min, warm-up {warmup_ms / 1000:g} s, "
            f"RSS every {a.sample_s:g} s, a fault every {a.fault_every_s:g} s",
            flush=True,
        )

        stop = threading.Event()
        redis_samples = []

        def sample():
            while not stop.is_set():
                t = now_ms() - start_at
                for w in workers:
                    kib = rss_kib(w.p.pid)
                    if kib is not None and w.p.poll() is None and 0 <= t <= duration_ms:
                        w.rss.append((t, kib))
                if 0 <= t <= duration_ms:
                    redis_samples.append((t, redis_rss(port)))
                stop.wait(a.sample_s)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        faults = Faults(port, proxy)
        recoveries = []  # (label, at_s, {worker: ms or None}, degraded workers)
        k = 0
        while True:
            at_s = 20 + k * a.fault_every_s
            label, begin, heal, hold_s = faults.kinds[k % len(faults.kinds)]
            # The last fault heals, and every worker recovers, well before the end.
            if (at_s + hold_s + RECOVERY_GUARD_S) * 1000 > duration_ms:
                break
            delay = start_at / 1000 + at_s - time.time()
            if delay > 0:
                time.sleep(delay)
            before = {w.name: (w.latest() or {}).get("fallback_transitions", 0) for w in workers}
            begin()
            time.sleep(hold_s)
            lease_at_heal = {w.name: (w.latest() or {"reasons": {}})["reasons"].get("lease", 0) for w in workers}
            heal()
            healed = now_ms()
            rec = await_recovery(workers, healed, lease_at_heal)
            degraded = [w.name for w in workers if (w.latest() or {}).get("fallback_transitions", 0) > before[w.name]]
            recoveries.append((label, at_s, rec, degraded))
            shown = ", ".join(f"{n} {'HUNG' if ms is None else f'{ms} ms'}" for n, ms in rec.items())
            print(
                f"  +{at_s:.0f} s {label} for {hold_s:g} s: degraded {', '.join(degraded) or 'none'}; "
                f"back to leasing after the heal: {shown}",
                flush=True,
            )
            for n, ms in rec.items():
                if ms is None:
                    failures.append(f"{n} did not recover from {label} at +{at_s:.0f} s within {RECOVERY_GUARD_S} s")
            k += 1

        # Results: every worker ends soon after its deadline (a hang guard).
        guard = start_at / 1000 + duration_ms / 1000 + 30 + 60
        for w in workers:
            try:
                w.p.wait(timeout=max(1, guard - time.time()))
            except subprocess.TimeoutExpired:
                w.p.kill()
                failures.append(f"{w.name} hung past its deadline")
        stop.set()
        sampler.join()
        time.sleep(0.2)  # the readers' last lines

        report = check(workers, warmup_ms, duration_ms, recoveries, failures)
        r_vals = [kib for _, kib in redis_samples if kib]
        if r_vals:
            print(f"redis-server RSS (not the library's, for reference): {r_vals[0]} KiB first, max {max(r_vals)} KiB")
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(report, indent=1))
    finally:
        for w in workers:
            if w.p.poll() is None:
                w.p.kill()
        st.faultproxy("stop", proxy)
        st.redisctl("stop", port)
    for f in failures:
        print(f"FAIL {f}")
    print("soak passed" if not failures else f"soak FAILED ({len(failures)} failures)")
    sys.exit(1 if failures else 0)


def check(workers, warmup_ms, duration_ms, recoveries, failures):
    """The per-worker checks; appends to `failures`, prints a table, returns the figures."""
    rows = []
    report = {"warmup_ms": warmup_ms, "duration_ms": duration_ms, "workers": {}, "faults": []}
    for label, at_s, rec, degraded in recoveries:
        report["faults"].append({"label": label, "at_s": at_s, "recovery_ms": rec, "degraded": degraded})
    for w in workers:
        r = w.result
        if w.p.returncode != 0 or r is None:
            tail = "\n".join(list(w.stderr)[-20:])
            failures.append(f"{w.name} exited {w.p.returncode} without a result; its log:\n{tail}")
            continue
        m = r["metrics"]
        # Books: what came from Redis was admitted or went back. Fallback
        # admissions (static-share's own bucket, allow) took no leased token.
        fallback_admitted = sum(c[3] for c in r["timeline"] if c[2] == "fallback")
        from_leases = m["admitted"] - fallback_admitted
        books = m["tokens_leased"] - m["tokens_returned"] - m["tokens_expired"]
        if not r["closed"]:
            failures.append(f"{w.name}: close() failed")
        if m["overshoot_bound"] != 0 or books != from_leases:
            failures.append(
                f"{w.name}: books do not balance: leased {m['tokens_leased']} - returned {m['tokens_returned']} "
                f"- expired {m['tokens_expired']} = {books}, admitted {m['admitted']} - under fallback "
                f"{fallback_admitted} = {from_leases}; {m}"
            )
        ev = r["events"]
        if ev.count("degraded") != ev.count("recovered") or not ev:
            failures.append(f"{w.name}: events {ev.count('degraded')} degraded, {ev.count('recovered')} recovered")
        if m["fallback_active"] != 0:
            failures.append(f"{w.name} ended degraded: {m}")
        if w.progress_gap_ms > PROGRESS_GUARD_S * 1000:
            failures.append(f"{w.name} made no progress for {w.progress_gap_ms} ms (hang guard {PROGRESS_GUARD_S} s)")
        # Memory: the peak after the warm-up against the end of the warm-up.
        warm = [kib for t, kib in w.rss if warmup_ms - 30_000 <= t <= warmup_ms]
        after = [kib for t, kib in w.rss if t > warmup_ms]
        if not warm or not after:
            failures.append(f"{w.name}: too few RSS samples ({len(w.rss)})")
            continue
        base, peak = max(warm), max(after)
        growth = peak / base - 1
        last = w.rss[-1][1]
        if growth >= GROWTH_LIMIT:
            failures.append(f"{w.name}: RSS grew {growth * 100:.1f} % after the warm-up ({base} -> {peak} KiB)")
        row = {
            "worker": w.name,
            "policy": w.job["on_backend_failure"],
            "rss_first_kib": w.rss[0][1],
            "rss_warm_kib": base,
            "rss_peak_after_kib": peak,
            "rss_last_kib": last,
            "growth_pct": round(growth * 100, 2),
            "admitted": m["admitted"],
            "fallback_admitted": fallback_admitted,
            "leased": m["tokens_leased"],
            "returned": m["tokens_returned"],
            "expired": m["tokens_expired"],
            "backend_calls": m["backend_calls"],
            "backend_errors": m["backend_errors"],
            "degraded": ev.count("degraded"),
            "recovered": ev.count("recovered"),
            "max_acquire_ms": r["max_acquire_ms"],
            "max_progress_gap_ms": w.progress_gap_ms,
            "samples": len(w.rss),
        }
        rows.append(row)
        report["workers"][w.name] = row
    print(
        "\n| worker | policy | RSS at warm-up end | peak after | last | growth | admitted (under fallback) "
        "| leased - returned - expired | degraded/recovered | calls (errors) | slowest acquire |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        print(
            f"| {x['worker']} | {x['policy']} | {x['rss_warm_kib']} KiB | {x['rss_peak_after_kib']} KiB "
            f"| {x['rss_last_kib']} KiB | {x['growth_pct']:+.2f} % | {x['admitted']} ({x['fallback_admitted']}) "
            f"| {x['leased'] - x['returned'] - x['expired']} | {x['degraded']}/{x['recovered']} "
            f"| {x['backend_calls']} ({x['backend_errors']}) | {x['max_acquire_ms']} ms |"
        )
    # The shape of each worker's RSS: its largest sample in each minute.
    minutes = max(1, -(-duration_ms // 60_000))
    print("\nRSS (KiB), the largest sample in each minute:")
    print("| worker | " + " | ".join(f"{i + 1}" for i in range(minutes)) + " |")
    print("|---|" + "---|" * minutes)
    for w in workers:
        per = [max((kib for t, kib in w.rss if i * 60_000 <= t < (i + 1) * 60_000), default=0) for i in range(minutes)]
        print(f"| {w.name} | " + " | ".join(str(x) for x in per) + " |")
        report["workers"].setdefault(w.name, {})["rss_per_minute_kib"] = per
        report["workers"][w.name]["rss_samples"] = w.rss
    rec = [ms for _, _, r, _ in recoveries for ms in r.values() if ms is not None]
    if rec:
        rec.sort()
        print(
            f"\n{len(recoveries)} faults; back to leasing after each heal (per worker, to the next "
            f"{PROGRESS_MS} ms progress line): median {rec[len(rec) // 2]} ms, max {rec[-1]} ms"
        )
    return report


if __name__ == "__main__":
    main()
