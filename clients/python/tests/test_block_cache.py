"""The block cache (docs/clients.md, "Block cache"; xcloak/_cache.py).

The pure rules run on the cache core with a virtual monotonic clock: the
contract's vectors (clients/conformance/block_cache.json) and the package's
own cases. The live rules run against a real server with the module, counting
the server's own calls (INFO commandstats).

What would fail: a cached answer that admits, outlives its retry_after, is
given for another shape or a smaller cost, counts nothing down, survives this
limiter's refund or reset, answers a peek or a call with NOW; a cache that
grows past its bound or evicts the wrong entry; a hit that still sends the
command; a cached 429 whose headers differ in shape from the server's; threads
over-admitting through it; block_cache accepted as a bool, a float or out of
range.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis.asyncio
from limits import RateLimitItemPerMinute
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

import xcloak
import xcloak.limits  # noqa: F401  (registers xcloak://)
from servers import REPO, Server
from xcloak._cache import BlockCache, sig_of
from xcloak.asgi import Limit
from xcloak.decision import from_reply, to_dict

VECTORS = Path(REPO) / "clients/conformance/block_cache.json"


class Clock:
    """A virtual monotonic clock (ms)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def virtual(limiter, now: float = 1_000_000.0) -> Clock:
    """Puts a virtual monotonic clock under ``limiter``'s block cache."""
    clock = Clock(now)
    limiter.engine.cache.monotonic = clock
    return clock


def server_reply(allowed, limit, remaining, retry, reset, tiers=None):
    reply = [allowed, limit, remaining, retry, reset]
    return reply + [tiers] if tiers is not None else reply


# ------------------------------------------------------------ the contract's vectors


def vector_cases():
    if not VECTORS.exists():
        return []
    return json.loads(VECTORS.read_text())["cases"]


@pytest.mark.skipif(not VECTORS.exists(), reason="clients/conformance/block_cache.json is not in this checkout")
@pytest.mark.parametrize("case", vector_cases(), ids=lambda c: c["name"])
def test_vector(case):
    clock = Clock()
    cache = BlockCache(case["capacity"], monotonic=clock)
    for number, step in enumerate(case["steps"]):
        where = f"{case['name']} step {number}"
        clock.now = step["at"]
        if step["op"] == "allow":
            tiers = [tuple(t) for t in step.get("tiers", [])]
            sig = sig_of(step["window"], step["limit"], tiers)
            hit = cache.lookup(step["key"], sig, step.get("cost", 1))
            if step["sent"]:
                assert hit is None, where
                reply = step["reply"]
                stamp = len(reply) == 5 + bool(tiers) + 1
                decision = from_reply(reply, step["window"], bool(tiers), stamp=stamp)
                cache.record(step["key"], sig, step.get("cost", 1), step["at"], decision)
            else:
                assert hit is not None, where
                assert dict(to_dict(hit), via=hit.via) == step["decision"], where
                for style, fields in step.get("headers", {}).items():
                    assert xcloak.headers(hit, style) == fields, (where, style)
        elif step["op"] == "forget":
            cache.forget(step["key"])
        elif step["op"] == "size":
            assert len(cache) == step["entries"], where
        else:
            pytest.fail(f"{where}: unknown op {step['op']!r}")


# ------------------------------------------------------------ the core, by rule

SIG = sig_of(60_000, 10, [])


def blocked(cache, clock, key="k", retry=1000, reset=60_000, cost=1, sig=SIG):
    d = from_reply(server_reply(0, 10, 0, retry, reset), 60_000, False)
    cache.record(key, sig, cost, clock.now, d)


def test_expires_at_retry_after_and_is_dropped_when_met():
    clock = Clock(500.0)
    cache = BlockCache(10, monotonic=clock)
    blocked(cache, clock, retry=1000)
    clock.now = 1499.5
    d = cache.lookup("k", SIG, 1)
    assert d is not None and not d.allowed and d.retry_after_ms == 1 and d.via == xcloak.CACHE
    clock.now = 1500.0
    assert cache.lookup("k", SIG, 1) is None and len(cache) == 0


