"""One unit rule, and configuration refused when it is built (issue 31).

Every duration is a ``datetime.timedelta`` or an int of milliseconds; a float
or a bool is refused, naming the argument and its range. A bad option of the
limiter, a bad ``Limit``, a bad middleware or storage configuration raises at
construction, never at the first request and never through the error policy.
``allow_all`` refuses fields it does not know.

What would fail: ``max_wait`` read as seconds (``acquire(..., max_wait=1000)``
sleeping the 3 s retry-after instead of returning at once), a float of seconds
taken for milliseconds, a ``Limit(0, 10)`` accepted, a misspelled ``teirs``
ignored (admitted with one tier), an option error surfacing only when a
request comes, or an argument error sending anything to the server.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
import redis
import redis.asyncio

import xcloak
from servers import Server


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def sent(server, command="xcloak.allow"):
    return server.calls(command)


# ------------------------------------------------------------ units


def test_max_wait_is_milliseconds(server):
    """acquire(k, window, limit, max_wait=1000) waits at most ~1 s: here the
    window frees in ~3 s, so it returns the rejection at once (read as
    seconds, it would sleep the 3 s and be admitted)."""
    limiter = xcloak.Limiter(server.client())
    try:
        assert limiter.allow("mw", 3000, 1).allowed
        start = time.monotonic()
        d = limiter.acquire("mw", 3000, 1, max_wait=1000)
        assert not d.allowed and d.retry_after_ms > 1000
        assert time.monotonic() - start < 1.0
        # A wait that fits is slept, with the same number as milliseconds or a timedelta.
        assert limiter.allow("mw2", 300, 1).allowed
        start = time.monotonic()
        assert limiter.acquire("mw2", 300, 1, max_wait=timedelta(seconds=2)).allowed
        assert 0.2 < time.monotonic() - start < 2.0
    finally:
        limiter.close()


def test_async_max_wait_is_milliseconds(server):
    async def main():
        limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=server.port))
        try:
            assert (await limiter.allow("amw", 3000, 1)).allowed
            start = time.monotonic()
            d = await limiter.acquire("amw", 3000, 1, max_wait=1000)
            assert not d.allowed and time.monotonic() - start < 1.0
        finally:
            await limiter.close()

    asyncio.run(main())


@pytest.mark.parametrize("kwargs,name", [
    (dict(timeout=0.5), "timeout"), (dict(timeout=True), "timeout"), (dict(probe_interval=60.0), "probe_interval"),
    (dict(timeout="1000"), "timeout"),
])
def test_a_float_or_bool_duration_option_is_refused(server, kwargs, name):
    for cls in (xcloak.Limiter, xcloak.AsyncLimiter):
        client = server.client() if cls is xcloak.Limiter else redis.asyncio.Redis(port=server.port)
        with pytest.raises(TypeError, match=rf"^{name} must be a datetime.timedelta or an int of milliseconds"):
            cls(client, **kwargs)


def test_the_float_error_says_why():
    with pytest.raises(TypeError, match=r"not a float \(0.5\).*timedelta\(seconds=0.5\)"):
        xcloak.Limiter(redis.Redis(), timeout=0.5)


@pytest.mark.parametrize("kwargs,text", [
    (dict(timeout=0), "timeout must be from 1 to 9007199254740991 milliseconds"),
    (dict(timeout=timedelta(microseconds=1500)), "timeout must be a whole number of milliseconds"),
    (dict(probe_interval=-1), "probe_interval must be from 0 to 9007199254740991 milliseconds"),
    (dict(on_error="open"), "on_error must be one of raise, allow, deny"),
    (dict(fallback="sometimes"), "fallback must be one of auto, always, never"),
    (dict(jitter_fraction=2), "jitter_fraction must be a number from 0 to 1"),
])
def test_options_out_of_range_are_refused_when_built(kwargs, text):
    with pytest.raises(ValueError) as raised:
        xcloak.Limiter(redis.Redis(), **kwargs)
    assert str(raised.value).startswith(text), raised.value


def test_durable_takes_the_same_units():
    assert xcloak.Durable(1, timeout=timedelta(seconds=2)).timeout_ms == 2000
    assert xcloak.Durable(2).timeout_ms == 100
    with pytest.raises(TypeError, match="Durable timeout must be a datetime.timedelta or an int of milliseconds"):
        xcloak.Durable(1, timeout=0.1)
    with pytest.raises(ValueError, match="Durable timeout must be from 1 to"):
        xcloak.Durable(1, timeout=0)  # WAIT 1 0 would block for ever
    with pytest.raises(ValueError, match="Durable replicas must be an integer from 1 to"):
        xcloak.Durable(0)
    with pytest.raises(TypeError):
        xcloak.Durable(1, timeout_ms=100)  # the old name is gone  # type: ignore[call-arg]


def test_clients_of_the_wrong_kind_are_refused_when_built(server):
    with pytest.raises(TypeError, match="use AsyncLimiter"):
        xcloak.Limiter(redis.asyncio.Redis(port=server.port))
    with pytest.raises(TypeError, match="use Limiter"):
        xcloak.AsyncLimiter(server.client())
    with pytest.raises(TypeError, match="Limiter client must be a redis"):
        xcloak.Limiter("redis://localhost")
    with pytest.raises(TypeError, match="durable must be xcloak.Durable"):
        xcloak.Limiter(server.client(), durable=1)


@pytest.mark.parametrize("call,name", [
    (lambda lim: lim.allow("u", 60.0, 5), "window"),
    (lambda lim: lim.allow("u", True, 5), "window"),
    (lambda lim: lim.allow("u", 60000, 5, tiers=[(3600.0, 10)]), "window of TIER 1"),
    (lambda lim: lim.peek("u", 1.5, 5), "window"),
    (lambda lim: lim.acquire("u", 60000, 5, max_wait=1.0), "max_wait"),
])
def test_a_float_or_bool_call_argument_is_refused_and_nothing_is_sent(server, call, name):
    limiter = xcloak.Limiter(server.client(), on_error="allow")
    try:
        before = sent(server) + sent(server, "xcloak.peek")
        with pytest.raises(xcloak.XcloakError, match=rf"^{name} must be a datetime.timedelta or an int of millisec"):
            call(limiter)
        assert sent(server) + sent(server, "xcloak.peek") == before
    finally:
        limiter.close()


def test_a_negative_max_wait_is_refused(server):
    limiter = xcloak.Limiter(server.client())
    with pytest.raises(xcloak.XcloakError, match="max_wait must be from 0 to 9007199254740991 milliseconds"):
        limiter.acquire("u", 60000, 5, max_wait=-1)


# ------------------------------------------------------------ allow_all


@pytest.mark.parametrize("request_,text", [
    ({"key": "a", "window": 60000, "limit": 5, "teirs": [(3600000, 10)]}, "unknown field(s) 'teirs'"),
    ({"key": "a", "window": 60000, "limit": 5, "cots": 3}, "unknown field(s) 'cots'"),
    ({"key": "a", "window": 60000}, "lacks limit"),
])
def test_allow_all_refuses_unknown_and_missing_fields(server, request_, text):
    for policy in ("raise", "allow", "deny"):
        limiter = xcloak.Limiter(server.client(), on_error=policy)
        before = sent(server)
        good = {"key": "b", "window": 60000, "limit": 5}
        with pytest.raises(xcloak.XcloakError) as raised:
            limiter.allow_all([good, request_])
        assert text in str(raised.value) and "request 1" in str(raised.value)
        assert not isinstance(raised.value, xcloak.UnavailableError)
        assert sent(server) == before, "nothing is sent, not even the good request"
        limiter.close()


# ------------------------------------------------------------ ASGI configuration


def test_limit_is_checked_when_built():
    from xcloak.asgi import Limit

    cases = [
        (lambda: Limit(0, 10), ValueError, "window must be from 1 to 9007199254740991 milliseconds"),
        (lambda: Limit(1.5, 10), TypeError, "window must be a datetime.timedelta or an int of milliseconds"),
        (lambda: Limit(60000, -1), ValueError, "limit must be an integer from 0 to 1000000"),
        (lambda: Limit(60000, 1_000_001), ValueError, "limit must be an integer from 0 to 1000000"),
        (lambda: Limit(60000, 10, cost=0), ValueError, "cost must be an integer from 1 to 1000000"),
        (lambda: Limit(60000, 10, tiers=[(0, 5)]), ValueError, "window of TIER 1 must be from 1"),
        (lambda: Limit(60000, 10, tiers=[(3600000, -5)]), ValueError, "limit of TIER 1 must be an integer from 0"),
        (lambda: Limit(60000, 10, tiers=[(1000 * i, 5) for i in range(1, 17)]), ValueError, "tiers: at most 15"),
        (lambda: Limit(60000, 10, tiers=[5]), TypeError, "tier 1 must be a (window, limit) pair"),
        (lambda: Limit(60000, 10, names=["a", "b"]), ValueError, "Limit names must be one str per tier (1)"),
        (lambda: Limit(60000, 10, name=""), ValueError, "Limit name must be a non-empty str"),
    ]
    for build, kind, text in cases:
        with pytest.raises(kind) as raised:
            build()
        assert str(raised.value).startswith(text), (text, raised.value)
    assert Limit(timedelta(minutes=1), 10, tiers=[(timedelta(hours=1), 100)]).tiers == ((timedelta(hours=1), 100),)


def test_middleware_configuration_is_checked_when_built(server):
    from starlette.applications import Starlette

    from xcloak.asgi import Limit, RateLimit, RateLimitMiddleware

    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=server.port))
    ok = dict(limiter=limiter, limits=[Limit(60000, 3)])
    cases = [
        (dict(ok, limiter=xcloak.Limiter(server.client())), TypeError, "limiter must be an xcloak.AsyncLimiter"),
        (dict(ok, limits=[]), ValueError, "limits: at least one"),
        (dict(ok, limits=[(60000, 3)]), TypeError, "limits[0] must be an xcloak.asgi.Limit"),
        (dict(ok, style="draft"), ValueError, "style must be one of ietf, legacy, both"),
        (dict(ok, trusted_proxies=["10.0.0.0/33"]), ValueError, "trusted_proxies: '10.0.0.0/33' is not"),
        (dict(ok, trusted_proxies="10.0.0.1"), TypeError, "trusted_proxies must be a list"),
        (dict(ok, skip_successful="yes"), TypeError, "skip_successful must be a bool"),
        (dict(ok, key="ip"), TypeError, "key must be a function of the ASGI scope"),
    ]
    for kwargs, kind, text in cases:
        with pytest.raises(kind) as raised:
            RateLimitMiddleware(None, **kwargs)
        assert str(raised.value).startswith(text), (text, raised.value)
    with pytest.raises(TypeError, match="limiter must be an xcloak.AsyncLimiter"):
        RateLimit(xcloak.Limiter(server.client()), Limit(60000, 3))
    with pytest.raises(ValueError, match="limits: at least one"):
        RateLimit(limiter)

    # Starlette builds its middleware stack at startup (the lifespan), before any request.
    app = Starlette()
    app.add_middleware(RateLimitMiddleware, limiter=limiter, limits=[Limit(60000, 3)], style="draft")

    async def startup():
        async def receive():
            return {"type": "lifespan.startup"}

        async def send(message):
            pass

        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)

    with pytest.raises(ValueError, match="style must be one of"):
        asyncio.run(startup())


# ------------------------------------------------------------ limits storages


def test_storage_options_are_checked_when_built(server):
    from limits.storage import storage_from_string

    import xcloak.limits  # noqa: F401

    uri = f"xcloak://127.0.0.1:{server.port}"
    storage = storage_from_string(uri + "?timeout=500&probe_interval=1000")
    assert storage.limiter.engine.timeout_ms == 500 and storage.limiter.engine.probe_interval_ms == 1000
    storage = storage_from_string(uri, timeout=timedelta(milliseconds=250))
    assert storage.limiter.engine.timeout_ms == 250
    with pytest.raises(ValueError, match=r"timeout must be a whole number of milliseconds \(got '0.5'"):
        storage_from_string(uri + "?timeout=0.5")
    with pytest.raises(TypeError, match="timeout must be a datetime.timedelta or an int of milliseconds"):
        storage_from_string(uri, timeout=0.5)
    with pytest.raises(ValueError, match="on_error must be one of"):
        storage_from_string(uri + "?on_error=open")
    with pytest.raises(ValueError, match="replica_reads: a single server has no replica"):
        storage_from_string(uri + "?replica_reads=true")
    with pytest.raises(ValueError, match="replica_reads must be true or false"):
        storage_from_string(f"xcloak+cluster://127.0.0.1:{server.port}?replica_reads=maybe")
    with pytest.raises(ValueError, match="replica_reads: a single server"):
        storage_from_string(f"async+xcloak://127.0.0.1:{server.port}?replica_reads=1")


def test_a_limit_over_the_cap_is_refused_not_failed_open(server):
    """limits gives a storage no limit before its first hit: there, a limit
    over the server's cap is the server's XcloakError under every policy
    (on_error="allow" does not admit it), and nothing is recorded."""
    from limits.storage import storage_from_string

    import xcloak.limits  # noqa: F401

    storage = storage_from_string(f"xcloak://127.0.0.1:{server.port}?on_error=allow")
    with pytest.raises(xcloak.XcloakError, match=r"^ERR limit must be an integer from 0 to 1000000$"):
        storage.acquire_entry("cap", 1_000_001, 3600)
    with pytest.raises(xcloak.XcloakError, match=r"^ERR limit must be an integer from 0 to 1000000$"):
        storage.get_moving_window("cap", 1_000_001, 3600)
    assert not server.client().exists("LIMITS:xcloak:cap")
    assert storage.acquire_entry("cap", 1_000_000, 3600)
