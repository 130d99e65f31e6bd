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

    def __init__(
        self, langs, url, prefix, duration_ms, start_at=None, policies=("static-share",), timeout_ms=300, adaptive=False
    ):
        self.procs = []
        # adaptive: no lease_size in the jobs, so every worker leases adaptively
        self.adaptive = adaptive
        self.policy = {}
        self.timeout_ms = timeout_ms
        # Leave time for every runtime to load before the synchronized start.
        self.start_at = start_at or int(time.time() * 1000) + 3000
        self.duration_ms = duration_ms
        plan = []
        for i, lang in enumerate(langs):
            plan.append((lang, i))
            if lang in ("rust", "python"):  # two of some
                plan.append((lang, i + len(langs)))
        self.n = len(plan)
        for n, (lang, i) in enumerate(plan):
            policy = policies[n % len(policies)]
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
                "on_backend_failure": policy,
                **({} if adaptive else {"lease_size": LEASE}),
                "expected_replicas": self.n,
                "backend_timeout_ms": timeout_ms,
                "start_at_ms": self.start_at,
                "duration_ms": duration_ms,
                "slot_ms": SLOT_MS,
                "settle_ms": SETTLE_MS,
            }
            p = subprocess.Popen(
                worker_cmd(lang) + [json.dumps(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            self.procs.append((f"{lang}#{i}", p))
            self.policy[f"{lang}#{i}"] = policy

    def wait_until(self, offset_ms):
        delay = (self.start_at + offset_ms) / 1000 - time.time()
        if delay > 0:
            time.sleep(delay)

    def results(self):
        out = {}
        # Hang guard: every worker must end soon after its deadline.
        guard = self.start_at / 1000 + (self.duration_ms + SETTLE_MS) / 1000 + 60
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
            out[name]["policy"] = self.policy[name]
        return out

    def slot(self, t_ms):
        """The timeline slot of a wall-clock time."""
        return max(0, int(t_ms - self.start_at)) // SLOT_MS


LIMIT = 2000
WINDOW_MS = 1000  # 2 tokens per ms per key
LEASE = 20
# Adaptive leasing's overshoot budget: the default, 2 % of the limit.
BUDGET = max(1, -(-LIMIT * 2 // 100))
KEYS = ("hot", "warm")
# Workers count their decisions per slot of this many ms (the timeline).
SLOT_MS = 100
# After the deadline a degraded worker goes on until it has recovered, for at
# most this long: recovery is a condition awaited, not a time limit.
SETTLE_MS = 30000
# Fault fleets mix the policies, worker by worker.
POLICIES = ("static-share", "deny", "allow")


def empty_buckets(port, prefix, t0):
    """Store every key's bucket empty with its refill starting at T0 (the
    fleet's synchronized start, in the future: the scripts never refill
    backwards), so every token admitted comes from refill after T0 and the
    books can be balanced exactly."""
    for k in KEYS:
        # The stored value: "credit refilled_at window" (core/src/redis_authority.rs).
        cli(port, "SET", f"{prefix}:{{{k}}}", f"0 {t0} {WINDOW_MS}", "PX", 600000)


def check_steady(langs, duration_ms, cluster=False, adaptive=False):
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
        fleet = Fleet(langs, url, prefix, duration_ms, start_at=t0, timeout_ms=2000, adaptive=adaptive)
        res = fleet.results()
        t_end = redis_ms(port)
        per_key = {k: sum(r["admitted"].get(k, 0) for r in res.values()) for k in KEYS}
        leased = sum(r["metrics"]["tokens_leased"] for r in res.values())
        returned = sum(r["metrics"]["tokens_returned"] for r in res.values())
        admitted = sum(r["metrics"]["admitted"] for r in res.values())
        # Fixed leases: each process may hold a lease. Adaptive: the fleet
        # holds at most the budget (and, with the buckets empty at T0,
        # nothing was held at the start).
        bound_extra = BUDGET if adaptive else fleet.n * LEASE
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
            # (adaptive: rate tokens that sat unspent past the lease TTL expire)
            expired = m["tokens_expired"] if adaptive else 0
            assert m["tokens_leased"] - m["tokens_returned"] - expired == m["admitted"], f"{name}: {m}"
            assert m["backend_errors"] == 0, f"{name}: {m}"
        assert admitted == sum(per_key.values())
        calls = sum(r["metrics"]["backend_calls"] for r in res.values())
        report.append(f"{len(res)} processes, backend calls {calls} for {admitted} admitted")
        if adaptive:
            # Rates at saturation: renewals, not requests, cost calls (fixed
            # leases make about 0.75 calls per admitted request here). The
            # Redis books are not balanced exactly: a rate is paid from the
            # refill on Redis' clock, and a closed worker's grant runs on to
            # its end.
            assert calls <= 0.2 * admitted, f"adaptive fleet: {calls} calls for {admitted} admitted"
            return report
        # Redis' books: every stored bucket equals its refill since T0 minus
        # what the fleet took and did not give back.
        stored = 0
        refill = 0
        for k in KEYS:
            # "credit refilled_at window epoch version"
            c, t, w = map(int, cli(port, "GET", f"{prefix}:{{{k}}}").split()[:3])
            assert w == WINDOW_MS, f"{k}: stored window {w}"
            stored += c
            refill += (t - t0) * LIMIT
        assert stored == refill - (leased - returned) * WINDOW_MS, (
            f"Redis holds {stored} units, expected {refill} - ({leased} - {returned}) * {WINDOW_MS}"
        )
        return report
    finally:
        redisctl("cluster-stop" if cluster else "stop", port)


def now_ms():
    return int(time.time() * 1000)


class Faults:
    """Fault windows as the driver saw them: each from just before the
    command that started it to just after the one that ended it."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.windows = []  # (label, start_ms, end_ms)
        self.open = None

    def begin(self, at_ms, label, action, *args):
        """At +at_ms: end the open window (if any) with `action` and open `label`."""
        t = self.end(at_ms, action, *args)
        self.open = (label, t)

    def end(self, at_ms, action, *args):
        """At +at_ms: run `action`, closing the open window; returns when it began."""
        self.fleet.wait_until(at_ms)
        t = now_ms()
        action(*args)
        if self.open:
            self.windows.append((*self.open, now_ms()))
        self.open = None
        return t


def policy_bounds(fleet, res, windows):
    """What each worker admitted during each fault window against what its
    failure policy allows; asserts the policy held, returns report lines.

    A decision is stamped with the time its call began, and a fallback
    decision can come after waiting out the backend timeout, so a window's
    span is widened by that wait. static-share: a worker's fallback bucket
    holds limit / expected_replicas per window and refills at that rate, so in
    a span T it admits at most share + share * T / window per key under
    fallback. deny: no fallback admission. allow: no fallback denial.
    Adaptive leasing: each worker's share is the fallback rate its last
    answer carried, uneven by design, and the live holders' rates sum to the
    key's: the static-share workers together admit at most limit + limit * T
    / window per key under fallback."""
    adaptive = getattr(fleet, "adaptive", False)
    share = LIMIT if adaptive else max(1, LIMIT // fleet.n)
    lines = []
    for label, a, b in windows:
        s0, s1 = fleet.slot(a), fleet.slot(b)
        span_ms = (s1 - s0 + 1) * SLOT_MS + fleet.timeout_ms + 100
        bound = share + -(-share * span_ms // WINDOW_MS)
        by_reason = {}
        worst = 0
        together = {k: 0 for k in KEYS}
        for name, r in res.items():
            fb = {k: [0, 0] for k in KEYS}
            for slot, key, reason, adm, den in r["timeline"]:
                if s0 <= slot <= s1:
                    by_reason.setdefault(reason, [0, 0])
                    by_reason[reason][0] += adm
                    by_reason[reason][1] += den
                    if reason == "fallback":
                        fb[key][0] += adm
                        fb[key][1] += den
            for k in KEYS:
                admitted, denied = fb[k]
                where = f"{name} ({r['policy']}), {k}, {label}"
                if r["policy"] == "static-share":
                    assert admitted <= bound, f"{where}: {admitted} fallback admissions > {bound}"
                    worst = max(worst, admitted)
                    together[k] += admitted
                elif r["policy"] == "deny":
                    assert admitted == 0, f"{where}: {admitted} fallback admissions under deny"
                else:
                    assert denied == 0, f"{where}: {denied} fallback denials under allow"
        if adaptive:
            for k in KEYS:
                assert together[k] <= bound, (
                    f"{k}, {label}: static-share workers admitted {together[k]} under fallback together > {bound}"
                )
            worst = max(together.values())
        counts = ", ".join(f"{reason} {v[0]}/{v[1]}" for reason, v in sorted(by_reason.items()))
        lines.append(
            f"{label} (+{(a - fleet.start_at) / 1000:.1f} s to +{(b - fleet.start_at) / 1000:.1f} s): "
            f"admitted/denied by reason: {counts}; static-share fallback per "
            f"{'key (all workers together)' if adaptive else 'worker and key'} "
            f"at most {worst} (policy allows {bound}), deny admitted 0, allow denied 0"
        )
    return lines


def fault_fleet(langs, duration_ms, inject, via_proxy=False, cluster=False, adaptive=False):
    """Run a fleet with mixed failure policies while `inject(port, proxy,
    faults)` breaks things; check each recovers and its policy held."""
    if cluster:
        ports = [int(p) for p in redisctl("cluster-start", 3, 1).split()]
        port = ports[0]
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:3])
    else:
        port = int(redisctl("start"))
        ports = [port]
    proxy = faultproxy("start", port) if via_proxy else None
    try:
        if not cluster:
            url = f"redis://127.0.0.1:{proxy or port}"
        prefix = f"flt{os.getpid()}x{time.time_ns() % 10**6}"
        fleet = Fleet(langs, url, prefix, duration_ms, policies=POLICIES, adaptive=adaptive)
        faults = Faults(fleet)
        notes = inject(ports, proxy, faults)
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
        healed = faults.windows[-1][2]
        ended = max(r["ended_at_ms"] for r in res.values())
        settled = ended - (fleet.start_at + duration_ms)
        policies = ", ".join(f"{n}: {r['policy']}" for n, r in res.items())
        whole = ("whole run", fleet.start_at, ended)
        summary = (
            f"admitted {total} by {len(res)} processes ({policies}); slowest acquire {slowest} ms; "
            f"last fault healed at +{(healed - fleet.start_at) / 1000:.1f} s; the last worker stopped "
            f"{max(0, settled)} ms after the deadline (a degraded worker goes on until it recovers)"
        )
        return notes + policy_bounds(fleet, res, [*faults.windows, whole]) + [summary]
    finally:
        if proxy:
            faultproxy("stop", proxy)
        redisctl("cluster-stop" if cluster else "stop", port)


def kill_and_restart(ports, proxy, faults):
    faults.begin(3000, "redis killed", redisctl, "kill", ports[0])
    faults.end(6000, redisctl, "restart", ports[0])
    return ["redis killed at +3 s, restarted empty at +6 s"]


def pause_and_resume(ports, proxy, faults):
    faults.begin(3000, "redis paused", redisctl, "pause", ports[0])
    faults.end(5000, redisctl, "resume", ports[0])
    return ["redis paused from +3 s to +5 s"]


def proxy_faults(ports, proxy, faults):
    faults.begin(2000, "400 ms latency", faultproxy, "set", proxy, "latency", 400)
    faults.begin(4000, "black hole", faultproxy, "set", proxy, "drop")
    faults.begin(6000, "resets", faultproxy, "set", proxy, "reset")
    faults.end(7000, faultproxy, "set", proxy, "pass")
    return ["proxy: 400 ms latency at +2 s, black hole at +4 s, resets at +6 s, healed at +7 s"]


def slot_owner(port, slot):
    """The port of the live master that node `port` says owns `slot`."""
    for line in cli(port, "CLUSTER", "NODES").splitlines():
        f = line.split()
        if "master" not in f[2] or "fail" in f[2]:
            continue
        for r in f[8:]:
            lo, _, hi = r.partition("-")
            if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                return int(f[1].split("@")[0].rsplit(":", 1)[1])
    return None


def cluster_master_killed(ports, proxy, faults):
    """SIGKILL the master that owns the hot key's slot; its replica takes over."""
    slot = int(cli(ports[0], "CLUSTER", "KEYSLOT", "hot"))
    victim = slot_owner(ports[0], slot)
    assert victim, f"no master owns slot {slot}"
    survivor = next(p for p in ports if p != victim)
    faults.begin(3000, f"master {victim} killed", redisctl, "kill", victim)

    def promoted():
        # Awaited, not timed: a live master other than the victim owns the slot.
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                owner = slot_owner(survivor, slot)
                if owner not in (None, victim):
                    return
            except RuntimeError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"no replica took over slot {slot} within 60 s")

    faults.end(3000, promoted)
    return [f"cluster: master {victim} (owner of the hot key's slot {slot}) killed at +3 s; a replica promoted"]


def check_policy_checks_can_fail():
    """The fault checks reject what each policy forbids (a check that cannot
    fail proves nothing): synthetic timelines, no processes."""

    class FakeFleet:
        n, start_at, timeout_ms = 2, 0, 300

        def slot(self, t_ms):
            return max(0, int(t_ms)) // SLOT_MS

    fleet, window = FakeFleet(), [("fault", 1000, 2000)]
    share = LIMIT // FakeFleet.n  # 1000 per second: the window allows ~2,400

    def worker(policy, *cells):
        return {"policy": policy, "timeline": [list(c) for c in cells]}

    fine = {
        "a": worker("static-share", (12, "hot", "fallback", share, 0), (15, "hot", "lease", 10**6, 0)),
        "b": worker("deny", (12, "hot", "fallback", 0, 500)),
        "c": worker("allow", (12, "hot", "fallback", 10**6, 0)),
    }
    policy_bounds(fleet, fine, window)  # within bounds: passes
    bad = {
        "static-share over its share": worker("static-share", (12, "hot", "fallback", 10 * share, 0)),
        "deny admitting": worker("deny", (12, "warm", "fallback", 1, 0)),
        "allow denying": worker("allow", (19, "hot", "fallback", 0, 1)),
    }
    for name, r in bad.items():
        try:
            policy_bounds(fleet, {"w": r}, window)
        except AssertionError:
            continue
        raise AssertionError(f"the fault checks accepted {name}")
    # Outside the window nothing is held against it.
    policy_bounds(fleet, {"w": worker("deny", (25, "hot", "fallback", 5, 0))}, window)
    # Adaptive: uneven shares are fine, but the static-share workers together
    # stay within the key's rate.
    fleet.adaptive = True
    span_ms = (fleet.slot(2000) - fleet.slot(1000) + 1) * SLOT_MS + fleet.timeout_ms + 100
    whole = LIMIT + -(-LIMIT * span_ms // WINDOW_MS)  # what the window allows the whole fleet
    policy_bounds(fleet, {"a": worker("static-share", (12, "hot", "fallback", whole * 9 // 10, 0))}, window)
    two = {n: worker("static-share", (12, "hot", "fallback", whole * 6 // 10, 0)) for n in ("a", "b")}
    try:
        policy_bounds(fleet, two, window)
    except AssertionError:
        pass
    else:
        raise AssertionError("the fault checks accepted adaptive static-share workers over the key's rate together")
    return [
        "static-share over its share, deny admitting, allow denying and (adaptive) static-share "
        "workers over the key's rate together are each rejected"
    ]


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
        ("the fault checks can fail", check_policy_checks_can_fail),
        ("steady fleet: bound, budget used, books balance", lambda: check_steady(langs, d)),
        ("steady fleet on a 3-master Redis Cluster: same checks", lambda: check_steady(langs, d, cluster=True)),
        (
            "adaptive leasing, steady fleet: bound, budget used, few calls, books balance",
            lambda: check_steady(langs, d, adaptive=True),
        ),
        (
            "adaptive leasing, redis killed and restarted empty",
            lambda: fault_fleet(langs, d, kill_and_restart, adaptive=True),
        ),
        ("redis killed and restarted empty", lambda: fault_fleet(langs, d, kill_and_restart)),
        ("redis paused", lambda: fault_fleet(langs, d, pause_and_resume)),
        ("tcp proxy latency, black hole, resets", lambda: fault_fleet(langs, d, proxy_faults, via_proxy=True)),
        (
            "redis cluster: a master killed, its replica promoted",
            lambda: fault_fleet(langs, d, cluster_master_killed, cluster=True),
        ),
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