def test_countdown_of_retry_and_reset_and_the_fixed_fields():
    clock = Clock(0.0)
    cache = BlockCache(10, monotonic=clock)
    tiers = [[60_000, 10, 0, 1000, 60_000], [3_600_000, 100, 40, 0, 3_000_000]]
    d = from_reply(server_reply(0, 10, 0, 1000, 60_000, tiers), 60_000, True)
    sig = sig_of(60_000, 10, [(3_600_000, 100)])
    cache.record("k", sig, 2, 0.0, d)
    clock.now = 250.4
    hit = cache.lookup("k", sig, 2)
    assert to_dict(hit) == {
        "allowed": False, "limit": 10, "remaining": 0, "retry_after_ms": 750, "reset_after_ms": 59_750,
        "cost_exceeds_limit": False, "window_ms": 60_000, "tier": 0, "stamp": None,
        "tiers": [{"window_ms": 60_000, "limit": 10, "remaining": 0, "retry_after_ms": 750, "reset_after_ms": 59_750},
                  {"window_ms": 3_600_000, "limit": 100, "remaining": 40, "retry_after_ms": 0,
                   "reset_after_ms": 2_999_750}]}
    assert hit.oldest is None and hit.error is None and xcloak.headers(hit)["Retry-After"] == "1"


def test_a_larger_cost_is_cached_a_smaller_one_sent_and_another_shape_sent():
    clock = Clock()
    cache = BlockCache(10, monotonic=clock)
    blocked(cache, clock, cost=3)
    assert cache.lookup("k", SIG, 3) is not None and cache.lookup("k", SIG, 4) is not None
    assert cache.lookup("k", SIG, 2) is None
    for other in (sig_of(60_000, 11, []), sig_of(30_000, 10, []), sig_of(60_000, 10, [(3_600_000, 100)])):
        assert cache.lookup("k", other, 3) is None
    assert len(cache) == 1 and cache.hits == 2, "a miss of another shape keeps the entry"


def test_admission_drops_and_never_fits_errors_and_zero_waits_are_not_recorded():
    clock = Clock()
    cache = BlockCache(10, monotonic=clock)
    blocked(cache, clock)
    cache.record("k", SIG, 1, 0.0, from_reply(server_reply(1, 10, 5, 0, 60_000), 60_000, False))
    assert len(cache) == 0
    never = from_reply(server_reply(0, 10, 10, -1, 0), 60_000, False)
    zero = from_reply(server_reply(0, 10, 0, 0, 0), 60_000, False)
    policy = xcloak.Decision(allowed=False, limit=10, remaining=0, retry_after_ms=5, reset_after_ms=5,
                             window_ms=60_000, via=xcloak.ERROR)
    for d in (never, zero, policy):
        cache.record("k", SIG, 1, 0.0, d)
    assert len(cache) == 0


def test_least_recently_used_is_evicted_and_forget_drops():
    clock = Clock()
    cache = BlockCache(2, monotonic=clock)
    blocked(cache, clock, key="a")
    blocked(cache, clock, key="b")
    assert cache.lookup("a", SIG, 1) is not None  # a is now the most recent
    blocked(cache, clock, key="c")
    assert len(cache) == 2 and cache.lookup("b", SIG, 1) is None and cache.lookup("a", SIG, 1) is not None
    cache.forget("a")
    assert cache.lookup("a", SIG, 1) is None and len(cache) == 1


@pytest.mark.parametrize("value,error", [(True, TypeError), (10.0, TypeError), ("10", TypeError),
                                         (-1, ValueError), (1_000_001, ValueError)])
def test_block_cache_is_refused_when_built(value, error):
    client = redis.Redis(port=1)  # never reached: refused before any call
    for cls, c in ((xcloak.Limiter, client), (xcloak.AsyncLimiter, redis.asyncio.Redis(port=1))):
        with pytest.raises(error, match=r"block_cache must be an int.* from 0 \(off\) to 1,000,000"):
            cls(c, block_cache=value)


