"""Django: a middleware for the whole site and a decorator per view.

    # settings.py
    MIDDLEWARE = [..., "quotalease.django.RateLimitMiddleware"]
    QUOTALEASE = {
        "URL": "redis://127.0.0.1:6379",   # default "memory://" (one process only)
        "RATE": "600/min",                 # the middleware's limit
        "KEY": "header:X-Api-Key",         # "ip" (default), "header:NAME", a function or its dotted path
        "TRUSTED_PROXIES": 1,              # behind one load balancer: "ip" is the client, not the balancer
    }

    # views.py
    from quotalease.django import ratelimit

    @ratelimit(rate="10/min", key="ip")
    def search(request): ...

Settings (``settings.QUOTALEASE``, a dict; every entry optional):

- ``URL``: the authority of every limiter built from settings (``memory://``).
- ``PASSWORD``: the Redis password, put into ``URL`` (percent-encoded) when the
  limiters are built. Django's error reports (the DEBUG page, the e-mails to
  ``ADMINS``) list the settings and hide only entries whose names look secret
  (``PASS``, ``KEY``...), so a password inside ``URL`` would be shown there.
- ``OPTIONS``: more limiter options for them, e.g. ``{"expected_replicas": 6}``.
- ``RATE``: the middleware's rate; or ``LIMITER``: a :class:`quotalease.Limiter`
  (or its dotted path) for the middleware instead. One of the two is needed
  when the middleware is installed.
- ``KEY``: the key of a request: ``"ip"`` (``REMOTE_ADDR``, the default),
  ``"header:NAME"``, or a function ``key(request) -> str | None`` (None: not
  limited) or its dotted path. The decorator's ``key=`` defaults to it too.
- ``TRUSTED_PROXIES``: behind a load balancer or reverse proxy, the ``"ip"`` key
  is the client's address from ``X-Forwarded-For`` (else ``Forwarded``), read
  only through trusted hops: a hop count (``1``: one proxy in front) or CIDRs
  (``["10.0.0.0/8"]``). Default: none trusted (``REMOTE_ADDR``). Other keys
  ignore it.
- ``COST``: an int or ``cost(request) -> int``; ``SKIP``: ``skip(request) -> bool``
  (true: not limited); ``TIER``: a plan tier or ``tier(request)``, handed to
  ``acquire`` for limiters with tiers; ``WAIT_MS``: wait up to that long for
  the tokens instead of denying (async views await it).
- ``DENIED``: ``denied(request, decision) -> HttpResponse`` instead of the 429
  answer every quotalease middleware sends (``application/problem+json``,
  RFC 9457, with ``retry_after_ms``); the RateLimit and ``Retry-After`` headers
  are added to it.
- ``CONCURRENCY``: ``True`` has the middleware limit the requests of a key in
  flight at once instead of its rate (default ``False``): see below.

Every limited response carries ``RateLimit-Policy`` and ``RateLimit``; a denied
request gets ``429 Too Many Requests`` with ``Retry-After`` and never reaches
the view. ``request.ratelimit`` is the :class:`quotalease.Decision`
(``ratelimit_decision(request)`` gives it typed, for mypy with django-stubs). With
``@ratelimit(..., block=False)`` a denied request reaches the view anyway, which
reads ``request.ratelimit.allowed``. Each decorated view has its own buckets
(the key is ``"group:key"``, the group is the view's dotted name unless
``group=`` shares one). Sync and async views and middleware chains both work.
Bad settings raise ``ImproperlyConfigured`` naming the entry; a bad rate given
to the decorator raises :class:`quotalease.ConfigError` when the module loads.

Concurrency: with ``QUOTALEASE['CONCURRENCY'] = True`` (or
``@ratelimit(limiter=..., concurrency=True)`` for one view) each limited
request takes a permit of its key (``limiter.acquire_concurrent(key)``,
awaited in an async chain; the limiter needs ``concurrency=N``, in ``OPTIONS``
or on a ``LIMITER`` of yours, else every request raises its
``quotalease.ConfigError``) and holds it until Django closes the response:
when it is sent, so a ``StreamingHttpResponse`` holds its permit until its
last chunk; a view that raises gives it back at once. ``request.ratelimit`` is
the permit's decision. A request past the N gets the same 429 (or ``DENIED``'s
answer) with ``Retry-After`` and no ``RateLimit`` headers (they describe
rates), and never reaches the view. ``KEY``, ``SKIP``, ``TIER`` (the tier
whose ``"N concurrent"`` applies) and ``TRUSTED_PROXIES`` apply; ``COST`` and
``WAIT_MS`` do not: giving one beside ``CONCURRENCY`` raises
``ImproperlyConfigured``, which is also a :class:`quotalease.ConfigError` (a
``CONCURRENCY`` that is not a bool: also a ``TypeError``), and so does
``cost=`` or ``wait_ms=`` with the decorator's ``concurrency=True`` (a plain
``ConfigError`` there; the settings' ``COST`` and ``WAIT_MS`` are for rates and
do not reach it). For a rate and a concurrency limit both, have the
middleware keep one and the views' decorators the other.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import quote

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string
from django.views.decorators.debug import sensitive_variables

from . import ConfigError, Limiter
from ._middleware import (
    PROBLEM_CONTENT_TYPE,
    PermitRelease,
    Rule,
    check_concurrency,
    denied_body,
    header_pairs,
    retry_after_pairs,
)
from ._native import Decision
from ._proxies import TrustedProxies, environ_client

__all__ = ["RateLimitMiddleware", "client_address", "ratelimit", "ratelimit_decision"]

SETTINGS = (
    "URL",
    "PASSWORD",
    "OPTIONS",
    "RATE",
    "LIMITER",
    "KEY",
    "COST",
    "SKIP",
    "DENIED",
    "TIER",
    "TRUSTED_PROXIES",
    "WAIT_MS",
    "CONCURRENCY",
)

View = TypeVar("View", bound=Callable[..., Any])
Denied = Callable[[HttpRequest, Decision], HttpResponse]
Pairs = Callable[[Decision], list[tuple[str, str]]]


class _ConcurrencyConfigError(ImproperlyConfigured, ConfigError):  # type: ignore[misc]  # untyped Django
    """A ``COST`` or ``WAIT_MS`` beside ``CONCURRENCY``: bad settings, as Django
    names them, and the ConfigError of every quotalease integration."""


class _ConcurrencyTypeError(ImproperlyConfigured, TypeError):  # type: ignore[misc]  # untyped Django
    """A ``CONCURRENCY`` that is not a bool."""


def _concurrency(conf: dict[str, Any]) -> bool:
    cost = conf.get("COST")
    try:
        return check_concurrency(
            conf.get("CONCURRENCY", False),
            "quotalease.django",
            cost=1 if cost is None else cost,
            wait_ms=conf.get("WAIT_MS"),
            option="QUOTALEASE['CONCURRENCY']",
            names=("QUOTALEASE['COST']", "QUOTALEASE['WAIT_MS']"),
            hint="limit the rate with @ratelimit on the views (or the concurrency, with concurrency=True)",
        )
    except ConfigError as e:
        raise _ConcurrencyConfigError(str(e)) from None
    except TypeError as e:
        raise _ConcurrencyTypeError(str(e)) from None


def client_address(request: HttpRequest) -> str | None:
    """The default key: ``REMOTE_ADDR`` (behind a proxy, see ``TRUSTED_PROXIES``)."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _proxies(conf: dict[str, Any]) -> TrustedProxies:
    try:
        return TrustedProxies(conf.get("TRUSTED_PROXIES"), "QUOTALEASE['TRUSTED_PROXIES']")
    except (ConfigError, TypeError) as e:
        raise ImproperlyConfigured(str(e)) from e


