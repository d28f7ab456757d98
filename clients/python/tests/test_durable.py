"""Durable mode against a real primary and its replica: ``WAIT`` follows the
reply of an admission (and of a refund) on the same connection, and a
rejection sends none (counted by the server, ``cmdstat_wait``); a durable
allow always carries ``STAMP``, and the decision shows the stamp only if
asked; an admission not replicated in time (the replica paused) goes to the
policy, and ``deny`` refunds it.

What would fail: a WAIT pipelined behind every call (each rejection would
then wait its timeout while a replica is down), STAMP sent only under deny,
a stamp shown that was not asked for, a not-replicated admission reported as
a plain success, a denied admission left in the window.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

import xcloak
from servers import Server


@pytest.fixture(scope="module")
def pair():
    primary = Server()
    replica = Server(args=["--replicaof", "127.0.0.1", str(primary.port)])
    try:
        deadline = time.monotonic() + 30
        while replica.client().info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never linked"
            time.sleep(0.05)
        yield primary, replica
    finally:
        replica.close()
        primary.close()


def record(limiter):
    """The commands the limiter sends, as strings (a hook on its transport)."""
    sent = []
    original = limiter._transport.exchange

    def exchange(node, commands, *rest):
        sent.extend([str(a) for a in c] for c in commands)
        return original(node, commands, *rest)

    limiter._transport.exchange = exchange
    return sent


def test_wait_after_admissions_and_refunds_only(pair):
    primary, replica = pair
    primary.client().config_resetstat()
    limiter = xcloak.Limiter(primary.client(), durable=xcloak.Durable(replicas=1, timeout=2000))
    sent = record(limiter)
    decisions = [limiter.allow("d", 60000, 2, stamp=i == 1) for i in range(4)]
    assert [d.allowed for d in decisions] == [True, True, False, False]
    assert [d.stamp is not None for d in decisions] == [False, True, False, False], "the stamp only where asked"
    allow = ["XCLOAK.ALLOW", "d", "60000", "2", "DETAILS", "STAMP"]
    wait = ["WAIT", "1", "2000"]
    # The fourth is the block cache's answer to the third's rejection: nothing sent.
    assert sent == [allow, wait, allow, wait, allow] and decisions[3].via == xcloak.CACHE
    assert primary.calls("wait") == 2, "a rejection wrote nothing: no WAIT"
    assert replica.client().zcard("d") == 2
    del sent[:]
    assert limiter.refund("d", decisions[1].stamp) == 1
    assert sent == [["XCLOAK.REFUND", "d", str(decisions[1].stamp)], wait]
    assert replica.client().zcard("d") == 1, "the refund was replicated before it returned"
    limiter.close()


@pytest.mark.parametrize("policy", ["raise", "allow", "deny"])
def test_not_replicated_goes_to_the_policy_and_deny_refunds(pair, policy):
    primary, replica = pair
    key = f"lonely:{policy}"
    limiter = xcloak.Limiter(primary.client(), on_error=policy,
                             durable=xcloak.Durable(replicas=1, timeout=100))
    sent = record(limiter)
    primary.client().config_resetstat()
    replica.pause()
    try:
        if policy == "raise":
            with pytest.raises(xcloak.UnavailableError, match="not replicated"):
                limiter.allow(key, 60000, 5)
        else:
            d = limiter.allow(key, 60000, 5)
            assert d.via == xcloak.ERROR and d.allowed == (policy == "allow")
            assert "not replicated" in str(d.error) and d.stamp is None
        assert sent[0][-1] == "STAMP", "a durable allow carries STAMP whatever the policy"
        assert primary.client().zcard(key) == (0 if policy == "deny" else 1)
        assert primary.calls("xcloak.refund") == (1 if policy == "deny" else 0)
        # A rejection with the replica still down: no WAIT, so no wait.
        rejected = limiter.allow(key, 60000, 0)
        assert not rejected.allowed and rejected.via == xcloak.COMMAND
        assert primary.calls("wait") == 1, "one WAIT: the admission's"
    finally:
        replica.resume()
    limiter.close()


def test_async_waits_after_admissions_only(pair):
    primary, replica = pair

    async def main():
        client = redis.asyncio.Redis(port=primary.port)
        limiter = xcloak.AsyncLimiter(client, durable=xcloak.Durable(replicas=1, timeout=2000))
        decisions = [await limiter.allow("ad", 60000, 1) for _ in range(3)]
        assert [d.allowed for d in decisions] == [True, False, False]
        assert all(d.stamp is None for d in decisions)
        await limiter.close()
        await client.aclose()

    primary.client().config_resetstat()
    asyncio.run(main())
    assert primary.calls("wait") == 1
    assert replica.client().zcard("ad") == 1


def test_pipelines_are_refused_in_durable_mode(pair):
    """A pipeline reports each admission with its reply, before any WAIT: in
    durable mode that would be a plain success for an unreplicated admission,
    so pipeline() refuses, sync and asyncio (and works without durable mode)."""
    primary, _ = pair
    durable = xcloak.Durable(replicas=1, timeout=100)
    with pytest.raises(xcloak.XcloakError, match="durable"):
        xcloak.Limiter(primary.client(), durable=durable).pipeline()
    assert xcloak.Limiter(primary.client()).pipeline() is not None

    async def main():
        client = redis.asyncio.Redis(port=primary.port)
        try:
            with pytest.raises(xcloak.XcloakError, match="durable"):
                xcloak.AsyncLimiter(client, durable=durable).pipeline()
        finally:
            await client.aclose()

    asyncio.run(main())


def test_wait_has_its_own_budget(pair):
    """A durable WAIT longer than the limiter's timeout (replica paused, WAIT
    timeout 600 ms, limiter timeout 200 ms) ends as "not replicated", not as
    a timeout of the call: the WAIT's budget is its own timeout plus the
    limiter's (docs/clients.md, Durable mode). Under deny the admission is
    then refunded; a timeout would have left it in the window."""
    primary, replica = pair
    limiter = xcloak.Limiter(primary.client(), timeout=200, on_error="deny",
                             durable=xcloak.Durable(replicas=1, timeout=600))
    replica.pause()
    try:
        d = limiter.allow("budget", 60000, 5)
    finally:
        replica.resume()
    assert d.via == "error" and not d.allowed
    assert "not replicated" in str(d.error), d.error
    assert primary.client().zcard("budget") == 0
