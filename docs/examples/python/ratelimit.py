"""Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Python (redis-py).

Asks ``XCLOAK.ALLOW key window limit DETAILS`` and turns the five fields into
the status and headers of an HTTP response. Where the server does not have the
module (a managed service), it answers "ERR unknown command": the limiter then
runs the portable Lua script instead (EVALSHA; redis-py's Script loads it and
retries when the server answers NOSCRIPT). Both keep the same sorted set.

    python ratelimit.py redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster]
    200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
    ...
    429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
"""

import math
import os
import sys
from pathlib import Path

import redis
from redis.cluster import RedisCluster

FALLBACK_LUA = Path(
    os.environ.get("XCLOAK_LUA", Path(__file__).resolve().parents[3] / "src/lua/xcloak_allow.lua")
).read_text()


class Limiter:
    def __init__(self, client):
        self.client = client
        self.script = client.register_script(FALLBACK_LUA)
        self.via = "command"

    def check(self, key, window_ms, limit):
        """One request against `key`: at most `limit` per `window_ms`.
        Returns (allowed, limit, remaining, retry_after_ms, reset_after_ms), via."""
        if self.via == "command":
            try:
                return self.client.execute_command("XCLOAK.ALLOW", key, window_ms, limit, "DETAILS"), "command"
            except redis.RedisError as error:
                if not is_unknown_command(error):
                    raise
                self.via = "script"  # no module on this server: use the script from now on
        return self.script(keys=[key], args=[window_ms, limit, "DETAILS"]), "script"


def is_unknown_command(error):
    # The server's answer, or in cluster mode redis-py's own: it routes a
    # command by the key positions that COMMAND lists, and XCLOAK.ALLOW is
    # listed only where the module is loaded.
    text = str(error).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text


def http_decision(details):
    """Status and headers of the HTTP response (delta-seconds, rounded up so
    a client never comes back too early)."""
    allowed, limit, remaining, retry_after_ms, reset_after_ms = details
    headers = {
        "RateLimit-Limit": str(limit),
        "RateLimit-Remaining": str(remaining),
        "RateLimit-Reset": str(math.ceil(reset_after_ms / 1000)),
    }
    if allowed:
        return 200, headers
    if retry_after_ms >= 0:  # -1: larger than the limit, will never fit
        headers["Retry-After"] = str(math.ceil(retry_after_ms / 1000))
    return 429, headers


def main(argv):
    cluster = "--cluster" in argv
    args = [a for a in argv if a != "--cluster"]
    if len(args) != 5:
        sys.exit("usage: ratelimit.py REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster]")
    url, key, window_ms, limit, calls = args
    client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    limiter = Limiter(client)
    for _ in range(int(calls)):
        details, via = limiter.check(key, int(window_ms), int(limit))
        status, headers = http_decision(details)
        fields = " | ".join(f"{name}: {value}" for name, value in headers.items())
        print(f"{status} {fields} | via {via}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
