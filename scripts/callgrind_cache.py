#!/usr/bin/env python3
"""Simulated cache and branch behaviour per XCLOAK.ALLOW, under callgrind: what
instruction counts cannot show when two builds run the same number of
instructions at different speeds.

Usage: python3 scripts/callgrind_cache.py A.so [B.so ...]   (needs valgrind; SIZES="10 1000 100000")

For each build and size: one server under valgrind --tool=callgrind
--cache-sim=yes --branch-sim=yes, compact windows held at SIZE entries by
compare.py's streams (2 keys, one entry per 1,000 ms), 4,000 admissions (each
trims one entry and adds one). It prints, per call and inside the command
handler (RedisModuleCommandDispatcher): instructions (Ir), first-level
instruction and data misses (I1mr, D1mr, D1mw), last-level data read misses
(DLmr), mispredicted conditional and indirect branches (Bcm, Bim). On
2026-12-02, at 1,000 entries: 0.1.0 151 I1mr against 184 at 9c0b36f, the
rest alike or lower: the wall-clock gap of admissions into large windows.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import callgrind  # noqa: E402

EVENTS = ["Ir", "I1mr", "D1mr", "D1mw", "DLmr", "Bcm", "Bim"]
CALLS = 2_000  # per key
KEYS = 2


def measure(module, size):
    bench.MODULE = os.path.abspath(module)  # the server chdirs to its --dir before loading
    out_dir = tempfile.mkdtemp(prefix="xcloak-callgrind-cache-")
    wrapper = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--branch-sim=yes",
               "--callgrind-out-file=%s/cg.out" % out_dir]
    server = bench.Server(wrapper=wrapper, storage="compact", cell=False)
    try:
        server.pipe(bench.steady_stream("c", KEYS, size, 1000, size, 0))
        server.expect_type("c:0", "xcloaklog")
        server.client.call("CONFIG", "RESETSTAT")
        dump = callgrind.phase(server, out_dir, lambda: server.pipe(bench.steady_stream("c", KEYS, size, 1000, CALLS, size)), "m1")
        calls, _ = server.stat("xcloak.allow")
        assert calls == KEYS * CALLS, calls
        return [v / calls for v in callgrind.inclusive_events(dump, "RedisModuleCommandDispatcher", EVENTS)]
    finally:
        server.stop()
        bench.shutil.rmtree(out_dir, ignore_errors=True)


def main():
    modules = sys.argv[1:]
    if not modules or any(not os.path.exists(m) for m in modules):
        sys.exit(__doc__)
    sizes = [int(s) for s in os.environ.get("SIZES", "10 1000 100000").split()]
    print("per XCLOAK.ALLOW admission, inside the handler: " + "  ".join(EVENTS))
    for module in modules:
        for size in sizes:
            values = measure(module, size)
            print("%-40s %9s entries  %s" % (module[-40:], "{:,}".format(size),
                                             "  ".join("%s %.2f" % kv for kv in zip(EVENTS, values))), flush=True)


if __name__ == "__main__":
    main()