def _client_key(proxies: TrustedProxies) -> Callable[[HttpRequest], str | None]:
    def key(request: HttpRequest) -> str | None:
        return environ_client(proxies, request.META)

    return key


def _header_key(name: str) -> Callable[[HttpRequest], str | None]:
    def key(request: HttpRequest) -> str | None:
        value = request.headers.get(name)
        return value or None

    return key


def _config() -> dict[str, Any]:
    conf = getattr(settings, "QUOTALEASE", {})
    if not isinstance(conf, dict):
        raise ImproperlyConfigured(f"settings.QUOTALEASE must be a dict, not {type(conf).__name__}")
    unknown = sorted(set(conf) - set(SETTINGS))
    if unknown:
        raise ImproperlyConfigured(f"settings.QUOTALEASE: unknown entries {unknown}; known: {', '.join(SETTINGS)}")
    return conf


def _import(value: Any, entry: str) -> Any:
    if isinstance(value, str):
        try:
            return import_string(value)
        except ImportError as e:
            raise ImproperlyConfigured(f"QUOTALEASE['{entry}']: cannot import {value!r}: {e}") from e
    return value


def _function(value: Any, entry: str) -> Any:
    """A callable given as itself or by its dotted path."""
    value = _import(value, entry)
    if not callable(value):
        raise ImproperlyConfigured(f"QUOTALEASE['{entry}'] must be a function or its dotted path")
    return value


