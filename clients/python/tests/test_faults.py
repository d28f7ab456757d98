"""Bad input and faults, against real servers: every argument class raises
XcloakError with the server's text under every policy; a paused (SIGSTOP,
CLIENT PAUSE) or stopped server and the limiter's timeout go to the policy;
and a call that may have been applied is never sent again, counted on the
server (``cmdstat_xcloak.allow``) after it resumes.

What would fail: a limiter that calls ``client.execute_command`` (redis-py 6+
retries a timed-out ALLOW three times: ``test_redis_py_alone_would_resend``
shows the server then runs it 4 times), a policy applied to a bad argument
(failing open on a bug), a timeout taken from the client's socket settings,
an error text reworded.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest
import redis
import redis.asyncio

import xcloak
from servers import Server

POLICIES = ["raise", "allow", "deny"]


@pytest.fixture(params=["command", "script"])
def server(request):
    s = Server(module=request.param == "command")
    s.via = request.param
    yield s
    s.close()


BAD = [
    ("window", dict(window=0, limit=3), "ERR window must be an integer from 1 to 9007199254740991 (milliseconds)"),
    ("limit", dict(window=1000, limit=-1), "ERR limit must be an integer from 0 to 1000000"),
    ("cost", dict(window=1000, limit=3, cost=0), "ERR COST must be an integer from 1 to 1000000"),
    ("now", dict(window=1000, limit=3, now=-1),
     "ERR NOW must be an integer from 0 to 9007199254740991 (unix time in milliseconds)"),
    ("tier window", dict(window=1000, limit=3, tiers=[(0, 1)]),
     "ERR window of TIER 1 must be an integer from 1 to 9007199254740991 (milliseconds)"),
    ("tier limit", dict(window=1000, limit=3, tiers=[(1000, 1), (2000, 1000001)]),
     "ERR limit of TIER 2 must be an integer from 0 to 1000000"),
    ("tier count", dict(window=1000, limit=3, tiers=[(1000 + i, 1) for i in range(16)]),
     "ERR syntax error, TIER is given more than 15 times (at most 16 tiers in all)"),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name,kwargs,text", BAD, ids=[b[0] for b in BAD])
def test_a_bad_argument_is_raised_under_every_policy(server, policy, name, kwargs, text):
    limiter = xcloak.Limiter(server.client(), on_error=policy)
    for call in (limiter.allow, limiter.peek):
        with pytest.raises(xcloak.XcloakError) as raised:
            call("bad", **kwargs)
        assert str(raised.value) == text
        assert not isinstance(raised.value, xcloak.UnavailableError)
    assert server.client().exists("bad") == 0, "a bad call changes nothing"
    limiter.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_refund_and_wrongtype_errors_are_raised(server, policy):
    limiter = xcloak.Limiter(server.client(), on_error=policy)
    stamp = "ERR stamp must be an integer from 0 to 9007199254740991 (unix time in milliseconds)"
    with pytest.raises(xcloak.XcloakError, match=r"^ERR stamp must be") as raised:
        limiter.refund("k", -1)
    assert str(raised.value) == stamp
    with pytest.raises(xcloak.XcloakError) as raised:
        limiter.refund("k", 5, cost=1000001)
    assert str(raised.value) == "ERR COST must be an integer from 1 to 1000000"
    server.client().set("text", "x")
    for call in (lambda: limiter.allow("text", 1000, 3), lambda: limiter.peek("text", 1000, 3),
                 lambda: limiter.refund("text", 5)):
        with pytest.raises(xcloak.XcloakError) as raised:
            call()
        assert str(raised.value) == "WRONGTYPE Operation against a key holding the wrong kind of value"
    limiter.close()


def test_the_client_refuses_a_fraction_of_a_millisecond():
    s = Server()
    try:
        limiter = xcloak.Limiter(s.client())
        with pytest.raises(xcloak.XcloakError, match="window must be a whole number of milliseconds"):
            limiter.allow("k", timedelta(microseconds=1500), 3)
        assert limiter.allow("k", timedelta(seconds=1.5), 3).window_ms == 1500
        assert s.calls("xcloak.allow") == 1, "the refused call was not sent"
    finally:
        s.close()


def test_never_falls_back_with_fallback_never():
    s = Server(module=False)
    try:
        limiter = xcloak.Limiter(s.client(), fallback="never", on_error="allow")
        with pytest.raises(xcloak.XcloakError, match="unknown command"):
            limiter.allow("k", 1000, 3)
    finally:
        s.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_paused_server_goes_to_the_policy_and_the_call_runs_once(policy):
    """SIGSTOP while a call is in flight: the limiter's timeout fires, the
    policy answers, and after SIGCONT the server has run that ALLOW once."""
    s = Server()
    try:
        # The client's own socket has no timeout: only the limiter's applies.
        limiter = xcloak.Limiter(redis.Redis(port=s.port),
                                 on_error=policy, timeout=300)
        assert limiter.allow("paused", 60000, 5).allowed  # a connection in the pool
        before = s.calls("xcloak.allow")
        s.pause()
        started = time.monotonic()
        try:
            if policy == "raise":
                with pytest.raises(xcloak.UnavailableError) as raised:
                    limiter.allow("paused", 60000, 5)
                assert isinstance(raised.value.cause, redis.TimeoutError)
            else:
                d = limiter.allow("paused", 60000, 5)
                assert d.via == xcloak.ERROR and d.allowed == (policy == "allow")
                assert isinstance(d.error, xcloak.UnavailableError)
                assert xcloak.headers(d) == {}
            elapsed = time.monotonic() - started
        finally:
            s.resume()
        assert 0.25 < elapsed < 1.5, elapsed
        time.sleep(0.2)
        assert s.calls("xcloak.allow") - before == 1, "the timed-out ALLOW ran exactly once"
        assert s.client().zcard("paused") == 2
        limiter.close()
    finally:
        s.close()


def test_redis_py_alone_would_resend():
    """The mutant the paused tests catch: redis-py 6+'s default Retry
    (3 retries on TimeoutError) sends a timed-out command again once the
    server answers again (a stall: SIGSTOP for 0.6 s), and each copy runs."""
    s = Server()
    try:
        client = redis.Redis(port=s.port, socket_timeout=0.3)
        client.execute_command("XCLOAK.ALLOW", "raw", 60000, 5)
        s.pause()
        threading.Timer(0.6, s.resume).start()
        client.execute_command("XCLOAK.ALLOW", "raw", 60000, 5)  # succeeds on a retry
        time.sleep(0.3)
        assert s.calls("xcloak.allow") >= 3, "redis-py resent the timed-out call"
        assert client.zcard("raw") >= 3, "and the server admitted it twice"
        # The limiter, on the same stall: one ALLOW, answered by the policy.
        limiter = xcloak.Limiter(client, on_error="deny", timeout=300)
        limiter.allow("lim", 60000, 5)
        before = s.calls("xcloak.allow")
        s.pause()
        threading.Timer(0.6, s.resume).start()
        assert limiter.allow("lim", 60000, 5).via == xcloak.ERROR
        time.sleep(1.0)
        assert s.calls("xcloak.allow") - before == 1 and client.zcard("lim") == 2
    finally:
        s.close()


def test_client_pause_times_out_into_the_policy_once():
    s = Server()
    try:
        limiter = xcloak.Limiter(s.client(), on_error="deny", timeout=300)
        limiter.allow("cp", 60000, 5)
        admin = s.client()
        admin.execute_command("CLIENT", "PAUSE", 1000, "ALL")
        d = limiter.allow("cp", 60000, 5)
        assert d.via == xcloak.ERROR and not d.allowed
        time.sleep(1.0)
        # A paused client that went away is dropped with its command (Redis
        # 7.0): it ran at most once, and never twice.
        calls = s.calls("xcloak.allow")
        assert calls in (1, 2) and s.client().zcard("cp") == calls, calls
        limiter.close()
    finally:
        s.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_stopped_server_goes_to_the_policy_at_once(policy):
    s = Server()
    try:
        limiter = xcloak.Limiter(s.client(), on_error=policy, timeout=500)
        assert limiter.allow("gone", 60000, 5).allowed
        s.stop()
        started = time.monotonic()
        if policy == "raise":
            with pytest.raises(xcloak.UnavailableError):
                limiter.allow("gone", 60000, 5)
        else:
            d = limiter.allow("gone", 60000, 5)
            assert d.via == xcloak.ERROR and d.allowed == (policy == "allow")
            # peek follows the same policy; refund and reset (no decision) raise
            assert limiter.peek("gone", 60000, 5).via == xcloak.ERROR
        with pytest.raises(xcloak.UnavailableError):
            limiter.refund("gone", 1)
        with pytest.raises(xcloak.UnavailableError):
            limiter.reset("gone")
        assert time.monotonic() - started < 1.0, "no retry with backoff on a refused connection"
        limiter.close()
    finally:
        s.close()


@pytest.mark.parametrize("policy", ["raise", "deny"])
def test_async_paused_server_goes_to_the_policy_and_runs_once(policy):
    s = Server()

    async def main():
        client = redis.asyncio.Redis(port=s.port)
        limiter = xcloak.AsyncLimiter(client, on_error=policy, timeout=300)
        assert (await limiter.allow("apaused", 60000, 5)).allowed
        s.pause()
        try:
            if policy == "raise":
                with pytest.raises(xcloak.UnavailableError):
                    await limiter.allow("apaused", 60000, 5)
            else:
                d = await limiter.allow("apaused", 60000, 5)
                assert d.via == xcloak.ERROR and not d.allowed
        finally:
            s.resume()
        await asyncio.sleep(0.2)
        assert s.calls("xcloak.allow") == 2
        await limiter.close()
        await client.aclose()

    try:
        asyncio.run(main())
    finally:
        s.close()


def test_async_acquire_is_cancellation_safe():
    s = Server()

    async def main():
        client = redis.asyncio.Redis(port=s.port)
        limiter = xcloak.AsyncLimiter(client)
        await limiter.allow("acq", 60000, 1)
        task = asyncio.ensure_future(limiter.acquire("acq", 60000, 1, max_wait=120_000))
        await asyncio.sleep(0.2)  # acquire is sleeping the server's retry-after
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await client.zcard("acq") == 1, "a cancelled wait recorded nothing"
        await limiter.close()
        await client.aclose()

    try:
        asyncio.run(main())
    finally:
        s.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_task_cancelled_in_flight_is_cancelled_not_the_policy(policy):
    """A task cancelled while its call waits on a paused server: CancelledError
    under every policy, for allow, refund and reset, never a decision of the
    policy (a caller's cancellation is no outage). Would fail: the driver
    mapping the cancellation to UnavailableError (a cancelled request failing
    open under allow)."""
    s = Server()

    async def main():
        client = redis.asyncio.Redis(port=s.port)
        limiter = xcloak.AsyncLimiter(client, on_error=policy, timeout=5000)
        await limiter.allow("c", 60000, 5)  # a connection in the pool
        calls = [lambda: limiter.allow("c", 60000, 5), lambda: limiter.refund("c", 1),
                 lambda: limiter.reset("c")]
        outcomes = []
        for call in calls:
            s.pause()
            try:
                task = asyncio.ensure_future(call())
                await asyncio.sleep(0.1)
                task.cancel()
                try:
                    outcomes.append(await task)
                except asyncio.CancelledError:
                    outcomes.append("cancelled")
                except Exception as error:  # noqa: BLE001 - what the test looks for
                    outcomes.append(error)
            finally:
                s.resume()
        await limiter.close()
        await client.aclose()
        return outcomes

    try:
        assert asyncio.run(main()) == ["cancelled"] * 3
    finally:
        s.close()


def test_module_load_is_picked_up_after_the_probe_interval():
    """A server on the script gets the module (MODULE LOAD): the next call
    after probe_interval is answered by the command, on the same live key."""
    from servers import MODULE, server_version

    s = Server(module=False, args=["--enable-module-command", "yes"] if server_version() >= (7, 0, 0) else [])
    try:
        limiter = xcloak.Limiter(s.client(), probe_interval=300)
        assert limiter.allow("probe", 60000, 3).via == xcloak.SCRIPT
        s.client().execute_command("MODULE", "LOAD", MODULE)
        assert limiter.allow("probe", 60000, 3).via == xcloak.SCRIPT, "not before the interval"
        time.sleep(0.35)
        d = limiter.allow("probe", 60000, 3)
        assert d.via == xcloak.COMMAND and d.remaining == 0, d
        assert limiter.allow("probe", 60000, 3).via == xcloak.COMMAND
    finally:
        s.close()


def test_noscript_loads_the_script_and_sends_once_more():
    s = Server(module=False)
    try:
        limiter = xcloak.Limiter(s.client(), fallback="always")
        assert limiter.allow("ns", 60000, 3).via == xcloak.SCRIPT
        s.client().script_flush()
        assert limiter.allow("ns", 60000, 3).remaining == 1
        assert s.calls("script|load") == 2 and s.client().zcard("ns") == 2
    finally:
        s.close()


def test_pipeline_with_the_fallback_inside():
    """One round trip for several calls; on a server without the module the
    entries answered "unknown command" are sent again through the script."""
    for module in (True, False):
        s = Server(module=module)
        try:
            limiter = xcloak.Limiter(s.client())
            p = limiter.pipeline()
            for _ in range(4):
                p.allow("pipe", 60000, 3, stamp=True)
            p.peek("pipe", 60000, 3, oldest=True)
            p.reset("other")
            results = p.execute()
            assert [d.allowed for d in results[:4]] == [True, True, True, False]
            assert results[4].remaining == 0 and results[4].oldest == results[0].stamp
            assert results[5] is False
            via = xcloak.COMMAND if module else xcloak.SCRIPT
            assert {d.via for d in results[:5]} == {via}
            assert s.client().zcard("pipe") == 3
            bad = limiter.pipeline().allow("pipe", 0, 3).allow("fine", 1000, 1)
            with pytest.raises(xcloak.XcloakError, match="window must be"):
                bad.execute()
            assert s.client().exists("fine") == 1, "the other entries ran"
        finally:
            s.close()
