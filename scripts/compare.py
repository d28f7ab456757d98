#!/usr/bin/env python3
"""Compares builds of the module in wall-clock time, interleaved on fresh servers.

Usage: python3 scripts/compare.py A.so B.so [...]   (ROUNDS=n, default 3)

Each round starts one fresh server per build, in turn, and runs the first
workload of `make bench` on it (scripts/bench.py, MAIN: 10,000 keys prefilled
with 5 entries, limit 10, 100,000 pipelined requests per command) for
XCLOAK.ALLOW, the article's script and a bare ZADD. It prints each round and,
per build, the medians of usec_per_call and of the per-round ratios
EVALSHA / XCLOAK.ALLOW and XCLOAK.ALLOW / ZADD. The builds take turns, so a
burst of load on a shared machine falls on all of them alike; keep a copy of
the current build (cp target/release/libxcloak.so /tmp/base.so) before
building the change to compare.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def measure(module):
    """usec_per_call of XCLOAK.ALLOW, EVALSHA and ZADD on a fresh server running `module`."""
    bench.MODULE = os.path.abspath(module)  # the server chdirs to its --dir before loading
    # The default form only, no redis-cell: builds from before the compact form load too.
    server = bench.Server(storage=None, cell=False)
    server.storage = lambda form: None
    try:
        sha = server.client.call("SCRIPT", "LOAD", open(bench.ARTICLE).read())
        now_ms = int(server.client.call("TIME")[0]) * 1000
        config = bench.MAIN
        usec = {}
        for name, stat, prefix, layout, argv in bench.bench_commands(sha, now_ms, config["limit"]):
            if name not in ("XCLOAK.ALLOW", "EVALSHA script", "ZADD"):
                continue
            bench.prefill_keys(server, prefix, layout, now_ms, config["prefill"])
            usec[name] = bench.benchmark_once(server, name, stat, argv(prefix), True, bench.KEYS * config["calls"])[3]
        return usec
    finally:
        server.stop()


def main():
    modules = sys.argv[1:]
    if not modules or any(not os.path.exists(m) for m in modules):
        sys.exit(__doc__)
    rounds = int(os.environ.get("ROUNDS", "3"))
    runs = {m: [] for m in modules}
    for round_ in range(rounds):
        for module in modules[round_ % len(modules):] + modules[:round_ % len(modules)]:
            usec = measure(module)
            runs[module].append(usec)
            print("round %d  %-30s ALLOW %5.2f  EVALSHA %5.2f  ZADD %5.2f usec/call  EVALSHA/ALLOW %.2fx  ALLOW/ZADD %.2fx" % (
                round_ + 1, os.path.basename(module), usec["XCLOAK.ALLOW"], usec["EVALSHA script"], usec["ZADD"],
                usec["EVALSHA script"] / usec["XCLOAK.ALLOW"], usec["XCLOAK.ALLOW"] / usec["ZADD"]), flush=True)
    print()
    for module in modules:
        rows = runs[module]

        def median(f):
            return statistics.median(f(row) for row in rows)
        print("%-30s median ALLOW %.2f usec/call; EVALSHA/ALLOW %.2fx (rounds %s); ALLOW/ZADD %.2fx; EVALSHA/ZADD %.2fx" % (
            os.path.basename(module), median(lambda r: r["XCLOAK.ALLOW"]),
            median(lambda r: r["EVALSHA script"] / r["XCLOAK.ALLOW"]),
            ", ".join("%.2f" % (r["EVALSHA script"] / r["XCLOAK.ALLOW"]) for r in rows),
            median(lambda r: r["XCLOAK.ALLOW"] / r["ZADD"]), median(lambda r: r["EVALSHA script"] / r["ZADD"])))


if __name__ == "__main__":
    main()
