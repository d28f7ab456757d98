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
