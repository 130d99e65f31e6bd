#!/usr/bin/env python3
"""Cross-language system test: worker processes in Rust, C, Go, Python and
Node limit the same keys through one real redis-server at the same time, with
deliberately uneven load, while the driver injects faults. See README.md.

Usage: system_test.py [--langs rust,c,go,python,node] [--duration-s 10] [--only NAME]
Prints one line per check and ends with 'N passed, N failed'.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "harness"
WORKERS = pathlib.Path(__file__).resolve().parent / "workers"


def sh(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout.strip()


def redisctl(*args):
    return sh(str(HARNESS / "redisctl"), *map(str, args))


def faultproxy(*args):
    return sh(str(HARNESS / "faultproxy"), *map(str, args))


def cli(port, *args):
    # -c follows cluster redirections (harmless on a standalone server).
    return sh("redis-cli", "-c", "-p", str(port), *map(str, args))


def redis_ms(port):
    sec, usec = cli(port, "TIME").split()
    return int(sec) * 1000 + int(usec) // 1000


def worker_cmd(lang):
    """The command that runs one worker of `lang` (the job JSON is appended)."""
    venv_py = ROOT / ".venv" / "bin" / "python"
    cmds = {
        "rust": [str(ROOT / "target" / "release" / "examples" / "system_worker")],
        "c": [str(WORKERS / "build" / "worker_c")],
        "go": [str(WORKERS / "build" / "worker_go")],
        "python": [str(venv_py if venv_py.exists() else sys.executable), str(WORKERS / "worker.py")],
        "node": ["node", str(WORKERS / "worker.js")],
    }
    cmd = cmds[lang]
    if not (shutil.which(cmd[0]) or pathlib.Path(cmd[0]).exists()):
        raise RuntimeError(f"no {lang} worker at {cmd[0]}: run `make system-workers` first")
    return cmd


class Fleet:
    """Workers for one scenario: two of some languages, uneven load."""

    def __init__(self, langs, url, prefix, duration_ms, start_at=None, policy="static-share", timeout_ms=300):
        self.procs = []
        # Leave time for every runtime to load before the synchronized start.
        self.start_at = start_at or int(time.time() * 1000) + 3000
        self.duration_ms = duration_ms
        plan = []
        for i, lang in enumerate(langs):
            plan.append((lang, i))
            if lang in ("rust", "python"):  # two of some
                plan.append((lang, i + len(langs)))
        self.n = len(plan)
        for lang, i in plan:
            job = {
                "url": url,
                "key_prefix": prefix,
                "keys": ["hot", "warm"],
                # Uneven: worker i sends (1 + 3i) hot requests per warm one,
                # and paces itself differently.
                "weights": [1 + 3 * (i % 4), 1],
                "pause_us": [5, 50, 200, 1000][i % 4],
                "limit": LIMIT,
                "window_ms": WINDOW_MS,
                "lease_size": LEASE,
                "on_backend_failure": policy,
                "expected_replicas": self.n,
                "backend_timeout_ms": timeout_ms,
                "start_at_ms": self.start_at,
                "duration_ms": duration_ms,
            }
            p = subprocess.Popen(
                worker_cmd(lang) + [json.dumps(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            self.procs.append((f"{lang}#{i}", p))

    def wait_until(self, offset_ms):
        delay = (self.start_at + offset_ms) / 1000 - time.time()
        if delay > 0:
            time.sleep(delay)

    def results(self):
        out = {}
        # Hang guard: every worker must end soon after its deadline.
        guard = self.start_at / 1000 + self.duration_ms / 1000 + 60
        for name, p in self.procs:
            try:
                stdout, stderr = p.communicate(timeout=max(1, guard - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                raise AssertionError(f"{name} hung past its deadline")
            assert p.returncode == 0, f"{name} exited {p.returncode}: {stderr[-2000:]}"
            lines = [line for line in stdout.splitlines() if line.startswith("{")]
            assert lines, f"{name} printed no result: {stdout[-500:]} {stderr[-500:]}"
            out[name] = json.loads(lines[-1])
            out[name]["stderr"] = stderr[-3000:]
        return out


LIMIT = 2000
WINDOW_MS = 1000  # 2 tokens per ms per key
LEASE = 20
KEYS = ("hot", "warm")


def empty_buckets(port, prefix, t0):
    """Store every key's bucket empty with its refill starting at T0 (the
    fleet's synchronized start, in the future: the scripts never refill
    backwards), so every token admitted comes from refill after T0 and the
    books can be balanced exactly."""
    for k in KEYS:
        cli(port, "HSET", f"{prefix}:{{{k}}}", "c", 0, "t", t0, "w", WINDOW_MS)
        cli(port, "PEXPIRE", f"{prefix}:{{{k}}}", 600000)


def check_steady(langs, duration_ms, cluster=False):
    if cluster:
        ports = redisctl("cluster-start", 3, 1).split()
        port = int(ports[0])
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:3])
    else:
        port = redisctl("start")
        url = f"redis://127.0.0.1:{port}"
    try:
        prefix = f"sys{os.getpid()}"
        # Redis and this driver read the same system clock.
        t0 = redis_ms(port) + 3000
        empty_buckets(port, prefix, t0)
        # Timeouts are not the subject here: a patient bound keeps a loaded
        # machine from turning slow calls into fallback decisions.
        fleet = Fleet(langs, url, prefix, duration_ms, start_at=t0, timeout_ms=2000)
        res = fleet.results()
        t_end = redis_ms(port)
        per_key = {k: sum(r["admitted"].get(k, 0) for r in res.values()) for k in KEYS}
        leased = sum(r["metrics"]["tokens_leased"] for r in res.values())
        returned = sum(r["metrics"]["tokens_returned"] for r in res.values())
        admitted = sum(r["metrics"]["admitted"] for r in res.values())
        bound_extra = fleet.n * LEASE
        report = []
        for name, r in res.items():
            assert r["metrics"]["backend_errors"] == 0, f"{name} had backend errors: {r['metrics']}"
        for k in KEYS:
            # Tokens the bucket could have produced since T0 (it started empty).
            allowance = (t_end - t0) * LIMIT // WINDOW_MS
            window = duration_ms * LIMIT // WINDOW_MS
            report.append(f"{k}: admitted {per_key[k]}, allowance {allowance}, load-window allowance {window}")
            assert per_key[k] <= allowance + bound_extra, f"{k}: {per_key[k]} > {allowance} + {bound_extra}"
            assert per_key[k] * 100 >= window * 95, f"{k}: {per_key[k]} < 95% of {window}"
        # Every worker's books: what it admitted is what Redis granted minus
        # what it gave back (close() gave back everything held).
        for name, r in res.items():
            m = r["metrics"]
            assert r["closed"], f"{name} failed to close"
            assert m["overshoot_bound"] == 0, f"{name} still holds tokens: {m}"
            assert m["tokens_leased"] - m["tokens_returned"] == m["admitted"], f"{name}: {m}"
            assert m["backend_errors"] == 0, f"{name}: {m}"
        assert admitted == sum(per_key.values())
        # Redis' books: every stored bucket equals its refill since T0 minus
        # what the fleet took and did not give back.
        stored = 0
        refill = 0
        for k in KEYS:
            c = int(cli(port, "HGET", f"{prefix}:{{{k}}}", "c"))
            t = int(cli(port, "HGET", f"{prefix}:{{{k}}}", "t"))
            stored += c
            refill += (t - t0) * LIMIT
        assert stored == refill - (leased - returned) * WINDOW_MS, (
            f"Redis holds {stored} units, expected {refill} - ({leased} - {returned}) * {WINDOW_MS}"
        )
        calls = sum(r["metrics"]["backend_calls"] for r in res.values())
        report.append(f"{len(res)} processes, backend calls {calls} for {admitted} admitted")
        return report
    finally:
        redisctl("cluster-stop" if cluster else "stop", port)


def fault_fleet(langs, duration_ms, inject, via_proxy=False):
    """Run the fleet while `inject(port, proxy, fleet)` breaks things."""
    port = redisctl("start")
    proxy = faultproxy("start", port) if via_proxy else None
    try:
        target = proxy or port
        fleet = Fleet(langs, f"redis://127.0.0.1:{target}", f"flt{os.getpid()}x{time.time_ns() % 10**6}", duration_ms)
        notes = inject(port, proxy, fleet)
        res = fleet.results()
        for name, r in res.items():
            assert r["closed"] is not None
            ev = r["events"]
            assert "degraded" in ev, f"{name} saw no degraded event: {ev}"
            assert "recovered" in ev, f"{name} never recovered: {ev}; metrics {r['metrics']} reasons {r['reasons']}; its log: {r['stderr']}"
            assert r["reasons"].get("fallback", 0) > 0, f"{name}: {r['reasons']}"
            assert r["reasons"].get("lease", 0) > 0, f"{name}: {r['reasons']}"
            assert r["metrics"]["fallback_active"] == 0, f"{name} still degraded at the end: {r['metrics']} {r['stderr']}"
        total = {k: sum(r["admitted"].get(k, 0) for r in res.values()) for k in KEYS}
        slowest = max(r["max_acquire_ms"] for r in res.values())
        return notes + [f"admitted {total} by {len(res)} processes; slowest acquire {slowest} ms"]
    finally:
        if proxy:
            faultproxy("stop", proxy)
        redisctl("stop", port)


def kill_and_restart(port, proxy, fleet):
    fleet.wait_until(3000)
    redisctl("kill", port)
    fleet.wait_until(6000)
    redisctl("restart", port)
    return ["redis killed at +3 s, restarted empty at +6 s"]


def pause_and_resume(port, proxy, fleet):
    fleet.wait_until(3000)
    redisctl("pause", port)
    fleet.wait_until(5000)
    redisctl("resume", port)
    return ["redis paused from +3 s to +5 s"]


def proxy_faults(port, proxy, fleet):
    fleet.wait_until(2000)
    faultproxy("set", proxy, "latency", 400)
    fleet.wait_until(4000)
    faultproxy("set", proxy, "drop")
    fleet.wait_until(6000)
    faultproxy("set", proxy, "reset")
    fleet.wait_until(7000)
    faultproxy("set", proxy, "pass")
    return ["proxy: 400 ms latency at +2 s, black hole at +4 s, resets at +6 s, healed at +7 s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--langs", default="rust,c,go,python,node")
    ap.add_argument("--duration-s", type=float, default=10)
    ap.add_argument("--only")
    a = ap.parse_args()
    langs = a.langs.split(",")
    for lang in langs:
        worker_cmd(lang)
    d = int(a.duration_s * 1000)
    checks = [
        ("steady fleet: bound, budget used, books balance", lambda: check_steady(langs, d)),
        ("steady fleet on a 3-master Redis Cluster: same checks", lambda: check_steady(langs, d, cluster=True)),
        ("redis killed and restarted empty", lambda: fault_fleet(langs, d, kill_and_restart)),
        ("redis paused", lambda: fault_fleet(langs, d, pause_and_resume)),
        ("tcp proxy latency, black hole, resets", lambda: fault_fleet(langs, d, proxy_faults, via_proxy=True)),
    ]
    passed = failed = 0
    for name, fn in checks:
        if a.only and a.only not in name:
            continue
        try:
            notes = fn()
            passed += 1
            print(f"ok   {name}")
            for n in notes:
                print(f"       {n}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        sys.stdout.flush()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
