"""Cluster and Sentinel, against real servers: RedisCluster (sync and asyncio)
reaches each key's node directly (0 MOVED), PEEK goes to replicas when asked,
the fallback is chosen per node (a cluster whose primaries differ), and a
Sentinel-managed client and the xcloak+cluster:// / xcloak+sentinel://
storages work.

What would fail: routing by a random node (MOVED replies), a fallback
decided once for the whole cluster (keys on the node without the module
would raise "unknown command", or every node would run the script), replica
reads without READONLY (MOVED from the replica) or PEEKs left on primaries.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time

import pytest
import redis
import redis.asyncio
from limits import RateLimitItemPerMinute
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

import xcloak
import xcloak.limits
from servers import SERVER, Cluster, Server, free_port, raw


def stat(nodes, section, prefix):
    total = 0
    for node in nodes:
        for line in raw(node.client(), "INFO", section).decode().splitlines():
            if line.startswith(prefix):
                total += int(line[len(prefix):].split(",")[0])
    return total


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(3, 1)
    yield c
    c.close()


def test_cluster_calls_reach_the_key_node_and_peeks_the_replica(cluster):
    for node in cluster.nodes:
        node.client().config_resetstat()
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    limiter = xcloak.Limiter(client, replica_reads=True)
    keys = [f"rl:c:{i}" for i in range(60)]
    for key in keys:
        for _ in range(3):
            assert limiter.allow(key, 600_000, 2).via == xcloak.COMMAND
    assert {cluster.owner(k).port for k in keys} == {p.port for p in cluster.primaries}, "every primary serves some"
    assert stat(cluster.primaries, "commandstats", "cmdstat_xcloak.allow:calls=") == 180
    for key in keys:
        assert cluster.owner(key).client().zcard(key) == 2
    time.sleep(0.5)  # replication
    decisions = [limiter.peek(key, 600_000, 2) for key in keys]
    assert all(not d.allowed and d.remaining == 0 for d in decisions)
    assert stat(cluster.replicas, "commandstats", "cmdstat_xcloak.peek:calls=") == 60
    assert stat(cluster.primaries, "commandstats", "cmdstat_xcloak.peek:calls=") == 0
    assert stat(cluster.nodes, "errorstats", "errorstat_MOVED:count=") == 0
    limiter.close()


def test_async_cluster(cluster):
    async def main():
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        limiter = xcloak.AsyncLimiter(client)
        results = [(await limiter.allow(f"rl:a:{i}", 600_000, 1)).allowed for i in range(30)]
        again = [(await limiter.allow(f"rl:a:{i}", 600_000, 1)).allowed for i in range(30)]
        multi = await limiter.allow_all([{"key": "rl:a:x", "window": 600_000, "limit": 5},
                                         {"key": "rl:a:0", "window": 600_000, "limit": 1}])
        await limiter.close()
        await client.aclose()
        return results, again, multi

    results, again, multi = asyncio.run(main())
    assert all(results) and not any(again)
    assert not multi.allowed and multi.rejected == 1
    assert cluster.owner("rl:a:x").client().zcard("rl:a:x") == 0, "refunded across slots"


@pytest.mark.parametrize("policy", ["raise", "allow", "deny"])
def test_allow_all_with_the_second_node_paused(cluster, policy):
    """An outage at request 1 (its node paused past the timeout): request 0 is
    refunded on its own node, then the policy answers once. Under allow and
    deny: the decision received for request 0, then a via=error decision for
    request 1 (its own tier 0), which binds; rejected is 1 under deny, None
    under allow. Would fail: the error decision built from request 0, the
    received decisions dropped, rejected left None under deny, no refund."""
    first = f"rl:o:{policy}:first"
    second = next(f"rl:o:{policy}:{i}" for i in range(1000)
                  if cluster.owner(f"rl:o:{policy}:{i}") is not cluster.owner(first))
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    limiter = xcloak.Limiter(client, on_error=policy, timeout=300)
    limiter.reset(second)  # a connection to its node, before it stops answering
    requests = [{"key": first, "window": 600_000, "limit": 5}, {"key": second, "window": 120_000, "limit": 7}]
    owner = cluster.owner(second)
    owner.pause()
    try:
        if policy == "raise":
            with pytest.raises(xcloak.UnavailableError):
                limiter.allow_all(requests, stamp=True)
            multi = None
        else:
            multi = limiter.allow_all(requests, stamp=True)
    finally:
        owner.resume()
    assert cluster.owner(first).client().zcard(first) == 0, "request 0 refunded on its node"
    limiter.close()
    if multi is None:
        return
    assert multi.allowed == (policy == "allow") and multi.via == xcloak.ERROR
    assert multi.rejected == (1 if policy == "deny" else None)
    assert multi.binding_index == 1 and len(multi.decisions) == 2
    received, failed = multi.decisions
    assert received.allowed and received.via == xcloak.COMMAND and received.limit == 5
    assert received.remaining == 4 and received.stamp is not None, "it still shows its own admission"
    assert failed.via == xcloak.ERROR and failed.allowed == multi.allowed and failed.error is not None
    assert (failed.limit, failed.window_ms, failed.remaining, failed.tier) == (7, 120_000, 0, 0)
    assert multi.binding is failed and multi.retry_after_ms == 0 and xcloak.headers(multi) == {}


def test_cluster_storage_for_limits(cluster):
    storage = storage_from_string(f"xcloak+cluster://127.0.0.1:{cluster.nodes[0].port}")
    limiter = MovingWindowRateLimiter(storage)
    item = RateLimitItemPerMinute(2)
    assert [limiter.hit(item, "u") for _ in range(3)] == [True, True, False]
    assert limiter.get_window_stats(item, "u").remaining == 0
    limiter.clear(item, "u")
    assert limiter.hit(item, "u")


def test_fallback_is_chosen_per_node():
    """Primary 1 has no module: its keys go through the script, the others'
    through the command, in one cluster and one limiter."""
    c = Cluster(3, 0, without_module=(1,))
    try:
        bare = c.nodes[1]
        client = RedisCluster(host="127.0.0.1", port=c.nodes[0].port)
        limiter = xcloak.Limiter(client)
        seen = {}
        for i in range(40):
            key = f"rl:p:{i}"
            d = limiter.allow(key, 600_000, 5)
            assert d.allowed and d.remaining == 4
            seen[key] = d.via
        for key, via in seen.items():
            owner = c.owner(key)
            assert via == (xcloak.SCRIPT if owner is bare else xcloak.COMMAND), key
            assert owner.client().zcard(key) == 1
        assert set(seen.values()) == {xcloak.SCRIPT, xcloak.COMMAND}
        assert bare.calls("evalsha") > 0
        assert all(n.calls("evalsha") == 0 for n in c.nodes if n is not bare)
    finally:
        c.close()


def test_sentinel_managed_client():
    primary = Server()
    replica = Server(args=["--replicaof", "127.0.0.1", str(primary.port)])
    port = free_port()
    folder = tempfile.mkdtemp(prefix="xcloak-sentinel-")
    conf = os.path.join(folder, "sentinel.conf")
    with open(conf, "w") as f:
        f.write(f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor mymaster 127.0.0.1 {primary.port} 1\n"
                "sentinel down-after-milliseconds mymaster 5000\n")
    sentinel_proc = subprocess.Popen([SERVER, conf, "--sentinel"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
    try:
        sentinel = Sentinel([("127.0.0.1", port)], socket_timeout=2)
        deadline = time.monotonic() + 20
        while True:
            try:
                sentinel.discover_master("mymaster")
                break
            except (redis.RedisError, OSError):
                assert time.monotonic() < deadline, "sentinel did not start"
                time.sleep(0.1)
        limiter = xcloak.Limiter(sentinel.master_for("mymaster"))
        assert [limiter.allow("rl:s", 60_000, 2).allowed for _ in range(3)] == [True, True, False]
        assert primary.client().zcard("rl:s") == 2
        storage = storage_from_string(f"xcloak+sentinel://127.0.0.1:{port}/mymaster")
        mw = MovingWindowRateLimiter(storage)
        item = RateLimitItemPerMinute(1)
        assert [mw.hit(item, "x"), mw.hit(item, "x")] == [True, False]
        assert primary.calls("xcloak.allow") == 5
    finally:
        sentinel_proc.terminate()
        sentinel_proc.wait(10)
        replica.close()
        primary.close()