def _key(value: Any, entry: str = "KEY", proxies: TrustedProxies | None = None) -> Callable[[HttpRequest], str | None]:
    if value is None or value == "ip":
        return _client_key(proxies) if proxies is not None and proxies.enabled else client_address
    if isinstance(value, str) and value.startswith("header:"):
        name = value[len("header:") :].strip()
        if not name:
            raise ImproperlyConfigured(f"{entry}: 'header:' needs a header name, e.g. 'header:X-Api-Key'")
        return _header_key(name)
    return cast(Callable[[HttpRequest], str | None], _function(value, entry))


def _cost(value: Any) -> int | Callable[[HttpRequest], int]:
    if value is None:
        return 1
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return cast(Callable[[HttpRequest], int], _function(value, "COST"))


def _hidden(*names: str) -> Callable[[View], View]:
    """Django's ``sensitive_variables``: error reports (with DEBUG off) hide these
    variables of the function's frame and of the frames it calls."""
    return cast(Callable[[View], View], sensitive_variables(*names))


@_hidden("url", "password", "conf")
def _url(conf: dict[str, Any]) -> str:
    """``URL`` with ``PASSWORD`` put in its user information (never shown:
    error reports with DEBUG off hide its variables; the core redacts the URL)."""
    url = conf.get("URL", "memory://")
    password = conf.get("PASSWORD")
    if password is None:
        return str(url)
    if not isinstance(password, str) or not password:
        raise ImproperlyConfigured("QUOTALEASE['PASSWORD'] must be a non-empty str")
    if not isinstance(url, str):
        raise ImproperlyConfigured("QUOTALEASE['URL'] must be a str")
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme.startswith(("redis", "rediss")):
        raise ImproperlyConfigured("QUOTALEASE['PASSWORD'] goes with a redis:// (or rediss://, cluster, sentinel) URL")
    userinfo, at, hosts = rest.rpartition("@")
    if at and ":" in userinfo:
        raise ImproperlyConfigured("QUOTALEASE: the URL holds a password already; give it in URL or PASSWORD, not both")
    return f"{scheme}://{userinfo}:{quote(password, safe='')}@{hosts}"


@_hidden("url", "conf")
def _limiter(conf: dict[str, Any], rate: str, entry: str) -> Limiter:
    options = conf.get("OPTIONS") or {}
    if not isinstance(options, dict):
        raise ImproperlyConfigured("QUOTALEASE['OPTIONS'] must be a dict of limiter options")
    url = _url(conf)
    try:
        return Limiter(url, rate=rate, **options)
    except (ConfigError, TypeError) as e:
        raise ImproperlyConfigured(f"QUOTALEASE ({entry} {rate!r}, URL and OPTIONS): {e}") from e


def _rule(
    conf: dict[str, Any],
    limiter: Limiter,
    key: Any,
    cost: Any,
    group: Any,
    skip: Any,
    tier: Any,
    wait_ms: Any = None,
    concurrency: bool = False,
) -> Rule[Any]:
    if concurrency:  # a permit has no cost and is not waited for
        cost, conf = 1, {k: v for k, v in conf.items() if k not in ("COST", "WAIT_MS")}
    wait = wait_ms if wait_ms is not None else conf.get("WAIT_MS")
    if wait is not None and (isinstance(wait, bool) or not isinstance(wait, int) or wait < 0):
        raise ImproperlyConfigured(f"QUOTALEASE['WAIT_MS'] / wait_ms must be an int of milliseconds >= 0, not {wait!r}")
    return Rule(
        limiter,
        _key(key if key is not None else conf.get("KEY"), proxies=_proxies(conf)),
        _cost(cost if cost is not None else conf.get("COST")),
        skip=_function(skip, "SKIP") if skip is not None else None,
        group=group,
        tier=tier if tier is None or isinstance(tier, str) else _function(tier, "TIER"),
        wait_ms=wait,
        who="quotalease.django",
    )


def _denied(request: HttpRequest, decision: Decision, handler: Denied | None, pairs: Pairs) -> HttpResponse:
    if handler is not None:
        response = handler(request, decision)
    else:
        response = HttpResponse(denied_body(decision), status=429, content_type=PROBLEM_CONTENT_TYPE)
    _add_headers(response, decision, pairs)
    return response


