"""Flask through Flask-Limiter with the xcloak:// storage: the shipped example
(examples/flask_app.py) served by werkzeug on loopback, driven over HTTP,
against a server with the module and one without (the fallback).

What would fail: the scheme not registered by ``import xcloak.limits``, the
moving window not on XCLOAK.ALLOW (the server's commandstats would show
limits' own EVALSHA of its list script instead), a wrong window count in
get_moving_window (Flask-Limiter's X-RateLimit-Remaining / Reset headers).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servers import Server, free_port

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flask_app.py"


def get(port, path="/"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    r = conn.getresponse()
    r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}


@pytest.mark.parametrize("module", [True, False], ids=["command", "script"])
def test_flask_limiter_app_on_xcloak(module):
    server = Server(module=module)
    port = free_port()
    env = dict(os.environ, RATELIMIT_STORAGE_URI=f"xcloak://127.0.0.1:{server.port}")
    app = subprocess.Popen([sys.executable, str(EXAMPLE), str(port)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if get(port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert app.poll() is None, app.stderr.read().decode()
            assert time.monotonic() < deadline, "the Flask app did not start"
            time.sleep(0.1)
        replies = [get(port) for _ in range(4)]
        assert [status for status, _ in replies] == [200, 200, 200, 429]
        assert [h["x-ratelimit-remaining"] for _, h in replies[:3]] == ["2", "1", "0"]
        assert replies[0][1]["x-ratelimit-limit"] == "3"
        assert 55 <= int(replies[3][1]["retry-after"]) <= 60
        # The window lives in xcloak's key, decided by the command or the script.
        client = server.client()
        keys = [k.decode() for k in client.keys("*")]
        assert any(k.startswith("LIMITS:xcloak:") for k in keys), keys
        if module:
            assert server.calls("xcloak.allow") >= 4 and server.calls("xcloak.peek") >= 1
        else:
            assert server.calls("evalsha") + server.calls("evalsha_ro") >= 5
        assert client.type(next(k for k in keys if "minute" in k)) == b"zset"
    finally:
        app.terminate()
        app.wait(10)
        server.close()


def _app(uri, limit, **options):
    from flask import Flask
    from flask_limiter import Limiter

    import xcloak.limits  # noqa: F401

    app = Flask(__name__)
    limiter = Limiter(lambda: "client", app=app, storage_uri=uri, strategy="moving-window", **options)

    @app.route("/")
    @limiter.limit(limit)
    def index():
        return "ok"

    return app


def test_a_limit_over_the_cap_and_flask_limiters_in_memory_fallback(caplog):
    """README, "The cap on limit": '1000001/hour' on xcloak:// is the server's
    XcloakError at the first request (a 500), under every on_error. With
    Flask-Limiter's in_memory_fallback_enabled, Flask-Limiter takes that error
    for an unreachable storage and limits in process memory instead (logged
    once): the requests are served, nothing reaches Redis."""
    server = Server()
    try:
        uri = f"xcloak://127.0.0.1:{server.port}?on_error=allow"
        plain = _app(uri, "1000001/hour").test_client()
        assert plain.get("/").status_code == 500
        fallback = _app(uri, "1000001/hour", in_memory_fallback_enabled=True).test_client()
        assert [fallback.get("/").status_code for _ in range(3)] == [200, 200, 200]
        assert "falling back to in-memory storage" in caplog.text
        assert server.client().keys("LIMITS:xcloak:*") == []
        assert server.calls("xcloak.allow") == 2, "one refused ALLOW per app, then the fallback's memory"
    finally:
        server.close()


def test_a_frozen_clock_reaches_the_moving_window(monkeypatch):
    """README, "Tests that freeze time": the moving window runs on the
    server's clock, so freezegun or hiro move nothing there; a Clock reading
    the (frozen) time.time() sends it as NOW. Here time.time is frozen and
    moved by hand, as freezegun does: the window frees when the frozen time
    passes a minute, though no real minute passed."""
    import xcloak

    frozen = [time.time()]
    monkeypatch.setattr(time, "time", lambda: frozen[0])
    clock = xcloak.Clock(now_ms=lambda: int(time.time() * 1000), sleep=time.sleep)
    server = Server()
    try:
        client = _app(f"xcloak://127.0.0.1:{server.port}", "2/minute",
                      storage_options={"clock": clock}).test_client()
        assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]
        frozen[0] += 61
        assert client.get("/").status_code == 200
        # Without the clock the server's own time decides: no minute passed there.
        plain = _app(f"xcloak://127.0.0.1:{server.port}", "2/minute", key_prefix="plain").test_client()
        assert [plain.get("/").status_code for _ in range(3)] == [200, 200, 429]
        frozen[0] += 61
        assert plain.get("/").status_code == 429
    finally:
        server.close()


def test_a_rejection_answers_the_headers_window_without_a_peek():
    """Flask-Limiter with headers asks get_moving_window after every hit: a
    PEEK after an admission, nothing after a rejection (its reply already
    says when the oldest entry leaves). The headers are the same figures:
    X-RateLimit-Remaining 0, Retry-After and X-RateLimit-Reset the window's
    oldest entry's expiry, as a PEEK reads them (checked against one)."""
    import xcloak

    server = Server()
    try:
        client = _app(f"xcloak://127.0.0.1:{server.port}", "3/minute", headers_enabled=True).test_client()
        start = time.time()
        replies = [client.get("/") for _ in range(6)]
        assert [r.status_code for r in replies] == [200, 200, 200, 429, 429, 429]
        # Three admissions, one rejection sent; the block cache answers the other two.
        assert server.calls("xcloak.allow") == 4
        assert server.calls("xcloak.peek") == 3, "a PEEK after each admission only"
        (key,) = server.client().keys("LIMITS:xcloak:*")
        peek = xcloak.Limiter(server.client()).peek(key.decode(), 60_000, 3, oldest=True)
        assert peek.oldest is not None and peek.remaining == 0
        for r in replies[3:]:
            assert r.headers["X-RateLimit-Remaining"] == "0"
            reset = int(r.headers["X-RateLimit-Reset"])
            assert abs(reset - (peek.oldest / 1000 + 60)) <= 1, (reset, peek.oldest)
            assert 58 <= int(r.headers["Retry-After"]) <= 60
        assert time.time() - start < 30
    finally:
        server.close()
