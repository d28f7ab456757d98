"""Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Python (redis-py).

Asks ``XCLOAK.ALLOW key window limit DETAILS`` and turns the five fields into
the status and headers of an HTTP response. Where the server does not have the
module (a managed service), it answers "ERR unknown command": the limiter then
runs the portable Lua script instead (EVALSHA; redis-py's Script loads it and
retries when the server answers NOSCRIPT). Both keep the same sorted set.

    python ratelimit.py redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek] [--asyncio]
                        [--tier WINDOW_MS:LIMIT]...
    200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
    ...
    429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command

Each ``--tier WINDOW_MS:LIMIT`` adds ``TIER window limit`` to the call: the
reply then has a sixth field, one ``[window, limit, remaining, retry_after_ms,
reset_after_ms]`` per tier, printed as the IETF ``RateLimit-Policy`` and
``RateLimit`` fields with one policy per tier, named by its window
(docs/commands.md, "Several tiers")::

    200 RateLimit-Policy: "60000ms";q=3;w=60, "3600000ms";q=5;w=3600 | RateLimit: "60000ms";r=2;t=60, "3600000ms";r=4;t=3600 | via command

With ``--keys K``, request i uses the key ``KEY:<i mod K>``. ``--asyncio``
runs the same requests through ``redis.asyncio`` (``RedisCluster`` with
``--cluster``).

In cluster mode redis-py routes XCLOAK commands by the key positions the
servers list in ``COMMAND`` (1, 1, 1), with no extra round trip. It sends a
command to a replica only when asked: ``--peek`` asks ``XCLOAK.PEEK`` (writes
nothing) with ``target_nodes=client.get_node_from_key(key, replica=True)``,
on a client whose ``load_balancing_strategy`` makes every connection send
``READONLY`` (without it, the replica answers MOVED).
"""

import math
import os
import sys
from pathlib import Path

import redis
import redis.asyncio
from redis.cluster import LoadBalancingStrategy, RedisCluster

FALLBACK_LUA = Path(
    os.environ.get("XCLOAK_LUA", Path(__file__).resolve().parents[3] / "src/lua/xcloak_allow.lua")
).read_text()


class Limiter:
    def __init__(self, client):
        self.client = client
        self.script = client.register_script(FALLBACK_LUA)
        self.via = "command"

    def check(self, key, window_ms, limit, tiers=()):
        """One request against `key`: at most `limit` per `window_ms`, and at
        most the limit of each (window_ms, limit) of `tiers` per its window.
        Returns (allowed, limit, remaining, retry_after_ms, reset_after_ms), via;
        with tiers, a sixth field: one such list (window first) per tier."""
        if self.via == "command":
            try:
                return self.client.execute_command("XCLOAK.ALLOW", key, window_ms, limit, *tier_args(tiers), "DETAILS"), "command"
            except redis.RedisError as error:
                if not is_unknown_command(error):
                    raise
                self.via = "script"  # no module on this server: use the script from now on
        return self.script(keys=[key], args=[window_ms, limit, *tier_args(tiers), "DETAILS"]), "script"

    def peek(self, key, window_ms, limit, tiers=()):
        """What `check` would decide now, without recording anything; in
        cluster mode a replica of the key's primary answers."""
        args = (key, window_ms, limit, *tier_args(tiers))
        return self.client.execute_command("XCLOAK.PEEK", *args, **replica_of(self.client, key)), "command"


class AsyncLimiter(Limiter):
    """The same, for ``redis.asyncio`` clients."""

    async def check(self, key, window_ms, limit, tiers=()):
        if self.via == "command":
            try:
                return await self.client.execute_command("XCLOAK.ALLOW", key, window_ms, limit, *tier_args(tiers), "DETAILS"), "command"
            except redis.RedisError as error:
                if not is_unknown_command(error):
                    raise
                self.via = "script"
        return await self.script(keys=[key], args=[window_ms, limit, *tier_args(tiers), "DETAILS"]), "script"

    async def peek(self, key, window_ms, limit, tiers=()):
        args = (key, window_ms, limit, *tier_args(tiers))
        return await self.client.execute_command("XCLOAK.PEEK", *args, **replica_of(self.client, key)), "command"


def tier_args(tiers):
    return [arg for window_ms, limit in tiers for arg in ("TIER", window_ms, limit)]


def replica_of(client, key):
    """``target_nodes`` for a read on a replica of the key's primary (none
    outside cluster mode, or when the slot has no replica)."""
    if not hasattr(client, "get_node_from_key"):
        return {}
    node = client.get_node_from_key(key, replica=True)
    return {"target_nodes": node} if node is not None else {}


