"""Instructions per XCLOAK.REFUND on windows of 10 to 1,000,000 entries, under
callgrind: the repeatable companion of the refund section, whose
usec_per_call moves by tens of percent on a loaded machine.

Usage: python3 -m scripts.bench.callgrind_refund [compact|zset]   (needs valgrind;
XCLOAK_MODULE / XCLOAK_SERVER as for make bench)

One server under callgrind, the windows in the given form, each holding lone
entries 1,000 ms apart (window 10^12 ms). Per size, 200 times each:
- newest: REFUND of the newest stamp, then the ALLOW ... NOW that puts it back;
- middle: REFUND of a stamp near the middle (all distinct), then its ALLOW.
It prints the REFUND handler's inclusive instructions per call, and checks
with INFO xcloak's `refunded` that every refund removed an entry (a refund
that finds nothing costs less and would flatter the figure).
"""

import shutil
import sys
import tempfile

from . import callgrind, deps
from .resp import encode
from .server import Server

SIZES = (10, 1_000, 100_000, 1_000_000)
CALLS = 200
BASE_MS = 1_700_000_000_000
WINDOW_MS = 10**12
LIMIT = 1_000_000
HANDLER = "xcloak::commands::refund"


def allow(key, stamp):
    return encode("XCLOAK.ALLOW", key, WINDOW_MS, LIMIT, "NOW", stamp)


def refunded(server):
    return int(server.client.info("xcloak")["xcloak_refunded"])


def measure(server, out_dir, dumps, key, stamps):
    """Instructions per REFUND of each of `stamps` (each put back after)."""
    before = refunded(server)
    dump = callgrind.phase(
        server,
        out_dir,
        lambda: server.pipe(c for stamp in stamps for c in (encode("XCLOAK.REFUND", key, stamp), allow(key, stamp))),
        "m%d" % dumps,
    )
    removed = refunded(server) - before
    assert removed == len(stamps), "%d of %d refunds removed an entry" % (removed, len(stamps))
    return callgrind.inclusive(dump, HANDLER) // len(stamps)


def main(args):
    form = args[0] if args else "compact"
    out_dir = tempfile.mkdtemp(prefix="xcloak-callgrind-refund-")
    server = Server(module=deps.MODULE, storage=form, wrapper=callgrind.wrapper(out_dir))
    try:
        print("%s: entries  newest (instructions/call)  middle (instructions/call)" % form)
        dumps = 0
        for n in SIZES:
            key = "refund:%d" % n
            server.pipe(allow(key, BASE_MS + i * 1000) for i in range(n))
            newest = [BASE_MS + (n - 1) * 1000] * CALLS
            middle = [BASE_MS + ((n // 2 + j - CALLS // 2) if n > CALLS else j % n) * 1000 for j in range(CALLS)]
            dumps += 1
            a = measure(server, out_dir, dumps, key, newest)
            dumps += 1
            b = measure(server, out_dir, dumps, key, middle)
            print("%9d  %d  %d" % (n, a, b))
            server.client.call("DEL", key)
    finally:
        server.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
