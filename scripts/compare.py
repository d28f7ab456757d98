#!/usr/bin/env python3
"""Compares builds of the module in wall-clock time, interleaved on fresh servers.

Usage: python3 scripts/compare.py A.so B.so [...]   (ROUNDS=n, default 3)
       python3 scripts/compare.py --zset-only A.so B.so   (builds from before the compact form)

Each round starts one fresh server per build, in turn (the order rotating),
loaded with `STORAGE compact`, and measures on it, as `usec_per_call` from
INFO commandstats:

- the first workload of `make bench` (scripts/bench.py, MAIN: 10,000 keys
  prefilled with 5 entries, limit 10, 100,000 pipelined requests, about half
  admitted) for XCLOAK.ALLOW on compact keys and on sorted sets, the article's
  script and a bare ZADD;
- compact windows held at 10, 1,000 and 100,000 live entries by streams with
  NOW (bench.py's entries-per-key streams, one entry per second, 2 keys):
  admissions alone (each trims one entry and adds one) and rejections alone,
  measured separately;
- XCLOAK.REFUND of the newest entry of a compact window of 100,000 entries
  (skipped for builds without REFUND).

It prints every round, then per measure each build's median and the median
of the per-round ratios against the first build (B / A: below 1 is faster).
The builds take turns, so a burst of load on a shared machine falls on all of
them alike; keep a copy of the current build (cp target/release/libxcloak.so
/tmp/base.so) before building the change to compare. `--zset-only` measures
only the sorted-set rows of the first workload, on servers loaded without
`STORAGE`, for builds that have no compact form.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

STREAM_SIZES = (10, 1_000, 100_000)
STREAM_KEYS = 2
STREAM_CALLS = 50_000  # per key and measure (100,000 calls: a preemption of a few ms moves the mean little)
REFUND_CALLS = 1_000


def streams(server, usec):
    """Admissions and rejections on compact windows held at STREAM_SIZES entries."""
    server.storage("compact")
    for size in STREAM_SIZES:
        prefix = "cmp%d" % size
        server.pipe(bench.steady_stream(prefix, STREAM_KEYS, size, 1000, size, 0))
        server.expect_type(prefix + ":0", "xcloaklog")
        usec["compact %s entries: admission" % "{:,}".format(size)] = bench.measure_stream(
            server, lambda: bench.steady_stream(prefix, STREAM_KEYS, size, 1000, STREAM_CALLS, size), STREAM_KEYS * STREAM_CALLS)
        usec["compact %s entries: rejection" % "{:,}".format(size)] = bench.measure_stream(
            server, lambda: bench.steady_stream(prefix, STREAM_KEYS, size, 1000, STREAM_CALLS, size + STREAM_CALLS, True),
            STREAM_KEYS * STREAM_CALLS)
        server.client.call("FLUSHALL")


def refunds(server, usec):
    """REFUND of the newest entry, each right after the ALLOW it gives back
    (REFUND_CALLS of them: ced23cf's took about 2 ms a call)."""
    size = 100_000
    window, limit = 10 ** 12, 1_000_000
    server.storage("compact")
    server.pipe(bench.allow_cmd("cmpr", window, limit, bench.BASE_MS + i * 1000) for i in range(size))
    last = bench.BASE_MS + size * 1000

    def stream():
        for j in range(REFUND_CALLS):
            yield bench.allow_cmd("cmpr", window, limit, last + j)
            yield bench.encode("XCLOAK.REFUND", "cmpr", last + j)
    server.client.call("CONFIG", "RESETSTAT")
    try:
        server.pipe(stream())
    except SystemExit:
        return  # a build without XCLOAK.REFUND
    calls, per_call = server.stat("xcloak.refund")
    if calls == REFUND_CALLS:
        usec["compact 100,000 entries: REFUND of the newest"] = per_call
    server.client.call("FLUSHALL")


def measure(module, zset_only):
    """usec_per_call of every measure on a fresh server running `module`."""
    bench.MODULE = os.path.abspath(module)  # the server chdirs to its --dir before loading
    server = bench.Server(storage=None if zset_only else "compact", cell=False)
    if zset_only:
        server.storage = lambda form: None
    try:
        sha = server.client.call("SCRIPT", "LOAD", open(bench.ARTICLE).read())
        now_ms = int(server.client.call("TIME")[0]) * 1000
        config = bench.MAIN
        names = ("XCLOAK.ALLOW", "EVALSHA script", "ZADD") + (() if zset_only else ("XCLOAK.ALLOW compact",))
        usec = {}
        for name, stat, prefix, layout, argv in bench.bench_commands(sha, now_ms, config["limit"]):
            if name not in names:
                continue
            bench.prefill_keys(server, prefix, layout, now_ms, config["prefill"])
            label = "main workload: " + bench.LABEL[name]
            usec[label] = bench.benchmark_once(server, name, stat, argv(prefix), True, bench.KEYS * config["calls"])[3]
        server.client.call("FLUSHALL")
        if not zset_only:
            streams(server, usec)
            refunds(server, usec)
        return usec
    finally:
        server.stop()


def main():
    args = sys.argv[1:]
    zset_only = "--zset-only" in args
    modules = [a for a in args if a != "--zset-only"]
    if len(modules) < 2 or any(not os.path.exists(m) for m in modules):
        sys.exit(__doc__)
    rounds = int(os.environ.get("ROUNDS", "3"))
    runs = {m: [] for m in modules}
    for round_ in range(rounds):
        for module in modules[round_ % len(modules):] + modules[:round_ % len(modules)]:
            usec = measure(module, zset_only)
            runs[module].append(usec)
            print("round %d  %s" % (round_ + 1, os.path.basename(module)), flush=True)
            for label, value in usec.items():
                print("    %-55s %6.2f usec/call" % (label, value), flush=True)
    print()
    base = modules[0]
    labels = [label for label in runs[base][0] if all(label in r for m in modules for r in runs[m])]
    names = [os.path.basename(m) for m in modules]
    print("%-55s %s" % ("median usec/call", "  ".join("%14s" % n[:14] for n in names)))
    for label in labels:
        medians = [statistics.median(r[label] for r in runs[m]) for m in modules]
        ratios = []
        for m in modules[1:]:
            per_round = [b[label] / a[label] for a, b in zip(runs[base], runs[m])]
            ratios.append("%s / %s %.3fx (rounds %s)" % (
                os.path.basename(m), os.path.basename(base), statistics.median(per_round),
                ", ".join("%.2f" % r for r in per_round)))
        print("%-55s %s   %s" % (label, "  ".join("%14.2f" % v for v in medians), "; ".join(ratios)))


if __name__ == "__main__":
    main()