def is_unknown_command(error):
    # The server's answer, or in cluster mode redis-py's own: it routes a
    # command by the key positions that COMMAND lists, and XCLOAK.ALLOW is
    # listed only where the module is loaded.
    text = str(error).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text


def seconds(ms):
    return (ms + 999) // 1000  # round up: never send a client back too early


def http_decision(details):
    """Status and headers of the HTTP response (delta-seconds, rounded up so
    a client never comes back too early)."""
    if len(details) == 6:
        return policy_decision(details)
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


def policy_decision(details):
    """With tiers, draft-ietf-httpapi-ratelimit-headers-09: one policy per
    tier in RateLimit-Policy (quota, window) and in RateLimit (remaining,
    seconds until it is back), named by its window; Retry-After is the
    binding tier's."""
    allowed, _, _, retry_after_ms, _, tiers = details
    names = [f'"{window}ms"' for window, *_ in tiers]
    headers = {
        "RateLimit-Policy": ", ".join(
            f"{name};q={limit};w={seconds(window)}" for name, (window, limit, _, _, _) in zip(names, tiers)),
        "RateLimit": ", ".join(
            f"{name};r={remaining};t={seconds(reset)}" for name, (_, _, remaining, _, reset) in zip(names, tiers)),
    }
    if allowed:
        return 200, headers
    if retry_after_ms > 0:  # -1: larger than a limit, will never fit
        headers["Retry-After"] = str(seconds(retry_after_ms))
    return 429, headers


def parse_args(argv):
    """URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--asyncio] [--tier WINDOW_MS:LIMIT]..."""
    usage = ("usage: ratelimit.py REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--asyncio]"
             " [--tier WINDOW_MS:LIMIT]...")
    flags = {"--cluster": False, "--peek": False, "--asyncio": False}
    keys, tiers, positional, rest = 0, [], [], list(argv)
    while rest:
        arg = rest.pop(0)
        if arg in flags:
            flags[arg] = True
        elif arg == "--keys" and rest and rest[0].isdigit() and int(rest[0]) > 0:
            keys = int(rest.pop(0))
        elif arg == "--tier" and rest and all(n.isdigit() for n in rest[0].partition(":")[::2]):
            window_ms, _, limit = rest.pop(0).partition(":")
            tiers.append((int(window_ms), int(limit)))
        elif arg.startswith("--") or len(positional) == 5:
            sys.exit(usage)
        else:
            positional.append(arg)
    if len(positional) != 5 or not all(a.isdigit() for a in positional[2:]):
        sys.exit(usage)
    url, key, window_ms, limit, calls = positional
    requests = [f"{key}:{i % keys}" if keys else key for i in range(int(calls))]
    return url, requests, int(window_ms), int(limit), {**flags, "tiers": tiers}


def print_decision(details, via):
    status, headers = http_decision(details)
    fields = " | ".join(f"{name}: {value}" for name, value in headers.items())
    print(f"{status} {fields} | via {via}", flush=True)


# Replica reads need READONLY on every connection: a load-balancing strategy
# asks for it (READ_COMMANDS, redis-py's fixed list, still goes to primaries
# only for commands it does not list, such as XCLOAK.PEEK).
REPLICA_READS = {"load_balancing_strategy": LoadBalancingStrategy.ROUND_ROBIN_REPLICAS}


def main(argv):
    url, requests, window_ms, limit, flags = parse_args(argv)
    replica_reads = REPLICA_READS if flags["--peek"] else {}
    if flags["--asyncio"]:
        import asyncio

        asyncio.run(main_async(url, requests, window_ms, limit, flags, replica_reads))
        return
    client = RedisCluster.from_url(url, **replica_reads) if flags["--cluster"] else redis.Redis.from_url(url)
    limiter = Limiter(client)
    for key in requests:
        ask = limiter.peek if flags["--peek"] else limiter.check
        print_decision(*ask(key, window_ms, limit, flags["tiers"]))


async def main_async(url, requests, window_ms, limit, flags, replica_reads):
    if flags["--cluster"]:
        client = redis.asyncio.RedisCluster.from_url(url, **replica_reads)
        await client.initialize()  # the slot map, which get_node_from_key reads
    else:
        client = redis.asyncio.Redis.from_url(url)
    try:
        limiter = AsyncLimiter(client)
        for key in requests:
            ask = limiter.peek if flags["--peek"] else limiter.check
            print_decision(*await ask(key, window_ms, limit, flags["tiers"]))
    finally:
        await client.aclose()


if __name__ == "__main__":
    main(sys.argv[1:])
