"""Python worker of the cross-language system test (see ../README.md)."""

import json
import sys
import threading
import time

from quotalease import Limiter


def main() -> None:
    job = json.loads(sys.argv[1])
    events: list[str] = []
    lock = threading.Lock()

    def on_event(kind: str, message: str) -> None:
        with lock:
            events.append(kind)

    limiter = Limiter(
        job["url"],
        limit=job["limit"],
        window_ms=job["window_ms"],
        lease_size=job.get("lease_size"),  # absent: adaptive leasing
        key_prefix=job["key_prefix"],
        on_backend_failure=job["on_backend_failure"],
        expected_replicas=job["expected_replicas"],
        backend_timeout_ms=job["backend_timeout_ms"],
        on_event=on_event,
    )
    schedule = [k for k, w in zip(job["keys"], job["weights"]) for _ in range(w)]
    pause = job["pause_us"] / 1e6
    start = job["start_at_ms"] / 1000
    end = start + job["duration_ms"] / 1000
    settle_end = end + job["settle_ms"] / 1000
    slot_ms = job["slot_ms"]
    # Optional: a progress line every progress_ms (for the soak's driver).
    progress_s = job.get("progress_ms", 0) / 1000
    next_progress = start
    while time.time() < start:
        time.sleep(0.001)
    admitted: dict[str, int] = {}
    reasons: dict[str, int] = {}
    # (slot, key, reason) -> [admitted, denied]
    timeline: dict[tuple[int, str, str], list[int]] = {}
    max_ms = 0.0
    i = 0
    while True:
        now = time.time()
        # Past the deadline, go on while degraded: recovery is awaited, not timed.
        if now >= settle_end or (now >= end and not limiter.metrics()["fallback_active"]):
            break
        if progress_s and now >= next_progress:
            m = limiter.metrics()
            progress = {
                "progress_at_ms": int(now * 1000),
                "fallback_active": m["fallback_active"],
                "fallback_transitions": m["fallback_transitions"],
                "reasons": reasons,
            }
            print(json.dumps(progress), flush=True)
            next_progress = now + progress_s
        key = schedule[i % len(schedule)]
        i += 1
        t = time.monotonic()
        d = limiter.acquire(key)
        max_ms = max(max_ms, (time.monotonic() - t) * 1000)
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
        cell = timeline.setdefault((int((now - start) * 1000) // slot_ms, key, d.reason), [0, 0])
        cell[0 if d.allowed else 1] += 1
        if d.allowed:
            admitted[key] = admitted.get(key, 0) + 1
        if pause:
            time.sleep(pause)
    ended_at_ms = int(time.time() * 1000)
    closed = True
    try:
        limiter.close()
    except Exception:
        closed = False
    with lock:
        seen = list(events)
    print(
        json.dumps(
            {
                "lang": "python",
                "admitted": admitted,
                "reasons": reasons,
                "metrics": limiter.metrics(),
                "events": seen,
                "closed": closed,
                "max_acquire_ms": int(max_ms),
                "ended_at_ms": ended_at_ms,
                "timeline": [[*k, *v] for k, v in timeline.items()],
            }
        )
    )


if __name__ == "__main__":
    main()
