"""Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Python: a user of
the ``xcloak`` package (clients/python).

``xcloak.Limiter`` asks ``XCLOAK.ALLOW key window limit DETAILS`` and this
turns the Decision into the status and headers of an HTTP response. Where the
server does not have the module (a managed service), it answers "ERR unknown
command": the package then runs its bundled Lua script instead (EVALSHA,
loaded after NOSCRIPT). Both keep the same sorted set.

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

In cluster mode the package sends each call to the node of its key's slot
(redis-py's slot map), with no extra round trip. ``--peek`` asks
``XCLOAK.PEEK`` (writes nothing) on a replica of the key's primary
(``replica_reads=True``: the package's replica connections send ``READONLY``).
"""

import sys
from pathlib import Path

try:
    import xcloak
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "clients/python/src"))
    import xcloak
import redis
import redis.asyncio
from redis.cluster import LoadBalancingStrategy, RedisCluster


def http_decision(decision):
    """Status and headers of the HTTP response: the package's headers, legacy
    fields for one tier, IETF policies (named by their window) with tiers."""
    if decision.tiers:
        names = [f"{t.window_ms}ms" for t in decision.tiers]
        headers = xcloak.headers(decision, "ietf", names)
    else:
        headers = xcloak.headers(decision, "legacy")
    return (200 if decision.allowed else 429), headers


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


def print_decision(decision):
    status, headers = http_decision(decision)
    fields = " | ".join(f"{name}: {value}" for name, value in headers.items())
    print(f"{status} {fields} | via {decision.via}", flush=True)


# A slot map with replicas: a load-balancing strategy makes redis-py read
# CLUSTER SLOTS' replicas too (the package opens its own READONLY connections).
REPLICA_READS = {"load_balancing_strategy": LoadBalancingStrategy.ROUND_ROBIN_REPLICAS}


def main(argv):
    url, requests, window_ms, limit, flags = parse_args(argv)
    replica_reads = REPLICA_READS if flags["--peek"] else {}
    if flags["--asyncio"]:
        import asyncio

        asyncio.run(main_async(url, requests, window_ms, limit, flags, replica_reads))
        return
    client = RedisCluster.from_url(url, **replica_reads) if flags["--cluster"] else redis.Redis.from_url(url)
    limiter = xcloak.Limiter(client, replica_reads=flags["--peek"])
    for key in requests:
        ask = limiter.peek if flags["--peek"] else limiter.allow
        print_decision(ask(key, window_ms, limit, tiers=flags["tiers"]))
    limiter.close()


async def main_async(url, requests, window_ms, limit, flags, replica_reads):
    if flags["--cluster"]:
        client = redis.asyncio.RedisCluster.from_url(url, **replica_reads)
    else:
        client = redis.asyncio.Redis.from_url(url)
    limiter = xcloak.AsyncLimiter(client, replica_reads=flags["--peek"])
    try:
        for key in requests:
            ask = limiter.peek if flags["--peek"] else limiter.allow
            print_decision(await ask(key, window_ms, limit, tiers=flags["tiers"]))
    finally:
        await limiter.close()
        await client.aclose()


if __name__ == "__main__":
    main(sys.argv[1:])
