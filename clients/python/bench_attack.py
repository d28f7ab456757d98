"""The attack bench of the block cache (issue 32; docs/clients.md, "Block cache").

A credential-stuffing wave through the ASGI middleware on a real HTTP server:
uvicorn in its own process, ``RateLimitMiddleware`` with ``Limit(60_000, 10)``
keyed on an ``x-ident`` header, one redis-server with the module. Two such
servers run in the same run, one whose ``AsyncLimiter`` has the block cache on
(``block_cache=10_000``, the default) and one with it off (``block_cache=0``),
and each gets the same traffic, in turn:

- the attack: ``--identities`` identities, each sent ``--factor`` times its
  limit, interleaved round-robin (identity 0, 1, ..., n-1, 0, 1, ...);
- legitimate traffic beside it: ``--legit`` other identities, 5 requests each
  (half their limit), spread evenly through the attack.

The client is an asyncio HTTP/1.1 client over ``--connections`` keep-alive
connections in this process. Reported per mode: Redis calls per request and
per attack request (``INFO commandstats`` calls of ``xcloak.allow``), Redis
CPU per request (commandstats usec), the app process's CPU per request
(/proc), requests per second, over-admission (admitted beyond 10 per identity,
each identity's client count checked against the server's own: ``ZCARD`` of
its window), legitimate requests rejected. Then, one connection, no other
load: the latency the middleware adds to a blocked identity's request (p50 and
p99 of ``/`` against ``/bare``, the same app and handler without a limit), and
in this process the cost of a cached rejection against a server round trip
(``Limiter.allow`` on a blocked key, cache on against cache off).

    .venv/bin/python bench_attack.py [--identities 50] [--factor 100] [--legit 200] [--connections 16]

The whole attack of an identity must fit in its 60 s window for the
over-admission count to mean "beyond the limit in one window": the bench says
so when a mode ran longer. Not part of test.sh: it prints, and exits 1 when a
target is missed (over-admission or a legitimate request rejected).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tests"))
sys.path.insert(0, str(HERE / "src"))

LIMIT, WINDOW_MS = 10, 60_000


# ------------------------------------------------------------ the app (in the uvicorn process)


def app():  # uvicorn bench_attack:app --factory
    import redis.asyncio
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    import xcloak
    from xcloak.asgi import Limit, RateLimitMiddleware

    async def ok(request):
        return PlainTextResponse("ok")

    cache = int(os.environ["BENCH_BLOCK_CACHE"])
    limiter = xcloak.AsyncLimiter(redis.asyncio.Redis(port=int(os.environ["BENCH_REDIS_PORT"])), block_cache=cache)
    limits = [Limit(WINDOW_MS, LIMIT, name=os.environ["BENCH_NAME"])]

    def per_route(scope):
        return None if scope["path"] == "/bare" else limits

    def ident(scope):
        for name, value in scope["headers"]:
            if name == b"x-ident":
                return value.decode()
        return "anonymous"

    application = Starlette(routes=[Route("/", ok), Route("/bare", ok)])
    application.add_middleware(RateLimitMiddleware, limiter=limiter, limits=per_route, key=ident)
    return application


# ------------------------------------------------------------ the client


class Serving:
    """uvicorn serving ``app()`` in a process of its own."""

    def __init__(self, redis_port: int, block_cache: int, name: str, port: int) -> None:
        env = dict(os.environ, BENCH_REDIS_PORT=str(redis_port), BENCH_BLOCK_CACHE=str(block_cache),
                   BENCH_NAME=name, PYTHONPATH=f"{HERE / 'src'}:{HERE}")
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bench_attack:app", "--factory", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "error", "--no-access-log", "--lifespan", "off"],
            env=env, cwd=HERE)
        deadline = time.monotonic() + 30
        while True:
            try:
                status = asyncio.run(sequential(port, [("/bare", "warmup")]))[0][0]
                if status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.1)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def _request(reader, writer, path: str, ident: str) -> int:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nx-ident: {ident}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    at = head.lower().find(b"content-length:")
    await reader.readexactly(int(head[at + 15:head.index(b"\r\n", at)]))
    return int(head[9:12])


async def sequential(port: int, jobs: List[Tuple[str, str]]) -> List[Tuple[int, float]]:
    """One connection, one request at a time: (status, seconds) each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for path, ident in jobs:
            start = time.perf_counter()
            status = await _request(reader, writer, path, ident)
            out.append((status, time.perf_counter() - start))
    finally:
        writer.close()
    return out


