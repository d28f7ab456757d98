"""Every conformance vector (except ``raw`` steps) through the package's API,
against a live server: once through the command (a server with the module)
and once through the fallback (a server without it), with ``Limiter`` and
with ``AsyncLimiter``.

Compared: the commands the limiter sends (recorded at its transport: through
the fallback the same arguments after ``EVALSHA <sha> 1``, ``EVALSHA_RO`` for
a peek on 7.0+, after the first call's "unknown command" and ``NOSCRIPT``),
the Decisions, the headers of both styles, the errors (``XcloakError`` with
the server's message verbatim), acquire's sleeps on a virtual clock, and
allow_all's calls.

What would fail: a non-canonical command (COST 1 sent, NOW before TIER, DETAILS
missing), the wrong script for a call, a decision field misread, an error
swallowed or reworded, a sleep not taken from the server's figure, an
allow_all that does not refund, or refunds out of order.
"""

from __future__ import annotations

import asyncio

import pytest

import xcloak
from servers import Server, server_version
from vectors import CASES, decode, tiers_of
from xcloak import _engine
from xcloak.decision import to_dict

SCRIPT_OF = {"XCLOAK.ALLOW": _engine.ALLOW_SHA, "XCLOAK.PEEK": _engine.PEEK_SHA, "XCLOAK.REFUND": _engine.REFUND_SHA}


@pytest.fixture(scope="module", params=["command", "script"])
def server(request):
    s = Server(module=request.param == "command")
    s.via = request.param
    yield s
    s.close()


class Recorder:
    """The commands a limiter sends, per API call (a hook on its transport)."""

    def __init__(self, limiter):
        self.sent = []
        transport = limiter._transport
        original = transport.exchange

        if asyncio.iscoroutinefunction(original):
            async def exchange(node, commands, *rest):
                self.sent.extend([str(a) for a in c] for c in commands)
                return await original(node, commands, *rest)
        else:
            def exchange(node, commands, *rest):
                self.sent.extend([str(a) for a in c] for c in commands)
                return original(node, commands, *rest)
        transport.exchange = exchange

    def take(self):
        sent, self.sent = self.sent, []
        return sent


def expected_sends(command, via):
    """What the limiter sends for one vector command, without the probe
    ("unknown command") and SCRIPT LOAD that only the first calls make."""
    if via == "command" or command[0] == "DEL":
        return [command]
    name = command[0]
    verb = "EVALSHA_RO" if name == "XCLOAK.PEEK" and server_version() >= (7, 0, 0) else "EVALSHA"
    return [[verb, SCRIPT_OF[name], "1", *command[1:]]]


def check_sent(sent, expected_commands, via):
    """The sends of one API call are the expected ones, preceded at most by
    the command (answered "unknown command") and followed by a NOSCRIPT's
    SCRIPT LOAD and resend."""
    want = [c for command in expected_commands for c in expected_sends(command, via)]
    effective = [c for c in sent if c[:2] != ["SCRIPT", "LOAD"]]
    if via == "script":
        # drop a probe of the command answered "unknown command", and a NOSCRIPT's first try
        cleaned = []
        for c in effective:
            if c[0].startswith("XCLOAK."):
                continue
            if cleaned and cleaned[-1] == c:
                continue
            cleaned.append(c)
        effective = cleaned
    assert effective == want, f"sent {sent}"


def raw(client, *args):
    """A command's reply as the server sent it (no redis-py response callback)."""
    conn = client.connection_pool.get_connection()
    try:
        conn.send_command(*args)
        return conn.read_response()
    finally:
        client.connection_pool.release(conn)