def _take(rule: Rule[Any], request: HttpRequest, concurrency: bool) -> tuple[Decision | None, PermitRelease | None]:
    """The request's decision (None: not limited) and, with ``concurrency``,
    the release of its permit when one was granted."""
    if not concurrency:
        return rule.acquire(request), None
    permit = rule.acquire_permit(request)
    if permit is None:
        return None, None
    return permit.decision, PermitRelease(permit) if permit.allowed else None


async def _atake(
    rule: Rule[Any], request: HttpRequest, concurrency: bool
) -> tuple[Decision | None, PermitRelease | None]:
    """:func:`_take`, awaiting a pending lease instead of blocking."""
    if not concurrency:
        return await rule.acquire_async(request), None
    permit = await rule.acquire_permit_async(request)
    if permit is None:
        return None, None
    return permit.decision, PermitRelease(permit) if permit.allowed else None


def _release_on_close(response: HttpResponse, release: PermitRelease | None) -> HttpResponse:
    """``release`` run when Django closes ``response`` (once it is sent: for a
    streaming response, after its last chunk), as it closes a file it streams."""
    if release is not None:
        closers = getattr(response, "_resource_closers", None)
        if isinstance(closers, list):
            closers.append(release)
        else:  # not an HttpResponse: no close to wait for
            release()
    return response


def _respond(respond: Callable[[], HttpResponse], release: PermitRelease | None) -> HttpResponse:
    """``respond()`` holding the permit until its response is closed (or it raises)."""
    try:
        response = respond()
    except BaseException:
        if release is not None:
            release()
        raise
    return _release_on_close(response, release)


async def _arespond(respond: Callable[[], Awaitable[HttpResponse]], release: PermitRelease | None) -> HttpResponse:
    """:func:`_respond` for an async view or chain."""
    try:
        response = await respond()
    except BaseException:
        if release is not None:
            release()
        raise
    return _release_on_close(response, release)


def _mark(request: HttpRequest, decision: Decision) -> None:
    request.ratelimit = decision


def ratelimit_decision(request: HttpRequest) -> Decision | None:
    """``request.ratelimit`` typed (django-stubs' ``HttpRequest`` has no such
    attribute): the decision of the innermost limit, None when none limited it."""
    decision = getattr(request, "ratelimit", None)
    return decision if isinstance(decision, Decision) else None


def _add_headers(response: HttpResponse, decision: Decision, pairs: Pairs = header_pairs) -> None:
    for name, value in pairs(decision):
        if name not in response:  # an inner (per-view) limit's headers win
            response[name] = value