# ------------------------------------------------------------ live, against a server


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def test_a_cached_rejection_sends_nothing_and_counts_down(server):
    limiter = xcloak.Limiter(server.client(), prefix="t1:")
    clock = virtual(limiter)
    assert [limiter.allow("k", 60_000, 2).allowed for _ in range(3)] == [True, True, False]
    calls = server.calls("xcloak.allow")
    first = limiter.allow("k", 60_000, 2)
    clock.now += 2500
    second = limiter.allow("k", timedelta(minutes=1), 2)
    assert server.calls("xcloak.allow") == calls, "answered by the cache: no call"
    assert (first.via, second.via) == ("cache", "cache") and not first.allowed and not second.allowed
    assert second.retry_after_ms == first.retry_after_ms - 2500
    assert second.reset_after_ms == first.reset_after_ms - 2500
    assert limiter.stats == xcloak.Stats(cache_hits=2, cache_entries=1)
    # Off: every call is sent, and the stats stay zero.
    off = xcloak.Limiter(server.client(), prefix="t1:", block_cache=0)
    assert off.allow("k", 60_000, 2).via == "command" and server.calls("xcloak.allow") == calls + 1
    assert off.stats == xcloak.Stats(0, 0)


def test_expiry_then_the_server_decides_again(server):
    limiter = xcloak.Limiter(server.client(), prefix="t2:")
    assert limiter.allow("k", 200, 1).allowed
    before = time.monotonic()
    rejected = limiter.allow("k", 200, 1)
    assert not rejected.allowed and rejected.via == "command" and rejected.retry_after_ms > 0
    while (d := limiter.allow("k", 200, 1)).via == "cache":
        time.sleep(0.002)
    waited_ms = (time.monotonic() - before) * 1000
    assert waited_ms >= rejected.retry_after_ms, "the cache never outlives the server's retry_after"
    assert d.via == "command" and limiter.stats.cache_entries <= 1


def test_larger_cost_cached_smaller_sent_other_tiers_sent(server):
    limiter = xcloak.Limiter(server.client(), prefix="t3:")
    assert limiter.allow("k", 60_000, 5, cost=3).allowed
    assert limiter.allow("k", 60_000, 5, cost=3).via == "command"  # rejected: 2 left
    calls = server.calls("xcloak.allow")
    assert limiter.allow("k", 60_000, 5, cost=4).via == "cache"
    assert server.calls("xcloak.allow") == calls
    d = limiter.allow("k", 60_000, 5, tiers=[(3_600_000, 50)], cost=3)
    assert d.via == "command" and not d.allowed and server.calls("xcloak.allow") == calls + 1
    d = limiter.allow("k", 60_000, 5, cost=2)
    assert d.via == "command" and d.allowed, "a smaller cost is sent, and fits"
    assert server.calls("xcloak.allow") == calls + 2


def test_refund_and_reset_through_the_limiter_drop_the_entry(server):
    limiter = xcloak.Limiter(server.client(), prefix="t4:")
    stamp = limiter.allow("k", 60_000, 1, stamp=True).stamp
    assert limiter.allow("k", 60_000, 1).via == "command" and limiter.allow("k", 60_000, 1).via == "cache"
    assert limiter.refund("k", stamp) == 1
    d = limiter.allow("k", 60_000, 1)
    assert d.allowed and d.via == "command"
    assert limiter.allow("k", 60_000, 1).via == "command" and limiter.allow("k", 60_000, 1).via == "cache"
    assert limiter.reset("k")
    assert limiter.allow("k", 60_000, 1).allowed
    # A pipeline's refund and reset drop it too (its allows are sent as queued).
    assert limiter.allow("k", 60_000, 1).via == "command"
    with limiter.pipeline() as p:
        p.allow("k", 60_000, 1).reset("k")
        queued, _ = p.execute()
    assert queued.via == "command" and not queued.allowed
    assert limiter.allow("k", 60_000, 1).allowed


