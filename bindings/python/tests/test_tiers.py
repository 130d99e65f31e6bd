"""Plan tiers, several rules per key and the shared policy store (issue 15)
through the Python API: acquire/try_acquire/acquire_async naming a tier, the
decision's rules, inspect and policy(), the store calls on a shared
memory://NAME and on a real redis-server, the policy file, and bad input."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import PATIENT, RedisServer, unique
from quotalease import ClosedError, ConfigError, InvalidCostError, InvalidKeyError, Limiter

TIERS = "free=2/s; pro=4/s"


def tiered(url: str = "memory://", **options: Any) -> Limiter:
    opts: dict[str, Any] = {
        "limit": 100,
        "window_ms": 1000,
        "lease_size": 1,
        "refill_threshold": 0,
        "tiers": TIERS,
        "clock": "manual",
        "backend_timeout_ms": PATIENT,
        "policy_refresh_ms": 1000,
        **options,
    }
    return Limiter(url, **opts)


def admitted(lim: Limiter, key: str, n: int, tier: str | None = None) -> int:
    return sum(1 for _ in range(n) if lim.acquire(key, tier=tier))


def test_a_tier_named_by_the_caller_or_the_default_tier_picks_the_rules() -> None:
    lim = tiered(default_tier="free")
    assert [bool(lim.acquire("a")) for _ in range(3)] == [True, True, False]
    assert lim.acquire("a", tier=None).limit == 2  # None is the default tier
    d = lim.acquire("b", tier="pro")
    assert (d.allowed, d.limit, d.window_ms, d.remaining, d.rule, d.rules) == (True, 4, 1000, 3, 0, ((4, 1000),))
    assert lim.try_acquire("b", tier="pro").remaining == 2
    assert asyncio.run(lim.acquire_async("b", tier="pro")).remaining == 1
    assert lim.acquire("b", tier="pro").remaining == 0
    assert not lim.acquire("b", tier="pro")
    # cost is checked against the tier's limit
    with pytest.raises(InvalidCostError):
        lim.acquire("c", 5, tier="pro")
    assert lim.acquire("c", 4, tier="pro").remaining == 0
    # without a tier and without a default tier: the limiter's limit
    plain = tiered()
    assert plain.acquire("a").limit == 100


def test_an_unknown_tier_is_the_cores_config_error() -> None:
    lim = tiered()
    message = (
        'invalid configuration: unknown tier "gold" (known tiers: free, pro); '
        "define it in `tiers`, the policy file or the store"
    )
    calls: list[Callable[[], object]] = [
        lambda: lim.acquire("k", tier="gold"),
        lambda: lim.try_acquire("k", tier="gold"),
        lambda: asyncio.run(lim.acquire_async("k", tier="gold")),
        lambda: lim.policy("k", "gold"),
    ]
    for call in calls:
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value) == message
        assert isinstance(e.value, ValueError)
    assert lim.metrics()["admitted"] == 0 and lim.metrics()["denied"] == 0
    # a bad default tier or tier definition fails at construction, naming the option
    with pytest.raises(ConfigError, match="default_tier"):
        tiered(default_tier="gold")
    for bad in ["x=1/fortnight", "x=1/s, 2/s", "b@d=1/s", "free"]:
        with pytest.raises(ConfigError, match="`tiers`"):
            tiered(tiers=bad)


def test_wrong_types_are_type_errors() -> None:
    lim = tiered()
    for bad in [1, b"pro", ["pro"], True]:
        with pytest.raises(TypeError, match=r"`tier` must be a str or None \(got "):
            lim.acquire("k", tier=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="`tier` must be a str or None"):
            lim.try_acquire("k", tier=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="`tier` must be a str or None"):
            asyncio.run(lim.acquire_async("k", tier=bad))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="`tier` must be a str or None"):
            lim.policy("k", bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lim.acquire("k", 1, "pro")  # type: ignore[call-arg]  # tier is keyword-only
    with pytest.raises(TypeError, match="`name` must be a str"):
        lim.policy_set_tier(1, "1/s")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`rules` must be a str"):
        lim.policy_set_tier("x", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`name` must be a str"):
        lim.policy_delete_tier(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`assignment` must be a str"):
        lim.policy_assign("k", ("tier", "pro"))  # type: ignore[arg-type]
    not_str: Any = 5  # a key that is not a str
    untyped: list[Callable[[], object]] = [
        lambda: lim.policy_assign(not_str, "1/s"),
        lambda: lim.policy_get(not_str),
        lambda: lim.policy_unassign(not_str),
    ]
    for call in untyped:
        with pytest.raises(TypeError):
            call()
    # the options are typed by the core: a list or a bool is no value for them
    with pytest.raises(TypeError, match="`tiers` must be a str"):
        Limiter(limit=1, tiers=["free=1/s"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`policy_refresh_ms` must be an int"):
        Limiter(limit=1, policy_refresh_ms=True)


def test_two_rules_report_the_binding_rule_and_list_every_policy() -> None:
    lim = tiered(tiers="burst=2/s, 3/10s")
    first = lim.acquire("k", tier="burst")
    assert first.rules == ((2, 1000), (3, 10_000))
    assert (first.allowed, first.rule, first.limit, first.remaining) == (True, 0, 2, 1)
    assert first.headers() == {
        "RateLimit-Policy": '"1s";q=2;w=1, "10s";q=3;w=10',
        "RateLimit": f'"1s";r=1;t={-(-first.reset_after_ms // 1000)}',
    }
    assert lim.acquire("k", tier="burst")
    assert not lim.acquire("k", tier="burst")  # the 1 s rule denies
    lim.advance_clock(1000)
    third = lim.acquire("k", tier="burst")
    assert (third.allowed, third.rule, third.limit, third.window_ms, third.remaining) == (True, 1, 3, 10_000, 0)
    denied = lim.acquire("k", tier="burst")
    assert (denied.allowed, denied.rule, denied.limit, denied.reason) == (False, 1, 3, "exhausted")
    h = denied.headers()
    assert h["RateLimit-Policy"] == '"1s";q=2;w=1, "10s";q=3;w=10'
    assert h["RateLimit"].startswith('"10s";r=0;t=')
    assert int(h["Retry-After"]) == -(-denied.retry_after_ms // 1000) >= 1
    assert repr(denied).endswith(", rule=1, rules=((2, 1000), (3, 10000)))")
    # the 1 s rule's token went back when the 10 s rule denied: counted once, as denied
    m = lim.metrics()
    assert (m["admitted"], m["denied"]) == (3, 2)
    info = lim.inspect("k")
    assert (info["rules"], info["tier"]) == ("2/s, 3/10s", "burst")
    assert info["policy_source"] == "tier burst (assigned by caller, defined in config)"
    assert (info["limit"], info["window_ms"]) == (2, 1000)  # the first rule's
    # a key with one rule keeps its single "default" policy
    one = lim.acquire("solo")
    assert one.rules == ((100, 1000),) and one.headers()["RateLimit-Policy"] == '"default";q=100;w=1'
    assert lim.inspect("solo")["tier"] is None


def test_policy_and_tiers_say_where_rules_come_from() -> None:
    lim = tiered(default_tier="free")
    assert lim.tiers() == {
        "free": {"rules": ((2, 1000),), "defined_by": "config"},
        "pro": {"rules": ((4, 1000),), "defined_by": "config"},
    }
    assert lim.policy("u") == {
        "rules": ((2, 1000),),
        "tier": "free",
        "assigned_by": "default_tier",
        "defined_by": "config",
        "access": None,
        "source": "tier free (assigned by default_tier, defined in config)",
    }
    assert lim.policy("u", "pro")["assigned_by"] == "caller"
    lim.set_limit("own", 7, 60_000)
    assert lim.policy("own", "pro") == {
        "rules": ((7, 60_000),),
        "tier": None,
        "assigned_by": "set_limit",
        "defined_by": "set_limit",
        "access": None,
        "source": "own rules (from set_limit)",
    }
    with pytest.raises(InvalidKeyError):
        lim.policy("")


def test_the_store_is_shared_by_the_limiters_of_one_memory_name() -> None:
    url = f"memory://{unique('store')}"
    a, b = tiered(url), tiered(url)
    assert admitted(b, "u1", 5, "pro") == 4
    v1 = a.policy_set_tier("pro", "8/s, 100/hour")
    assert isinstance(v1, int) and v1 >= 1
    assert a.tiers()["pro"] == {"rules": ((8, 1000), (100, 3_600_000)), "defined_by": "store"}
    b.refresh_policies()
    assert b.tiers()["pro"]["defined_by"] == "store"
    b.advance_clock(1000)
    assert admitted(b, "u1", 10, "pro") == 8
    assert b.policy("u1", "pro")["source"] == "tier pro (assigned by caller, defined in store)"
    # a key's own entry wins over the tier its callers name
    v2 = a.policy_assign("u2", "tier:free")
    assert v2 > v1
    b.refresh_policies()
    assert admitted(b, "u2", 5, "pro") == 2
    assert b.policy("u2", "pro")["tier"] == "free"
    info = b.inspect("u2")
    assert info["tier"] == "free" and "assigned by store" in str(info["policy_source"])
    a.policy_assign("u3", "2/s, 5/min")
    b.refresh_policies()
    assert admitted(b, "u3", 5) == 2
    assert b.acquire("u3").rules == ((2, 1000), (5, 60_000))
    # the entries as stored, and the whole store
    assert b.policy_get("u2") == "tier:free"
    assert b.policy_get("u3") == "2/s, 5/min"
    assert b.policy_get("nobody") is None
    listing = b.policy_list()
    assert listing == {
        "version": listing["version"],
        "tiers": {"pro": "8/s, 100/hour"},
        "keys": {"u2": "tier:free", "u3": "2/s, 5/min"},
    }
    assert listing["version"] >= v2 + 1
    # removing the entries gives the configuration's definitions back
    a.policy_delete_tier("pro")
    a.policy_unassign("u2")
    b.refresh_policies()
    assert b.tiers()["pro"] == {"rules": ((4, 1000),), "defined_by": "config"}
    b.advance_clock(1000)
    assert admitted(b, "u2", 5, "pro") == 4
    assert b.policy_list()["tiers"] == {} and list(b.policy_list()["keys"]) == ["u3"]
    # bad input: the core's typed errors, nothing written
    before = b.policy_list()["version"]
    with pytest.raises(ConfigError, match="names are 1 to 64"):
        a.policy_set_tier("b@d", "1/s")
    with pytest.raises(ConfigError, match="`rules`"):
        a.policy_set_tier("ok", "1/fortnight")
    with pytest.raises(ConfigError):
        a.policy_assign("k", "tier:")
    with pytest.raises(ConfigError, match="`policy`"):
        a.policy_assign("k", "often")
    with pytest.raises(InvalidKeyError):
        a.policy_assign("", "1/s")
    with pytest.raises(InvalidKeyError):
        a.policy_get("x" * 513)
    assert b.policy_list()["version"] == before
    a.close()
    after_close: list[Callable[[], object]] = [
        a.policy_list,
        a.refresh_policies,
        lambda: a.policy_get("u3"),
        lambda: a.acquire("u3", tier="pro"),
    ]
    for call in after_close:
        with pytest.raises(ClosedError):
            call()
    b.close()


def test_the_redis_store_reaches_another_limiter(redis_server: RedisServer) -> None:
    prefix = unique("tiers")
    a = tiered(redis_server.url, key_prefix=prefix)
    b = tiered(redis_server.url, key_prefix=prefix)
    try:
        a.policy_set_tier("gold", "3/min")
        a.policy_assign("cust", "2/min")
        b.refresh_policies()
        assert b.tiers()["gold"] == {"rules": ((3, 60_000),), "defined_by": "store"}
        # the cold path (GIL released) and the asyncio path both name the tier
        assert admitted(b, "g1", 5, "gold") == 3

        async def five() -> list[bool]:
            return [bool(await b.acquire_async("g2", tier="gold")) for _ in range(5)]

        assert asyncio.run(five()) == [True, True, True, False, False]
        assert admitted(b, "cust", 4, "gold") == 2
        assert b.try_acquire("cust", tier="gold").limit == 2
        assert b.policy_get("cust") == "2/min"
        listing = b.policy_list()
        assert (listing["tiers"], listing["keys"]) == ({"gold": "3/min"}, {"cust": "2/min"})
    finally:
        a.close()
        b.close()


def test_policy_file_and_refresh_options(tmp_path: Path) -> None:
    path = tmp_path / "policies.toml"
    path.write_text(
        'default_tier = "free"\n[tiers]\nfree = "4/s"\nteam = ["10/s", "100/min"]\n[keys]\n"vip" = "tier:team"\n'
    )
    lim = Limiter(policy_file=str(path), policy_refresh_ms=50, clock="manual", lease_size=1)
    assert admitted(lim, "anyone", 6) == 4
    assert admitted(lim, "vip", 12) == 10
    assert lim.policy("vip") == {
        "rules": ((10, 1000), (100, 60_000)),
        "tier": "team",
        "assigned_by": "file",
        "defined_by": "file",
        "access": None,
        "source": "tier team (assigned by file, defined in file)",
    }
    assert lim.tiers()["team"]["defined_by"] == "file"
    # the file changes: followed at the next refresh (a newer modification time)
    path.write_text('default_tier = "free"\n[tiers]\nfree = "2/s"\n')
    later = time.time() + 5
    os.utime(path, (later, later))
    lim.refresh_policies()
    lim.advance_clock(1000)
    assert admitted(lim, "anyone", 5) == 2
    lim.close()
    # by default (policy_refresh_ms=0): no shared store, the file is read once
    once = Limiter(policy_file=str(path))
    assert once.acquire("x").limit == 2
    with pytest.raises(ConfigError, match="policy_refresh_ms"):
        once.refresh_policies()
    with pytest.raises(ConfigError, match="`policy_file`"):
        Limiter(policy_file=str(tmp_path / "missing.toml"))


def test_shadow_mode_admits_what_the_rules_deny_and_counts_it() -> None:
    lim = tiered(tiers="beta=shadow 2/s; free=2/s")
    got = [lim.acquire("k", tier="beta") for _ in range(5)]
    assert all(d.allowed for d in got)
    shadowed = [d for d in got if d.reason == "shadow"]
    assert len(shadowed) == 3
    assert all(d.headers() == {} and d.remaining == 0 and d.retry_after_ms > 0 for d in shadowed)
    assert [lim.acquire("j", tier="free").allowed for _ in range(3)] == [True, True, False]
    m = lim.metrics()
    assert (m["shadow_denied"], m["denied"]) == (3, 4)
    assert "quotalease_shadow_denied_total 3\n" in lim.metrics_prometheus()
    everything = Limiter(limit=1, window_ms=60_000, shadow=True)
    assert [everything.acquire("x").reason for _ in range(2)] == ["lease", "shadow"]

    async def main() -> str:
        return (await everything.acquire_async("x")).reason

    assert asyncio.run(main()) == "shadow"


def test_allow_and_deny_entries_have_reasons_of_their_own() -> None:
    url = f"memory://{unique('access')}"
    a, b = tiered(url), tiered(url)
    a.policy_assign("bot", "blocked")
    a.policy_assign("ops", "unlimited")
    b.refresh_policies()
    bot = [b.acquire("bot") for _ in range(3)]
    assert [(d.allowed, d.reason) for d in bot] == [(False, "blocked")] * 3
    assert list(bot[0].headers()) == ["Retry-After"]
    ops = [b.acquire("ops") for _ in range(300)]
    assert all(d.allowed and d.reason == "unlimited" and d.headers() == {} for d in ops)
    assert b.metrics()["tokens_leased"] == 0
    p = b.policy("bot")
    assert (p["access"], p["source"]) == ("blocked", "blocked (from store)")
    assert b.policy("anyone")["access"] is None
    assert b.policy_get("ops") == "unlimited"
