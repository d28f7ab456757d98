"""The ASGI middleware and the FastAPI dependency, driven over real HTTP:
uvicorn on loopback, http.client requests, a real redis-server.

What would fail: headers missing on allowed responses, a 429 without
Retry-After (or one on a never-fits request), X-Forwarded-For trusted from
any peer (a client picks its own key) or ignored behind a trusted proxy, two
limits not all-or-nothing, skip_successful done by PEEK (or refunding the
wrong stamp: the failures would not hold the window), deny not answering 503.
"""

from __future__ import annotations

import http.client
import threading
import time

import pytest
import redis.asyncio
import uvicorn
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import xcloak
from servers import Server, free_port
from xcloak.asgi import Limit, RateLimit, RateLimitMiddleware


class Serving:
    """uvicorn serving ``app`` on a free loopback port, in a thread."""

    def __init__(self, app):
        self.port = free_port()
        # proxy_headers off: uvicorn would otherwise rewrite the client address
        # from X-Forwarded-For itself (it trusts 127.0.0.1 by default).
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", lifespan="off",
                                proxy_headers=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def get(self, path="/", headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        body = response.read().decode()
        conn.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def redis_server():
    s = Server()
    yield s
    s.close()


def starlette_app(**middleware):
    async def ok(request):
        return PlainTextResponse("ok")

    async def fail(request):
        return PlainTextResponse("wrong password", status_code=401)

    app = Starlette(routes=[Route("/", ok), Route("/login", fail), Route("/open", ok)])
    app.add_middleware(RateLimitMiddleware, **middleware)
    return app


def test_429_with_headers_and_headers_on_allowed(redis_server):
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))
    serving = Serving(starlette_app(limiter=limiter, limits=[Limit(60_000, 3)]))
    try:
        replies = [serving.get() for _ in range(4)]
        assert [status for status, _, _ in replies] == [200, 200, 200, 429]
        for i, (_, headers, _) in enumerate(replies[:3]):
            assert headers["ratelimit-policy"] == '"3-in-60s";q=3;w=60'
            assert headers["ratelimit"] == f'"3-in-60s";r={2 - i};t=60'
            assert "retry-after" not in headers
        status, headers, body = replies[3]
        assert headers["ratelimit"].startswith('"3-in-60s";r=0;t=')
        assert 1 <= int(headers["retry-after"]) <= 60 and body == "Too Many Requests\n"
        # One key per client address, under rl:http:.
        assert redis_server.client().zcard("rl:http:127.0.0.1") == 3
    finally:
        serving.close()


def test_tiers_two_limits_and_legacy_headers(redis_server):
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))
    limits = [Limit(60_000, 5, tiers=[(3_600_000, 20)], names=["per-minute", "per-hour"]),
              Limit(1_000, 2, name="burst")]
    serving = Serving(starlette_app(limiter=limiter, limits=limits, style="both"))
    try:
        statuses = [serving.get()[0] for _ in range(3)]
        assert statuses == [200, 200, 429], "the burst limit of 2 a second binds"
        client = redis_server.client()
        # All or nothing: the rejected request was refunded from the minute/hour key.
        assert client.zcard("rl:http:127.0.0.1") == 2 and client.zcard("rl:burst:127.0.0.1") == 2
        status, headers, _ = serving.get()
        assert status == 429
        assert headers["ratelimit-policy"] == ('"per-minute";q=5;w=60, "per-hour";q=20;w=3600, '
                                               '"2-in-1s";q=2;w=1')
        assert headers["ratelimit-limit"] == "2" and headers["ratelimit-remaining"] == "0"
        time.sleep(1.05)
        assert serving.get()[0] == 200
    finally:
        serving.close()


def test_x_forwarded_for_only_from_trusted_proxies(redis_server):
    def limiter():  # one per server: each uvicorn thread has its own event loop
        return xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))

    untrusted = Serving(starlette_app(limiter=limiter(), limits=[Limit(60_000, 1)]))
    trusted = Serving(starlette_app(limiter=limiter(), limits=[Limit(60_000, 1, name="behind")],
                                    trusted_proxies=["127.0.0.0/8", "10.0.0.0/8"]))
    try:
        # Not trusted: a client can't pick its key by sending the header.
        assert untrusted.get(headers={"X-Forwarded-For": "198.51.100.1"})[0] == 200
        assert untrusted.get(headers={"X-Forwarded-For": "198.51.100.2"})[0] == 429
        # Trusted: the rightmost address not a proxy is the client.
        forwarded = {"X-Forwarded-For": "203.0.113.9, 198.51.100.7, 10.1.2.3"}
        assert trusted.get(headers=forwarded)[0] == 200
        assert trusted.get(headers=forwarded)[0] == 429
        assert trusted.get(headers={"X-Forwarded-For": "198.51.100.8"})[0] == 200
        client = redis_server.client()
        assert client.exists("rl:behind:198.51.100.7") and client.exists("rl:behind:198.51.100.8")
        assert not client.exists("rl:http:198.51.100.1")
    finally:
        untrusted.close()
        trusted.close()