def test_explicit_now_a_clock_and_peek_bypass(server):
    limiter = xcloak.Limiter(server.client(), prefix="t5:")
    assert limiter.allow("k", 60_000, 1).allowed and limiter.allow("k", 60_000, 1).via == "command"
    allows, peeks = server.calls("xcloak.allow"), server.calls("xcloak.peek")
    now_ms = int(time.time() * 1000)
    d = limiter.allow("k", 60_000, 1, now=now_ms)
    assert d.via == "command" and not d.allowed and server.calls("xcloak.allow") == allows + 1
    assert limiter.peek("k", 60_000, 1).via == "command" and server.calls("xcloak.peek") == peeks + 1
    clocked = xcloak.Limiter(server.client(), prefix="t5:",
                             clock=xcloak.Clock(now_ms=lambda: int(time.time() * 1000), sleep=lambda ms: None))
    for _ in range(2):
        assert clocked.allow("k", 60_000, 1).via == "command"
    assert server.calls("xcloak.allow") == allows + 3 and clocked.stats.cache_entries == 0
    # allow_all whose first identity is blocked costs no call.
    multi = limiter.allow_all([{"key": "k", "window": 60_000, "limit": 1}, {"key": "j", "window": 60_000, "limit": 1}])
    assert not multi.allowed and multi.rejected == 0 and multi.via == "cache"
    assert server.calls("xcloak.allow") == allows + 3


def test_acquire_waits_the_counted_down_retry_after_locally(server):
    limiter = xcloak.Limiter(server.client(), prefix="t6:")
    assert limiter.allow("k", 300, 1).allowed and not limiter.allow("k", 300, 1).allowed
    calls = server.calls("xcloak.allow")
    d = limiter.acquire("k", 300, 1, max_wait=5000)
    assert d.allowed and d.via == "command"
    # Its first turn was the cache's answer (no call), then it slept to the
    # deadline locally: one call admitted it (a second only if the local
    # deadline ran a hair ahead of the server's, and then a hit again).
    assert limiter.stats.cache_hits >= 1
    assert server.calls("xcloak.allow") - calls <= 2


def test_threads_hammering_one_key_never_over_admit(server):
    limiter = xcloak.Limiter(server.client(), prefix="t7:")
    admitted = []
    barrier = threading.Barrier(8)

    def hammer():
        barrier.wait()
        admitted.append(sum(limiter.allow("k", 60_000, 10).allowed for _ in range(50)))

    calls = server.calls("xcloak.allow")
    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = server.calls("xcloak.allow") - calls
    assert sum(admitted) == 10 and server.client().zcard("t7:k") == 10, "the server's own count"
    assert sent + limiter.stats.cache_hits == 400 and sent < 400


async def test_asyncio(server):
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=server.port), prefix="t8:")
    try:
        decisions = await asyncio.gather(*(limiter.allow("k", 60_000, 10) for _ in range(40)))
        assert sum(d.allowed for d in decisions) == 10 and server.client().zcard("t8:k") == 10
        calls = server.calls("xcloak.allow")
        d = await limiter.allow("k", 60_000, 10)
        if d.via == "command":  # every rejection above was in flight at once: none cached before
            d = await limiter.allow("k", 60_000, 10)
        assert d.via == "cache" and not d.allowed and server.calls("xcloak.allow") <= calls + 1
        assert limiter.stats.cache_hits >= 1
        await limiter.refund("k", 0)
        assert limiter.stats.cache_entries == 0
    finally:
        await limiter.close()


