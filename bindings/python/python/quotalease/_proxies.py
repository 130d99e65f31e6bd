"""The client's address behind trusted proxies, for the middleware's default key.

Behind a load balancer every request comes from the balancer's address, so a
key by peer address puts every client in one bucket. ``trusted_proxies`` says
which hops may be believed: an int (that many proxies in front of the app) or
CIDRs / addresses (``["10.0.0.0/8", "::1"]``). The chain is the
``X-Forwarded-For`` addresses (else RFC 7239 ``Forwarded`` ``for=``) followed
by the peer; it is walked from the right, past trusted hops, to the first
untrusted address. An untrusted peer's headers are ignored, and a malformed
entry on the walk gives the peer address: a client cannot pick its own key.
The Node (``proxies.js``) and Go (``proxies.go``) helpers do the same.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from ._native import ConfigError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: What ``trusted_proxies=`` accepts: None or 0 (trust nobody), a hop count,
#: or CIDRs / addresses (one str or several).
TrustedProxiesSpec = int | str | Iterable[str] | None


def parse_ip(text: str) -> Address | None:
    """``1.2.3.4``, ``1.2.3.4:80``, ``::1``, ``[::1]`` or ``[::1]:80`` (IPv4-mapped
    IPv6 read as IPv4); None for anything else (``unknown``, ``_hidden``)."""
    s = text.strip()
    if s.startswith("["):
        end = s.find("]")
        rest = s[end + 1 :]
        if end < 0 or (rest and not (rest[0] == ":" and rest[1:].isascii() and rest[1:].isdigit())):
            return None
        s = s[1:end]
    elif s.count(":") == 1:
        s, _, port = s.partition(":")
        if not (port.isascii() and port.isdigit()):
            return None
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _split(value: str, sep: str) -> list[str] | None:
    """``value`` split at ``sep`` outside quoted strings; None when a quote is open."""
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in value:
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if quoted:
        return None
    parts.append("".join(current))
    return parts


def _forwarded_for(element: str) -> str | None:
    """The ``for=`` value of one ``Forwarded`` element, unquoted (None: none)."""
    for pair in _split(element, ";") or ():
        name, eq, value = pair.partition("=")
        if eq and name.strip().lower() == "for":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].replace("\\", "")
            return value
    return None


def _chain(forwarded: str | None, x_forwarded_for: str | None) -> list[str | None]:
    """The header's hops, nearest last: X-Forwarded-For when present, else Forwarded."""
    if x_forwarded_for and x_forwarded_for.strip():
        return list(x_forwarded_for.split(","))
    if forwarded and forwarded.strip():
        elements = _split(forwarded, ",")
        return [None] if elements is None else [_forwarded_for(e) for e in elements]
    return []


class TrustedProxies:
    """A validated ``trusted_proxies`` setting; :meth:`client` applies it."""

    __slots__ = ("hops", "networks")

    def __init__(self, spec: TrustedProxiesSpec, who: str = "quotalease") -> None:
        self.hops = 0
        self.networks: tuple[Network, ...] = ()
        if spec is None:
            return
        if isinstance(spec, bool) or not isinstance(spec, (int, str, Iterable)):
            raise TypeError(
                f"{who}: trusted_proxies must be a hop count (int) or CIDRs such as ['10.0.0.0/8'], "
                f"not {type(spec).__name__}"
            )
        if isinstance(spec, int):
            if spec < 0:
                raise ConfigError(f"{who}: trusted_proxies must be a hop count >= 0, got {spec}")
            self.hops = spec
            return
        networks = []
        for entry in [spec] if isinstance(spec, str) else spec:
            if not isinstance(entry, str):
                raise TypeError(f"{who}: trusted_proxies entries must be str CIDRs, not {type(entry).__name__}")
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise ConfigError(
                    f"{who}: trusted_proxies: {entry!r} is not an IP address or CIDR (e.g. '10.0.0.0/8', '::1')"
                ) from None
        self.networks = tuple(networks)

    @property
    def enabled(self) -> bool:
        return self.hops > 0 or bool(self.networks)

    def _trusted(self, ip: Address, hop: int) -> bool:
        if self.hops:
            return hop < self.hops
        return any(ip in net for net in self.networks)

    def client(self, peer: str, forwarded: str | None, x_forwarded_for: str | None) -> str:
        """The client's address: ``peer`` unless it is trusted and the header's
        chain names an untrusted hop before a malformed one."""
        peer_ip = parse_ip(peer)
        if peer_ip is None or not self._trusted(peer_ip, 0):
            return peer
        found = None
        for hop, raw in enumerate(reversed(_chain(forwarded, x_forwarded_for)), start=1):
            ip = parse_ip(raw) if raw is not None else None
            if ip is None:
                return peer
            found = ip
            if not self._trusted(ip, hop):
                break
        # Every hop trusted: the furthest one is as near the client as we can tell.
        return peer if found is None else str(found)


def asgi_forwarding(scope: Any) -> tuple[str | None, str | None]:
    """``(Forwarded, X-Forwarded-For)`` of an ASGI scope, repeated fields joined."""
    forwarded: list[str] = []
    xff: list[str] = []
    for name, value in scope.get("headers") or ():
        name = bytes(name).lower()
        if name == b"x-forwarded-for":
            xff.append(bytes(value).decode("latin-1"))
        elif name == b"forwarded":
            forwarded.append(bytes(value).decode("latin-1"))
    return (",".join(forwarded) or None, ",".join(xff) or None)


def environ_client(proxies: TrustedProxies, environ: Any) -> str:
    """The client's address from a WSGI ``environ`` (or Django's ``META``)."""
    peer = environ.get("REMOTE_ADDR")
    if not peer:
        return "unknown"
    return proxies.client(str(peer), environ.get("HTTP_FORWARDED"), environ.get("HTTP_X_FORWARDED_FOR"))


def default_key_check(proxies: TrustedProxies, key: object, default: object, who: str) -> None:
    """``trusted_proxies`` changes the default key only: with a key of one's own it is a mistake."""
    if proxies.enabled and key is not default:
        raise TypeError(
            f"{who}: trusted_proxies applies to the default key (the client's address); "
            "give key= or trusted_proxies=, not both"
        )