def test_skip_successful_refunds_the_requests_own_stamp(redis_server):
    """Count only failed logins: successes are refunded after the response."""
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))
    serving = Serving(starlette_app(limiter=limiter, limits=[Limit(60_000, 3)], skip_successful=True))
    try:
        assert [serving.get("/open")[0] for _ in range(6)] == [200] * 6, "successes never count"
        time.sleep(0.1)
        assert redis_server.client().zcard("rl:http:127.0.0.1") == 0
        assert [serving.get("/login")[0] for _ in range(4)] == [401, 401, 401, 429]
        status, headers, _ = serving.get("/open")
        assert status == 429, "three failures hold the window"
    finally:
        serving.close()


def test_never_fits_gets_429_without_retry_after(redis_server):
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))
    serving = Serving(starlette_app(limiter=limiter, limits=[Limit(60_000, 2, cost=3)]))
    try:
        status, headers, body = serving.get()
        assert status == 429 and "retry-after" not in headers and "larger than the limit" in body
    finally:
        serving.close()


@pytest.mark.parametrize("policy,expected", [("deny", 503), ("allow", 200), ("raise", 500)])
def test_error_policy_over_http(policy, expected):
    s = Server()
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=s.port), on_error=policy, timeout=300)
    serving = Serving(starlette_app(limiter=limiter, limits=[Limit(60_000, 3)]))
    try:
        assert serving.get()[0] == 200
        s.stop()
        status, headers, _ = serving.get()
        assert status == expected
        assert "ratelimit" not in headers
    finally:
        serving.close()
        s.close()


def test_fastapi_dependency(redis_server):
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))
    app = FastAPI()
    per_route = RateLimit(limiter, Limit(60_000, 2, name="search"))

    @app.get("/search")
    async def search(decision=Depends(per_route)):
        return {"remaining": decision.remaining}

    @app.get("/free")
    async def free():
        return {"ok": True}

    serving = Serving(app)
    try:
        first = serving.get("/search")
        assert first[0] == 200 and first[1]["ratelimit"] == '"2-in-60s";r=1;t=60' and '"remaining":1' in first[2]
        assert serving.get("/search")[0] == 200
        status, headers, _ = serving.get("/search")
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert serving.get("/free")[0] == 200, "other routes are not limited"
    finally:
        serving.close()


def test_the_decision_is_request_state_rate_limit(redis_server):
    async def show(request):
        d = request.state.rate_limit
        return PlainTextResponse(f"{d.allowed} {d.remaining} {d.limit}")

    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))
    app = Starlette(routes=[Route("/", show)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, limits=[Limit(60_000, 3)])
    serving = Serving(app)
    try:
        assert [serving.get()[2] for _ in range(2)] == ["True 2 3", "True 1 3"]
    finally:
        serving.close()


def test_skip_successful_holds_a_slot_until_the_refund(redis_server):
    """README, skip_successful: an admission is refunded after its response,
    so successes still in flight hold their slots. 60 concurrent successful
    requests (each answered after 300 ms), limit 10: 10 are served, 50 get 429,
    though no success is counted once they are done."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    async def slow(request):
        await asyncio.sleep(0.3)
        return PlainTextResponse("ok")

    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=redis_server.port))
    app = Starlette(routes=[Route("/", slow)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, limits=[Limit(60_000, 10)], skip_successful=True)
    serving = Serving(app)
    try:
        barrier = threading.Barrier(60)

        def one(_):
            barrier.wait()
            return serving.get()[0]

        with ThreadPoolExecutor(60) as pool:
            statuses = list(pool.map(one, range(60)))
        assert statuses.count(200) >= 10 and statuses.count(429) > 0, statuses
        assert statuses.count(200) + statuses.count(429) == 60
        print(f"60 concurrent successes, limit 10: {statuses.count(200)} served, {statuses.count(429)} got 429")
        deadline = time.monotonic() + 5
        while redis_server.client().zcard("rl:http:127.0.0.1") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert redis_server.client().zcard("rl:http:127.0.0.1") == 0, "every success refunded once done"
        assert serving.get()[0] == 200
    finally:
        serving.close()