def test_asgi_cached_429_has_the_servers_shape(server):
    from test_asgi import Serving, starlette_app

    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=server.port), prefix="t9:")
    clock = virtual(limiter)
    serving = Serving(starlette_app(limiter=limiter, limits=[Limit(60_000, 2)]))
    try:
        assert [serving.get()[0] for _ in range(2)] == [200, 200]
        status, from_server, body = serving.get()
        calls = server.calls("xcloak.allow")
        clock.now += 5000
        cached_status, from_cache, cached_body = serving.get()
        assert server.calls("xcloak.allow") == calls, "the cached 429 sent nothing"
        assert (status, cached_status) == (429, 429) and body == cached_body
        assert from_server.keys() - {"date"} == from_cache.keys() - {"date"}
        assert from_cache["ratelimit-policy"] == from_server["ratelimit-policy"] == '"2-in-60s";q=2;w=60'
        assert int(from_cache["retry-after"]) == int(from_server["retry-after"]) - 5
        server_t = int(from_server["ratelimit"].rsplit("t=", 1)[1])
        assert from_cache["ratelimit"] == f'"2-in-60s";r=0;t={server_t - 5}'
    finally:
        serving.close()


def test_limits_storage_option_and_strategy(server):
    with pytest.raises(ValueError, match="block_cache must be an integer from 0"):
        storage_from_string(f"xcloak://127.0.0.1:{server.port}?block_cache=ten")
    with pytest.raises(ValueError, match="block_cache must be an integer from 0"):
        storage_from_string(f"xcloak://127.0.0.1:{server.port}?block_cache=1000001")
    assert storage_from_string(f"xcloak://127.0.0.1:{server.port}?block_cache=0").limiter.engine.cache is None
    assert storage_from_string(f"xcloak://127.0.0.1:{server.port}", block_cache=7).limiter.engine.cache.capacity == 7
    storage = storage_from_string(f"xcloak://127.0.0.1:{server.port}?block_cache=5", key_prefix="t10")
    assert storage.limiter.engine.cache.capacity == 5
    strategy = MovingWindowRateLimiter(storage)
    item = RateLimitItemPerMinute(2)
    assert [strategy.hit(item, "alice") for _ in range(3)] == [True, True, False]
    calls = server.calls("xcloak.allow")
    assert not strategy.hit(item, "alice") and server.calls("xcloak.allow") == calls
    assert storage.limiter.stats.cache_hits == 1
    strategy.clear(item, "alice")
    assert strategy.hit(item, "alice") and server.calls("xcloak.allow") == calls + 1
    assert strategy.hit(item, "alice") and not strategy.hit(item, "alice") and not strategy.hit(item, "alice")
    assert storage.limiter.stats == xcloak.Stats(cache_hits=2, cache_entries=1)
    storage.reset()
    assert storage.limiter.stats.cache_entries == 0 and strategy.hit(item, "alice")


def test_allow_all_hit_at_j_refunds_the_earlier_admissions(server):
    limiter = xcloak.Limiter(server.client(), prefix="t11:")
    assert limiter.allow("k", 60_000, 1).allowed and limiter.allow("k", 60_000, 1).via == "command"
    calls, refunds = server.calls("xcloak.allow"), server.calls("xcloak.refund")
    multi = limiter.allow_all([{"key": "a", "window": 60_000, "limit": 5},
                               {"key": "k", "window": 60_000, "limit": 1},
                               {"key": "b", "window": 60_000, "limit": 5}])
    assert not multi.allowed and multi.rejected == 1 and multi.binding.via == "cache"
    assert [d.via for d in multi.decisions] == ["command", "cache"], "nothing sent after the hit"
    assert server.calls("xcloak.allow") == calls + 1 and server.calls("xcloak.refund") == refunds + 1
    assert server.client().zcard("t11:a") == 0 and not server.client().exists("t11:b")


def test_an_outage_does_not_reach_a_cached_key(server):
    limiter = xcloak.Limiter(server.client(), prefix="t12:", timeout=200)
    assert limiter.allow("k", 60_000, 1).allowed and not limiter.allow("k", 60_000, 1).allowed
    server.pause()
    try:
        d = limiter.allow("k", 60_000, 1)  # on_error="raise": a call would raise UnavailableError
        assert d.via == "cache" and not d.allowed
        with pytest.raises(xcloak.UnavailableError):
            limiter.allow("other", 60_000, 1)
    finally:
        server.resume()
