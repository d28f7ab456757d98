"""The Python package's benchmark: ratios against a baseline in the same run.

1. ``Limiter.allow`` against a raw ``execute_command`` of the same
   ``XCLOAK.ALLOW ... DETAILS`` on the same client and server (client time
   per call; the contract's target: at most 1.15x).
2. Flask-Limiter with ``xcloak://`` against Flask-Limiter with ``redis://``,
   both ``strategy="moving-window"``, at limits 10 and 1,000: server CPU per
   request (INFO commandstats, usec of every command the storage sent) and
   memory per identity (MEMORY USAGE of the identity's keys, filled to the
   limit). The requests go through Flask's test client (no HTTP: the server
   side is what is measured).
3. The same on a server without the module (managed Redis: ``xcloak://``
   sends the bundled Lua script): server CPU per request of ``xcloak://``
   against limits' own ``redis://`` moving window, three rounds taken in
   turn, the median of the per-round ratios (issue 30's target: at most 1.0x).

    .venv/bin/python bench.py [--calls N]

Not part of test.sh: it asserts nothing (these machines are noisy); it prints.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

import redis  # noqa: E402

import xcloak  # noqa: E402
import xcloak.limits  # noqa: E402,F401
from servers import Server, raw  # noqa: E402


def allow_overhead(server: Server, calls: int) -> None:
    client = redis.Redis(port=server.port)
    limiter = xcloak.Limiter(client)
    args = ("XCLOAK.ALLOW", "bench:raw", "60000", "1000000", "DETAILS")

    def raw_call():
        client.execute_command(*args)

    def package_call():
        limiter.allow("bench:pkg", 60000, 1000000)

    for f in (raw_call, package_call):  # warm up: connections, fallback probe
        for _ in range(200):
            f()
    rounds = {raw_call: [], package_call: []}
    for _ in range(5):
        for f in (raw_call, package_call):
            client.delete("bench:raw", "bench:pkg")
            start = time.perf_counter()
            for _ in range(calls):
                f()
            rounds[f].append((time.perf_counter() - start) / calls * 1e6)
    raw_us = statistics.median(rounds[raw_call])
    pkg_us = statistics.median(rounds[package_call])
    print(f"1. Limiter.allow {pkg_us:.1f} us/call, raw execute_command {raw_us:.1f} us/call: "
          f"{pkg_us / raw_us:.3f}x (target <= 1.15x); rounds raw {[round(x, 1) for x in rounds[raw_call]]}, "
          f"package {[round(x, 1) for x in rounds[package_call]]}")
    limiter.close()


def flask_app(uri: str, limit: int):
    from flask import Flask
    from flask_limiter import Limiter

    app = Flask(__name__)
    limiter = Limiter(lambda: "bench-client", app=app, storage_uri=uri, strategy="moving-window",
                      headers_enabled=True)

    @app.route("/")
    @limiter.limit(f"{limit} per hour")
    def index():
        return "ok"

    return app


SCRIPT_CALLS = ("cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro", "cmdstat_fcall",
                "cmdstat_fcall_ro")


def usec_of_all(server: Server) -> float:
    """Server CPU of every command the storage sent (INFO commandstats usec).

    A script's usec already holds the commands it ran, which commandstats also
    counts on their own lines: when scripts ran, only the scripts and the
    module's commands are the storage's own calls (both storages measured here
    send nothing else), so the inner commands are not counted twice."""
    stats = server.client().info("commandstats")
    ignored = ("cmdstat_info", "cmdstat_config", "cmdstat_memory", "cmdstat_keys", "cmdstat_flushall",
               "cmdstat_ping", "cmdstat_client", "cmdstat_hello")
    if any(k in SCRIPT_CALLS for k in stats):
        return sum(v["usec"] for k, v in stats.items() if k in SCRIPT_CALLS or k.startswith("cmdstat_xcloak."))
    return sum(v["usec"] for k, v in stats.items() if k not in ignored and not k.startswith("cmdstat_config|")
               and not k.startswith("cmdstat_memory|") and not k.startswith("cmdstat_client|"))


def flask_limiter_costs(server: Server, scheme: str, limit: int) -> tuple:
    client = server.client()
    client.flushall()
    app = flask_app(f"{scheme}://127.0.0.1:{server.port}", limit)
    test = app.test_client()
    # Fill the identity's window to the limit (every request admitted), then
    # as many rejected requests: the two halves of a limiter's life.
    for _ in range(min(limit, 50)):  # warm up (script loads, probe)
        test.get("/")
    client.flushall()
    client.config_resetstat()
    statuses = [test.get("/").status_code for _ in range(limit)]
    assert set(statuses) == {200}, statuses[-3:]
    rejected = [test.get("/").status_code for _ in range(limit)]
    assert set(rejected) == {429}
    usec = usec_of_all(server)
    memory = sum(client.memory_usage(k) or 0 for k in client.keys("*"))
    return usec / (2 * limit), memory


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    server = Server()
    try:
        allow_overhead(server, args.calls)
        print("2. Flask-Limiter, moving window: server CPU per request (admitted and rejected halves), "
              "memory per identity filled to the limit")
        for limit in (10, 1000):
            xc_cpu, xc_mem = flask_limiter_costs(server, "xcloak", limit)
            rd_cpu, rd_mem = flask_limiter_costs(server, "redis", limit)
            print(f"   limit {limit:>5}: xcloak:// {xc_cpu:.2f} us/request, {xc_mem} B; "
                  f"redis:// {rd_cpu:.2f} us/request, {rd_mem} B; "
                  f"redis:// / xcloak:// = {rd_cpu / xc_cpu:.2f}x CPU, {rd_mem / xc_mem:.2f}x memory")
        compact = Server(storage="compact")
        try:
            for limit in (10, 1000):
                xc_cpu, xc_mem = flask_limiter_costs(compact, "xcloak", limit)
                rd_cpu, rd_mem = flask_limiter_costs(compact, "redis", limit)
                print(f"   limit {limit:>5} (STORAGE compact): xcloak:// {xc_cpu:.2f} us/request, {xc_mem} B; "
                      f"redis:// {rd_cpu:.2f} us/request, {rd_mem} B; "
                      f"{rd_cpu / xc_cpu:.2f}x CPU, {rd_mem / xc_mem:.2f}x memory")
        finally:
            compact.close()
        fallback_costs()
    finally:
        server.close()


def fallback_costs() -> None:
    print("3. Flask-Limiter, moving window, on a server WITHOUT the module (xcloak:// sends the Lua script): "
          "server CPU per request, 3 rounds")
    bare = Server(module=False)
    try:
        for limit in (10, 1000):
            ratios, xcs, rds = [], [], []
            for _ in range(3):
                xc_cpu, _ = flask_limiter_costs(bare, "xcloak", limit)
                rd_cpu, _ = flask_limiter_costs(bare, "redis", limit)
                xcs.append(xc_cpu)
                rds.append(rd_cpu)
                ratios.append(xc_cpu / rd_cpu)
            ratio = statistics.median(ratios)
            print(f"   limit {limit:>5}: xcloak:// {statistics.median(xcs):.2f} us/request, "
                  f"redis:// {statistics.median(rds):.2f} us/request; xcloak:// / redis:// = {ratio:.2f}x "
                  f"(rounds {[round(r, 2) for r in ratios]}; target <= 1.0x: {'PASS' if ratio <= 1.0 else 'FAIL'})")
    finally:
        bare.close()


if __name__ == "__main__":
    main()
