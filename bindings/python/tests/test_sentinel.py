"""`redis+sentinel://` reaches the core unchanged: a lease from the primary the
sentinels name (tests/harness/redisctl sentinel-start), the URL redacted in
repr, and a malformed Sentinel URL a ConfigError."""

from __future__ import annotations

import pytest

from conftest import redisctl, unique
from quotalease import ConfigError, Limiter, MisconfiguredError


def test_leases_through_sentinel() -> None:
    ports = redisctl("sentinel-start").split()
    try:
        sentinels = ",".join(f"127.0.0.1:{p}" for p in ports[2:])
        url = f"redis+sentinel://:py-s3cret@{sentinels}/mymaster?sentinel_password="
        with pytest.raises(ConfigError):
            Limiter(url.replace("/mymaster", ""), limit=10)
        # The primary has no password, so AUTH with one fails: the URL's
        # credentials reach the core's connection as given, and the refusal
        # is a configuration error, not an outage.
        bad = Limiter(url.replace("?sentinel_password=", ""), limit=10, backend_timeout_ms=1000)
        with pytest.raises(MisconfiguredError) as e:
            bad.acquire("k")
        assert "py-s3cret" not in str(e.value)
        assert "py-s3cret" not in repr(bad)
        assert f"redis+sentinel://***@{sentinels}/mymaster" in repr(bad)
        prefix = unique("sentinel")
        lim = Limiter(f"redis+sentinel://{sentinels}/mymaster", limit=10, lease_size=5, key_prefix=prefix)
        d = lim.acquire("k")
        assert d and d.reason == "lease"
        assert lim.inspect("k")["authority_tokens"] == 5
        lim.close()
    finally:
        redisctl("sentinel-stop", ports[0])
