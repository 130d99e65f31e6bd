"""Case (a) of make bench-fleet: one Python process offering a fixed rate on one key.

argv[1] is a JSON job: url, key_prefix, key, limit, window_ms, lease_size (null:
adaptive leasing), rate (requests offered per second), start_at_ms, duration_ms.
Requests are paced by a schedule (request i is due at start + i / rate), so the
offered count does not depend on how fast the limiter answers. Prints one JSON line.
"""

import json
import sys
import time

from quotalease import Limiter


def main() -> None:
    job = json.loads(sys.argv[1])
    events: list = []  # [ms since the start, kind, message]: the outages this process saw
    limiter = Limiter(
        job["url"],
        limit=job["limit"],
        window_ms=job["window_ms"],
        lease_size=job["lease_size"],
        key_prefix=job["key_prefix"],
        on_event=lambda kind, msg: events.append([int(time.time() * 1000) - job["start_at_ms"], kind, msg]),
    )
    key, rate = job["key"], job["rate"]
    start = job["start_at_ms"] / 1000
    end = start + job["duration_ms"] / 1000
    while time.time() < start:
        time.sleep(0.001)
    offered = admitted = 0
    denied_by: dict[str, int] = {}  # reason of each denial: where false denials come from
    first_ms = last_ms = 0
    per_second: list[list[int]] = []  # [backend_calls, admitted] at each whole second
    while True:
        now = time.time()
        if now >= end:
            break
        while len(per_second) < int(now - start):
            m = limiter.metrics()
            per_second.append([m["backend_calls"], m["admitted"]])
        due = int((now - start) * rate)
        while offered < due:
            if not first_ms:
                first_ms = int(time.time() * 1000)
            d = limiter.acquire(key)
            if d.allowed:
                admitted += 1
            else:
                denied_by[d.reason] = denied_by.get(d.reason, 0) + 1
            offered += 1
        last_ms = int(time.time() * 1000)
        time.sleep(0.001)
    run = limiter.metrics()
    per_second.append([run["backend_calls"], run["admitted"]])
    limiter.close()
    print(
        json.dumps(
            {
                "lang": "python",
                "rate": rate,
                "offered": offered,
                "admitted": admitted,
                "first_ms": first_ms,
                "last_ms": last_ms,
                "metrics": run,
                "metrics_closed": limiter.metrics(),
                "per_second": per_second,
                "denied_by": denied_by,
                "events": events,
            }
        )
    )


if __name__ == "__main__":
    main()
