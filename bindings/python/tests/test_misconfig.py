"""A Redis URL the server refuses is a configuration error, not an outage
(issue 25): acquire (every form) and check() raise MisconfiguredError naming
the host, never the password; a good URL passes check(); Prometheus labels
let two limiters share one exposition that a real Prometheus parser reads
with no repeated family."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

import quotalease
from conftest import RedisServer, unique
from quotalease import BackendError, ConfigError, Limiter, MisconfiguredError, QuotaLeaseError

PW = "s3cret-pw-XYZ"


def limiter(url: str) -> Limiter:
    return Limiter(url, limit=100, backend_timeout_ms=1000, key_prefix=unique("mis"))


def assert_misconfigured(e: pytest.ExceptionInfo[MisconfiguredError], host: str) -> None:
    text = str(e.value)
    assert isinstance(e.value, QuotaLeaseError)
    assert host in text, text
    assert "authentication failed" in text, text
    assert PW not in text, text


async def test_a_wrong_password_raises_from_acquire_and_check(own_redis: RedisServer) -> None:
    own_redis.cli("CONFIG", "SET", "requirepass", "the-right-one")
    host = f"127.0.0.1:{own_redis.port}"
    lim = limiter(f"redis://:{PW}@{host}")
    with pytest.raises(MisconfiguredError) as e:
        lim.check()
    assert_misconfigured(e, host)
    with pytest.raises(MisconfiguredError) as e:
        await lim.check_async()
    assert_misconfigured(e, host)
    for call in (lambda: lim.acquire("k"), lambda: lim.try_acquire("k")):
        with pytest.raises(MisconfiguredError) as e:
            call()
        assert_misconfigured(e, host)
    with pytest.raises(MisconfiguredError) as e:
        await lim.acquire_async("other")
    assert_misconfigured(e, host)
    assert lim.metrics()["admitted"] == 0
    # The right password: check() passes, acquire leases.
    good = limiter(f"redis://:the-right-one@{host}")
    good.check()
    await good.check_async()
    assert good.acquire("k").reason == "lease"


def test_check_on_memory_and_on_a_closed_port() -> None:
    Limiter(limit=10).check()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError) as e:
        limiter(f"redis://:{PW}@127.0.0.1:{port}").check()
    assert PW not in str(e.value)


def test_two_labelled_limiters_make_one_valid_exposition() -> None:
    api, route = Limiter(limit=10), Limiter(limit=5)
    api.acquire("k")
    text = quotalease.metrics_prometheus([(api, {"limiter": "api"}), (route, {"limiter": 'per"route'})])
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), f"a family repeats: {names}"
    admitted = next(f for f in families if f.name == "quotalease_admitted")
    assert {(s.labels["limiter"], s.value) for s in admitted.samples} == {("api", 1.0), ('per"route', 0.0)}
    # the old way, concatenating two texts, repeats every family
    naive = api.metrics_prometheus() + route.metrics_prometheus()
    assert naive.count("# TYPE quotalease_admitted_total counter") == 2
    one = api.metrics_prometheus(labels={"limiter": "api"})
    assert 'quotalease_admitted_total{limiter="api"} 1' in one


@pytest.mark.parametrize("labels", [{"1bad": "x"}, {"__name__": "x"}, {"a-b": "x"}])
def test_a_bad_label_name_is_a_config_error(labels: dict[str, str]) -> None:
    lim = Limiter(limit=10)
    with pytest.raises(ConfigError, match="labels"):
        lim.metrics_prometheus(labels=labels)
    with pytest.raises(ConfigError, match="labels"):
        quotalease.metrics_prometheus([(lim, labels)])
    with pytest.raises(ConfigError, match="same labels"):
        quotalease.metrics_prometheus([(lim, {"l": "x"}), (Limiter(limit=1), {"l": "x"})])
    with pytest.raises(TypeError):
        lim.metrics_prometheus(labels={"a": 1})  # type: ignore[dict-item]