def run_step(limiter, step, recorder, via, conn):
    op = step["op"]
    if op == "setup":
        assert decode(raw(conn, *step["command"])) == step["reply"]
        return
    if op == "allow" or op == "peek":
        kwargs = dict(cost=step.get("cost", 1), tiers=tiers_of(step), now=step["now"])
        if op == "allow":
            kwargs["stamp"] = step.get("stamp", False)
            def call():
                return limiter.allow(step["key"], step["window"], step["limit"], **kwargs)
        else:
            kwargs["oldest"] = step.get("oldest", False)
            def call():
                return limiter.peek(step["key"], step["window"], step["limit"], **kwargs)
        if "error" in step:
            with pytest.raises(xcloak.XcloakError) as raised:
                call()
            assert str(raised.value) == step["error"]
            assert not isinstance(raised.value, xcloak.UnavailableError)
        else:
            decision = call()
            assert to_dict(decision) == step["decision"]
            assert decision.via == via
            if op == "peek" and step.get("oldest"):
                assert decision.oldest == step["oldest_ms"]
            names = step.get("names")
            assert xcloak.headers(decision, "ietf", names) == step["headers"]["ietf"]
            assert xcloak.headers(decision, "legacy", names) == step["headers"]["legacy"]
        check_sent(recorder.take(), [step["command"]], via)
    elif op == "refund":
        if "error" in step:
            with pytest.raises(xcloak.XcloakError) as raised:
                limiter.refund(step["key"], step["stamp"], step.get("cost", 1))
            assert str(raised.value) == step["error"]
        else:
            assert limiter.refund(step["key"], step["stamp"], step.get("cost", 1)) == step["removed"]
        check_sent(recorder.take(), [step["command"]], via)
    elif op == "reset":
        assert limiter.reset(step["key"]) == step["existed"]
        check_sent(recorder.take(), [step["command"]], via)
    elif op == "allow_all":
        requests = [dict(r, tiers=[tuple(t) for t in r.get("tiers", [])]) for r in step["requests"]]
        multi = limiter.allow_all(requests, stamp=True, now=step["now"])
        assert multi.allowed == step["allowed"] and multi.rejected == step["rejected"]
        assert multi.binding_index == step["binding"]
        assert [to_dict(d) for d in multi.decisions] == step["decisions"]
        names = step.get("names")
        assert xcloak.headers(multi, "ietf", names) == step["headers"]["ietf"]
        assert xcloak.headers(multi, "legacy", names) == step["headers"]["legacy"]
        check_sent(recorder.take(), [c["command"] for c in step["calls"]], via)
    elif op == "acquire":
        clock_now = [step["start"]]
        sleeps = []
        draws = list(step["random"])

        def sleep(ms):
            sleeps.append(ms)
            clock_now[0] += ms

        acquirer = type(limiter)(limiter.client, clock=xcloak.Clock(lambda: clock_now[0], sleep),
                                 jitter_fraction=step["jitter_fraction"], random=lambda: draws.pop(0))
        acquirer.engine.nodes = limiter.engine.nodes  # the same servers: the same fallback state
        rec = Recorder(acquirer)
        decision = acquirer.acquire(step["key"], step["window"], step["limit"], cost=step.get("cost", 1),
                                    tiers=tiers_of(step), max_wait=step["max_wait_ms"])
        assert sleeps == [c["sleep_ms"] for c in step["calls"] if c["sleep_ms"] is not None]
        assert to_dict(decision) == step["decision"]
        assert not draws
        check_sent(rec.take(), [c["command"] for c in step["calls"]], via)
        acquirer.close()
    else:
        assert op == "raw", op


NAMES = [c["name"] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_vectors_through_limiter(server, case):
    conn = server.client()
    conn.flushall()
    limiter = xcloak.Limiter(server.client())
    recorder = Recorder(limiter)
    try:
        for step in case["steps"]:
            run_step(limiter, step, recorder, server.via, conn)
    finally:
        limiter.close()


class _SyncFacade:
    """Runs AsyncLimiter's calls on one event loop, so run_step serves both."""

    def __init__(self, limiter, loop):
        self._limiter, self._loop = limiter, loop
        self.client, self.engine, self._transport = limiter.client, limiter.engine, limiter._transport

    def __getattr__(self, name):
        method = getattr(self._limiter, name)
        return lambda *a, **k: self._loop.run_until_complete(method(*a, **k))


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_vectors_through_async_limiter(server, case):
    import redis.asyncio

    conn = server.client()
    conn.flushall()
    loop = asyncio.new_event_loop()
    client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    limiter = xcloak.AsyncLimiter(client)
    facade = _SyncFacade(limiter, loop)
    recorder = Recorder(limiter)

    def factory(client_, **kwargs):  # acquire's limiter with a virtual clock
        return _SyncFacade(xcloak.AsyncLimiter(client, **kwargs), loop)

    try:
        for step in case["steps"]:
            if step["op"] == "acquire":
                _acquire_async(loop, client, limiter, step, server.via)
            else:
                run_step(facade, step, recorder, server.via, conn)
    finally:
        loop.run_until_complete(limiter.close())
        loop.run_until_complete(client.aclose())
        loop.close()


def _acquire_async(loop, client, limiter, step, via):
    clock_now = [step["start"]]
    sleeps = []
    draws = list(step["random"])

    async def sleep(ms):
        sleeps.append(ms)
        clock_now[0] += ms

    acquirer = xcloak.AsyncLimiter(client, clock=xcloak.Clock(lambda: clock_now[0], sleep),
                                   jitter_fraction=step["jitter_fraction"], random=lambda: draws.pop(0))
    acquirer.engine.nodes = limiter.engine.nodes
    rec = Recorder(acquirer)
    decision = loop.run_until_complete(acquirer.acquire(step["key"], step["window"], step["limit"],
                                                        cost=step.get("cost", 1), tiers=tiers_of(step),
                                                        max_wait=step["max_wait_ms"]))
    assert sleeps == [c["sleep_ms"] for c in step["calls"] if c["sleep_ms"] is not None]
    assert to_dict(decision) == step["decision"]
    assert not draws
    check_sent(rec.take(), [c["command"] for c in step["calls"]], via)
    loop.run_until_complete(acquirer.close())