class RateLimitMiddleware:
    """The site-wide limit, configured by ``settings.QUOTALEASE`` (see the module)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
        conf = _config()
        given = conf.get("LIMITER")
        if given is not None:
            if conf.get("RATE") is not None:
                raise ImproperlyConfigured("QUOTALEASE: give RATE or LIMITER, not both")
            limiter = _import(given, "LIMITER")
            if not isinstance(limiter, Limiter):
                raise ImproperlyConfigured("QUOTALEASE['LIMITER'] must be a quotalease.Limiter or its dotted path")
        elif conf.get("RATE") is not None:
            limiter = _limiter(conf, conf["RATE"], "RATE")
        else:
            raise ImproperlyConfigured(
                "quotalease.django.RateLimitMiddleware needs QUOTALEASE['RATE'] (e.g. '600/min') or ['LIMITER']"
            )
        self.limiter = limiter
        self.concurrency = _concurrency(conf)
        self.pairs: Pairs = retry_after_pairs if self.concurrency else header_pairs
        self.rule = _rule(
            conf, limiter, None, None, None, conf.get("SKIP"), conf.get("TIER"), concurrency=self.concurrency
        )
        denied = conf.get("DENIED")
        self.denied: Denied | None = _function(denied, "DENIED") if denied is not None else None

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        decision, release = _take(self.rule, request, self.concurrency)
        if decision is not None:
            _mark(request, decision)
            if not decision.allowed:
                return _denied(request, decision, self.denied, self.pairs)
        response = _respond(lambda: self.get_response(request), release)
        if decision is not None:
            _add_headers(response, decision, self.pairs)
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        decision, release = await _atake(self.rule, request, self.concurrency)
        if decision is not None:
            _mark(request, decision)
            if not decision.allowed:
                return _denied(request, decision, self.denied, self.pairs)
        response = await _arespond(lambda: self.get_response(request), release)
        if decision is not None:
            _add_headers(response, decision, self.pairs)
        return response


# Limiters built for decorators, one per rate, shared by the views with that
# rate (their keys carry the view's group); rebuilt when the settings change.
_limiters: dict[str, Limiter] = {}
_limiters_lock = threading.Lock()


def _rate_limiter(rate: str) -> Limiter:
    with _limiters_lock:
        limiter = _limiters.get(rate)
        if limiter is None:
            limiter = _limiters[rate] = _limiter(_config(), rate, "rate")
        return limiter


def _settings_changed(*, setting: str, **_: Any) -> None:
    if setting == "QUOTALEASE":
        with _limiters_lock:
            _limiters.clear()


setting_changed.connect(_settings_changed)


def ratelimit(
    rate: str | None = None,
    *,
    key: str | Callable[[HttpRequest], str | None] | None = None,
    cost: int | Callable[[HttpRequest], int] | None = None,
    group: str | Callable[[HttpRequest], str] | None = None,
    skip: Callable[[HttpRequest], bool] | None = None,
    tier: str | Callable[[HttpRequest], str | None] | None = None,
    wait_ms: int | None = None,
    block: bool = True,
    limiter: Limiter | None = None,
    denied: Denied | None = None,
    concurrency: bool = False,
) -> Callable[[View], View]:
    """Limit one view: ``@ratelimit(rate="10/min", key="ip")``.

    ``rate`` builds a limiter on ``QUOTALEASE['URL']`` with its ``OPTIONS``
    (give ``limiter=`` instead to use your own). ``key`` is ``"ip"``,
    ``"header:NAME"`` or ``key(request)`` (default: ``QUOTALEASE['KEY']``, else
    ``"ip"``); ``cost``, ``skip``, ``tier``, ``wait_ms`` and ``denied`` as in the settings;
    ``group`` defaults to the view's dotted name; ``block=False`` lets a denied
    request reach the view with ``request.ratelimit`` set.
    ``concurrency=True`` limits the view's requests in flight instead of its
    rate (see the module's doc; ``cost`` and ``wait_ms`` are a ConfigError
    beside it). The view keeps its sync or async nature."""
    if (rate is None) == (limiter is None):
        raise TypeError('ratelimit(): give rate= (e.g. "10/min") or limiter=, exactly one')
    if rate is not None:
        if not isinstance(rate, str):
            raise TypeError(f'ratelimit(): rate must be a str such as "10/min", not {type(rate).__name__}')
        Limiter(rate=rate).close()  # a bad rate is a ConfigError now, not on the first request
    elif not isinstance(limiter, Limiter):
        raise TypeError(f"ratelimit(): limiter must be a quotalease.Limiter, not {type(limiter).__name__}")
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise TypeError("ratelimit(): key must be 'ip', 'header:NAME' or a function of the request")
    check_concurrency(concurrency, "ratelimit()", cost=1 if cost is None else cost, wait_ms=wait_ms)
    pairs: Pairs = retry_after_pairs if concurrency else header_pairs

    def decorate(view: View) -> View:
        view_group = group if group is not None else f"{view.__module__}.{view.__qualname__}"
        rules: dict[int, Rule[Any]] = {}

        def rule() -> Rule[Any]:
            lim = limiter if limiter is not None else _rate_limiter(cast(str, rate))
            r = rules.get(id(lim))
            if r is None or r.limiter is not lim:
                rules.clear()
                r = rules[id(lim)] = _rule(_config(), lim, key, cost, view_group, skip, tier, wait_ms, concurrency)
            return r

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                decision, release = await _atake(rule(), request, concurrency)
                if decision is not None:
                    _mark(request, decision)
                    if block and not decision.allowed:
                        return _denied(request, decision, denied, pairs)
                response = await _arespond(lambda: view(request, *args, **kwargs), release)
                if decision is not None:
                    _add_headers(response, decision, pairs)
                return response

            return cast(View, async_wrapped)

        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            decision, release = _take(rule(), request, concurrency)
            if decision is not None:
                _mark(request, decision)
                if block and not decision.allowed:
                    return _denied(request, decision, denied, pairs)
            response = _respond(lambda: view(request, *args, **kwargs), release)
            if decision is not None:
                _add_headers(response, decision, pairs)
            return response

        return cast(View, wrapped)

    return decorate