async def concurrent(port: int, jobs: List[Tuple[str, str]], connections: int) -> List[Tuple[str, int]]:
    """``jobs`` over ``connections`` keep-alive connections (job i on connection i % n): (ident, status) each."""
    async def one(share):
        return [(ident, status) for (_, ident), (status, _) in zip(share, await sequential(port, share))]

    parts = await asyncio.gather(*(one(jobs[i::connections]) for i in range(connections)))
    return [r for part in parts for r in part]


def traffic(identities: int, factor: int, legit: int, prefix: str) -> List[Tuple[str, str]]:
    attack = [("/", f"{prefix}attacker-{i}") for _ in range(factor * LIMIT) for i in range(identities)]
    friendly = [("/", f"{prefix}user-{j}") for _ in range(LIMIT // 2) for j in range(legit)]
    out: List[Tuple[str, str]] = []
    step = len(attack) / max(1, len(friendly))
    k = 0
    for n, job in enumerate(attack):
        while k < len(friendly) and k * step <= n:
            out.append(friendly[k])
            k += 1
        out.append(job)
    return out + friendly[k:]


def commandstats(client) -> Dict[str, Tuple[int, float]]:
    return {name[len("cmdstat_"):] if name.startswith("cmdstat_") else name: (v["calls"], v["usec"])
            for name, v in client.info("commandstats").items()}


def fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.3g}"


def percentile(values: List[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def run_mode(server, serving: Serving, name: str, jobs, args) -> Dict[str, float]:
    client = server.client()
    client.config_resetstat()
    cpu0 = serving.cpu_s()
    start = time.perf_counter()
    results = asyncio.run(concurrent(serving.port, jobs, args.connections))
    elapsed = time.perf_counter() - start
    app_cpu = serving.cpu_s() - cpu0
    stats = commandstats(client)
    calls = stats.get("xcloak.allow", (0, 0))[0] + stats.get("evalsha", (0, 0))[0]
    usec = sum(u for cmd, (_, u) in stats.items() if not cmd.startswith(("config", "info")))
    admitted: Dict[str, int] = {}
    wrongly, attack_requests, legit_requests = 0, 0, 0
    for ident, status in results:
        if status not in (200, 429):
            raise RuntimeError(f"{name}: status {status} for {ident}")
        if "attacker-" in ident:
            attack_requests += 1
            admitted[ident] = admitted.get(ident, 0) + (status == 200)
        else:
            legit_requests += 1
            wrongly += status == 429
    mismatched = sum(client.zcard(f"rl:{name}:{ident}") != n for ident, n in admitted.items())
    over = sum(max(0, n - LIMIT) for n in admitted.values())
    admitted_total = sum(admitted.values())
    # Legitimate requests are all admitted (checked: wrongly == 0), one call each.
    attack_calls = calls - (legit_requests - wrongly)
    return {
        "requests": len(results), "elapsed_s": elapsed, "rps": len(results) / elapsed,
        "calls_per_request": calls / len(results), "attack_calls_per_attack_request": attack_calls / attack_requests,
        "rejections_without_call": 1 - (attack_calls - admitted_total) / max(1, attack_requests - admitted_total),
        "redis_usec_per_request": usec / len(results), "app_cpu_us_per_request": app_cpu / len(results) * 1e6,
        "over_admission": over, "server_count_mismatches": mismatched, "legit_rejected": wrongly,
    }


def added_latency(serving: Serving, ident: str, n: int) -> Tuple[float, float]:
    """p50 and p99 of a blocked identity's request minus those of /bare, alternated on one connection."""
    blocked = asyncio.run(sequential(serving.port, [("/", ident)] * (LIMIT + 1)))
    assert blocked[-1][0] == 429
    jobs = [job for _ in range(n) for job in (("/", ident), ("/bare", ident))]
    out = asyncio.run(sequential(serving.port, jobs))
    limited = [t for (status, t), (path, _) in zip(out, jobs) if path == "/"]
    bare = [t for (status, t), (path, _) in zip(out, jobs) if path == "/bare"]
    assert all(status == 429 for (status, _), (path, _) in zip(out, jobs) if path == "/"), "the identity is blocked"
    return ((percentile(limited, 0.5) - percentile(bare, 0.5)) * 1e6,
            (percentile(limited, 0.99) - percentile(bare, 0.99)) * 1e6)


def cached_vs_round_trip(server, n: int) -> Tuple[float, float]:
    import xcloak

    on = xcloak.Limiter(server.client(), prefix="rt:")
    off = xcloak.Limiter(server.client(), prefix="rt:", block_cache=0)
    for _ in range(2):
        on.allow("blocked", WINDOW_MS, 1)
    assert on.allow("blocked", WINDOW_MS, 1).via == "cache" and off.allow("blocked", WINDOW_MS, 1).via == "command"
    rounds: Dict[str, List[float]] = {"cache": [], "server": []}
    for _ in range(5):
        for label, limiter in (("cache", on), ("server", off)):
            start = time.perf_counter()
            for _ in range(n):
                limiter.allow("blocked", WINDOW_MS, 1)
            rounds[label].append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(rounds["cache"]), statistics.median(rounds["server"])


def memory_per_entry(n: int, tiered: bool) -> float:
    """Bytes per block-cache entry (tracemalloc): ``n`` rejections recorded, each
    with a fresh 24-byte key and the decision decoded from a reply, as the
    limiter does; with ``tiered``, the request has two tiers (``TIER`` once)."""
    import gc
    import tracemalloc

    from xcloak._cache import BlockCache, sig_of
    from xcloak.decision import from_reply

    cache = BlockCache(n)
    replies = []
    for i in range(n):
        reply: List[object] = [0, LIMIT, 0, 50_000 + i, 59_000 + i]
        if tiered:
            reply.append([[WINDOW_MS, LIMIT, 0, 50_000 + i, 59_000 + i], [3_600_000, 100, 90, 0, 3_500_000 + i]])
        replies.append(reply)
    names = [f"rl:signin:198.51.{i // 256 % 256:03d}.{i % 256:03d}" for i in range(n)]
    assert all(len(k) == 24 for k in names)
    tiers_ms = [(3_600_000, 100)] if tiered else []
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        key = names[i].encode().decode()  # a fresh str, as the limiter builds prefix + key
        cache.record(key, sig_of(WINDOW_MS, LIMIT, tiers_ms), 1, 1000.0 + i, from_reply(replies[i], WINDOW_MS, tiered))
    del key
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(cache) == n
    return used / n


def write_json(args: argparse.Namespace, results: Dict[str, List[Dict[str, float]]], cache_us: float,
               server_us: float) -> None:
    """The figures in the shape every package's attack bench writes (scripts/bench, block-cache)."""
    import json

    def mode(name: str) -> Dict[str, float]:
        rounds = results[name]
        mean = lambda key: statistics.fmean(x[key] for x in rounds)  # noqa: E731
        return {"calls_per_request": mean("calls_per_request"),
                "calls_per_attack_request": mean("attack_calls_per_attack_request"),
                "cache_answered_share": mean("rejections_without_call"),
                "server_usec_per_request": mean("redis_usec_per_request"), "rps": mean("rps"),
                "p50_ms": rounds[0]["added_p50_us"] / 1000, "p99_ms": rounds[0]["added_p99_us"] / 1000,
                "overadmitted": int(sum(x["over_admission"] for x in rounds)),
                "legit_rejected": int(sum(x["legit_rejected"] for x in rounds))}

    out = {"package": "python", "middleware": "xcloak.asgi.RateLimitMiddleware (uvicorn, Starlette)",
           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load": os.getloadavg()[0],
           "scale": {"identities": args.identities, "attack_per_identity": args.factor * LIMIT,
                     "legit_identities": args.legit, "legit_per_identity": LIMIT // 2,
                     "requests": args.identities * args.factor * LIMIT + args.legit * (LIMIT // 2),
                     "rounds": args.rounds},
           "on": mode("on"), "off": mode("off"), "cached_ns": cache_us * 1000, "roundtrip_ns": server_us * 1000,
           "cached_vs_roundtrip": cache_us / server_us, "bytes_per_entry": memory_per_entry(10_000, False)}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--identities", type=int, default=50)
    parser.add_argument("--factor", type=int, default=100)
    parser.add_argument("--legit", type=int, default=200)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both modes, in alternating order")
    parser.add_argument("--memory", action="store_true", help="only the memory per entry (no server)")
    parser.add_argument("--json", metavar="PATH", default=os.environ.get("XCLOAK_ATTACK_JSON"),
                        help="also write the figures there (the shape scripts/bench's block-cache section reads)")
    args = parser.parse_args()
    if args.memory:
        for tiered in (False, True):
            shape = "two tiers" if tiered else "no tiers"
            print(f"block cache memory per entry, 10,000 entries, 24-byte keys, {shape}: "
                  f"{memory_per_entry(10_000, tiered):.0f} B")
        return 0

    from servers import Server, free_port

    server = Server()
    on = off = None
    try:
        off = Serving(server.port, 0, "off", free_port())
        on = Serving(server.port, 10_000, "on", free_port())
        servings = {"off": off, "on": on}
        print(f"traffic: {args.identities} identities x {args.factor * LIMIT} requests (limit {LIMIT} per "
              f"{WINDOW_MS // 1000} s, interleaved) + {args.legit} legitimate identities x {LIMIT // 2} = "
              f"{len(traffic(args.identities, args.factor, args.legit, ''))} requests per mode and round, "
              f"{args.connections} connections, {args.rounds} rounds; load {os.getloadavg()}")
        results: Dict[str, List[Dict[str, float]]] = {"off": [], "on": []}
        for r in range(args.rounds):
            jobs = traffic(args.identities, args.factor, args.legit, f"r{r}-")
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                results[mode].append(run_mode(server, servings[mode], mode, jobs, args))
        for mode, serving in servings.items():
            p50, p99 = added_latency(serving, "probe", args.latency_samples)
            results[mode][0]["added_p50_us"], results[mode][0]["added_p99_us"] = p50, p99
        cache_us, server_us = cached_vs_round_trip(server, 2000)
        rows = ["requests", "elapsed_s", "rps", "calls_per_request", "attack_calls_per_attack_request",
                "rejections_without_call", "redis_usec_per_request", "app_cpu_us_per_request", "over_admission",
                "server_count_mismatches", "legit_rejected"]
        print("| per round | cache off | cache on |")
        print("|---|---|---|")
        for row in rows:
            cells = [" / ".join(fmt(x[row]) for x in results[mode]) for mode in ("off", "on")]
            print(f"| {row} | {cells[0]} | {cells[1]} |")
        for row in ("added_p50_us", "added_p99_us"):
            print(f"| {row} (one connection) | {fmt(results['off'][0][row])} | {fmt(results['on'][0][row])} |")
        print(f"cached rejection {cache_us:.1f} us vs server round trip {server_us:.1f} us per allow() "
              f"(ratio {cache_us / server_us:.3f}); load {os.getloadavg()}")
        if args.json:
            write_json(args, results, cache_us, server_us)
        everything = [x for mode in results for x in results[mode]]
        if any(x["elapsed_s"] > WINDOW_MS / 1000 for x in everything):
            print("note: a mode ran longer than the window: an identity may be admitted again in a new window")
        bad = any(x["over_admission"] or x["legit_rejected"] or x["server_count_mismatches"] for x in everything)
        return 1 if bad else 0
    finally:
        for serving in (on, off):
            if serving is not None:
                serving.close()
        server.close()


if __name__ == "__main__":
    sys.exit(main())
