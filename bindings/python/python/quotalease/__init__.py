"""quotalease: a rate limiter whose limit holds across every instance of a service.

Each process keeps a local lease of tokens per key and admits requests from it
with no network call; a broker thread borrows chunks of tokens from one
authoritative token bucket per key (Redis, or the in-process ``memory://``).

    from quotalease import Limiter

    limiter = Limiter("redis://127.0.0.1:6379", rate="600/min")
    decision = limiter.acquire("user:42")
    if not decision:
        ...  # 429, with decision.headers()

Errors: every exception raised for a wrong *value* derives from
:class:`QuotaLeaseError` (ConfigError, InvalidKeyError and InvalidCostError are
also ValueError; ClosedError is also a RuntimeError). A Redis URL the server
refuses (wrong password, database, scheme, protocol, ACL) raises
MisconfiguredError from ``acquire`` and ``check()``: it is not an outage, so no
failure policy hides it. ``Reservation.settle`` raises ReservationError (also a
ValueError) when settled twice, for a denied reservation, or for a negative
actual cost, and ``Permit.release`` raises it when released twice or for a
denied permit. A wrong *type* (a key that is not a str, a cost that is not an int,
an option given as a bool or a list) raises TypeError.
"""

from __future__ import annotations

import asyncio
import atexit
import os
from types import TracebackType

from . import _native
from ._native import (
    BackendError,
    ClosedError,
    ConfigError,
    Decision,
    InvalidCostError,
    InvalidKeyError,
    MisconfiguredError,
    Permit,
    QuotaLeaseError,
    Reservation,
    ReservationError,
    http_key,
    metrics_prometheus,
)

__version__: str = _native.__version__

__all__ = [
    "BackendError",
    "ClosedError",
    "ConfigError",
    "Decision",
    "InvalidCostError",
    "InvalidKeyError",
    "Limiter",
    "MisconfiguredError",
    "Permit",
    "QuotaLeaseError",
    "Reservation",
    "ReservationError",
    "__version__",
    "http_key",
    "metrics_prometheus",
]

# The broker thread calls into Python (asyncio completions, logging): stop it
# before the interpreter finalises, and forget its in-flight calls after fork.
atexit.register(_native._shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_native._after_fork_in_child)


class Limiter(_native.Limiter):
    """A distributed rate limiter.

    ``Limiter(url="memory://", *, limit=None, window_ms=None, rate=None,
    overshoot_budget=None, lease_size=None, refill_threshold=None, lease_ttl_ms=None,
    on_backend_failure="static-share", expected_replicas=None,
    backend_timeout_ms=None, key_prefix="ql", max_keys=None, mode="lease",
    clock=None, clock_start_ms=None, tiers=None, default_tier=None,
    policy_file=None, policy_refresh_ms=None, shadow=False, concurrency=None,
    on_event=None)``

    Give ``limit`` (tokens per window) and ``window_ms`` (default 60000), or
    ``rate="600/min"`` (not both). ``rate`` (and each rule of ``tiers``) may
    instead be a calendar quota, at most N in each calendar period of an IANA
    time zone: ``"1000/day@UTC"``, ``"N/week@ZONE"`` (weeks start on Monday),
    ``"1000000/month@Europe/Berlin"``, ``"N/year@ZONE"``, or a month from a
    billing day, ``"500/month@billing-day-15"`` (UTC) or
    ``"500/month@billing-day-15 America/New_York"``; the whole quota comes
    back at the period's start. It needs adaptive leasing (no ``lease_size``,
    mode "lease"). Options left as None take the engine's
    defaults (adaptive leasing: leases sized by demand under
    ``overshoot_budget``, "auto": 2 % of the limit, more for a few busy
    instances of a large key; ``lease_size``
    pins fixed leases instead; lease_ttl_ms 2000;
    expected_replicas 1; backend_timeout_ms 250; max_keys 100000). The
    engine checks every option by name: a misspelt keyword raises
    ConfigError with a suggestion ("did you mean `lease_size`?").
    ``clock="manual"`` starts at 1,000,000 ms unless ``clock_start_ms`` says
    otherwise.

    Plan tiers: ``tiers="free=100/min; pro=6000/min, 1000000/day"`` names sets
    of rules (a key is admitted only when every rule of its set admits), and
    ``acquire(key, tier="pro")`` picks one (``default_tier`` when none is
    named). A key's entry in the shared policy store (``policy_assign``) or in
    ``policy_file`` wins over the tier named; every limiter on the same
    backend that sets ``policy_refresh_ms`` (e.g. 1000) reads the store that
    often (the default, 0, follows no store and polls nothing).

    Reserve, then settle: ``r = limiter.reserve(key, estimate)`` decides on
    an estimate of a request's cost (``r.allowed``, ``r.decision``) and
    ``r.settle(actual)`` pays what it really cost once known: below the
    estimate the rest goes back, above it the key takes the difference, into
    debt if need be. Left unsettled (a ``with`` block exited, the object
    dropped), it keeps the estimate.

    Concurrency limits: ``concurrency=N`` (or ``"N concurrent"`` among a
    tier's or a key's rules, ``tier=`` chosen as in ``acquire``) allows at
    most N requests of a key in flight at once across the fleet. ``with limiter.acquire_concurrent(key)
    as permit:`` takes a permit (``permit.allowed``, ``permit.decision``:
    ``limit`` is N, ``remaining`` the permits left) and leaving the block
    releases it (or ``permit.release()``, once); ``async with await
    limiter.acquire_concurrent_async(key) as permit:`` in asyncio. Beyond
    the N, only the permits of instances that died holding them count, until
    their commitments expire at the backend (7 s after their last call). A
    released permit goes back at once, for any instance to take. It needs
    adaptive leasing (no ``lease_size``, mode "lease").

    ``on_event(kind, message)`` is called from the broker thread on every
    backend transition ("degraded" / "recovered"), which is also logged on the
    ``quotalease`` logger (ERROR / WARNING).

    Thread-safe: share one limiter between threads. Safe across ``os.fork()``:
    the child drops the parent's leased tokens and starts its own broker.
    """

    __slots__ = ()

    async def acquire_async(
        self, key: str, cost: int = 1, *, tier: str | None = None, wait_ms: int | None = None
    ) -> Decision:
        """Like :meth:`acquire`, but awaits a pending lease (or, with
        ``wait_ms``, the tokens) instead of blocking the event loop."""
        r = self._acquire_or_future(key, cost, tier=tier, wait_ms=wait_ms)
        if isinstance(r, Decision):
            return r
        return await r

    async def reserve_async(self, key: str, estimate: int, *, tier: str | None = None) -> Reservation:
        """Like :meth:`reserve`, but awaits a pending lease instead of
        blocking the event loop: ``async with await limiter.reserve_async(key, 500) as r:``."""
        r = self._reserve_or_future(key, estimate, tier=tier)
        if isinstance(r, Reservation):
            return r
        return await r

    async def acquire_concurrent_async(self, key: str, *, tier: str | None = None) -> Permit:
        """Like :meth:`acquire_concurrent`, but awaits a pending lease instead
        of blocking the event loop: ``async with await
        limiter.acquire_concurrent_async(key) as permit:``."""
        p = self._acquire_concurrent_or_future(key, tier=tier)
        if isinstance(p, Permit):
            return p
        return await p

    async def check_async(self) -> None:
        """Like :meth:`check` (connect now and run a read-only probe: None,
        MisconfiguredError or BackendError), without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.check)

    async def __aenter__(self) -> Limiter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # close() flushes leases back to the backend: keep the loop free.
        await asyncio.get_running_loop().run_in_executor(None, self.close)
