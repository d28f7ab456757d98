"""Simulated cache and branch behaviour per XCLOAK.ALLOW, under callgrind: what
instruction counts cannot show when two builds run the same number of
instructions at different speeds.

Usage: python3 -m scripts.bench.callgrind_cache A.so [B.so ...]   (needs valgrind; SIZES="10 1000 100000")

For each build and size: one server under valgrind --tool=callgrind
--cache-sim=yes --branch-sim=yes, compact windows held at SIZE entries by
the entries section's streams (2 keys, one entry per 1,000 ms), 4,000
admissions (each trims one entry and adds one). It prints, per call and inside
the command handler (RedisModuleCommandDispatcher): instructions (Ir),
first-level instruction and data misses (I1mr, D1mr, D1mw), last-level data
read misses (DLmr), mispredicted conditional and indirect branches (Bcm, Bim).
"""

import os
import shutil
import sys
import tempfile

from . import callgrind
from .server import Server
from .workloads import steady_stream

EVENTS = ["Ir", "I1mr", "D1mr", "D1mw", "DLmr", "Bcm", "Bim"]
CALLS = 2_000  # per key
KEYS = 2


def measure(module, size):
    out_dir = tempfile.mkdtemp(prefix="xcloak-callgrind-cache-")
    server = Server(
        module=module, storage="compact", wrapper=callgrind.wrapper(out_dir, cache_sim=True, branch_sim=True)
    )
    try:
        server.pipe(steady_stream("c", KEYS, size, 1000, size, 0))
        server.expect_type("c:0", "xcloaklog")
        server.reset_stats()
        dump = callgrind.phase(
            server, out_dir, lambda: server.pipe(steady_stream("c", KEYS, size, 1000, CALLS, size)), "m1"
        )
        calls, _ = server.stat("xcloak.allow")
        assert calls == KEYS * CALLS, calls
        return [v / calls for v in callgrind.inclusive_events(dump, "RedisModuleCommandDispatcher", EVENTS)]
    finally:
        server.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


def main(modules):
    if not modules or any(not os.path.exists(m) for m in modules):
        sys.exit(__doc__)
    sizes = [int(s) for s in os.environ.get("SIZES", "10 1000 100000").split()]
    print("per XCLOAK.ALLOW admission, inside the handler: " + "  ".join(EVENTS))
    for module in modules:
        for size in sizes:
            values = measure(module, size)
            print(
                "%-40s %9s entries  %s"
                % (module[-40:], "{:,}".format(size), "  ".join("%s %.2f" % kv for kv in zip(EVENTS, values))),
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
