"""Section "refund": XCLOAK.REFUND's cost on windows of 10 to 1,000,000
entries, both forms, of the newest entry and of a middle stamp."""

import statistics
import time

from ..resp import encode
from ..workloads import BASE_MS, QUICK, allow_cmd

SIZES = (10, 100, 1_000, 10_000, 100_000) + (() if QUICK else (1_000_000,))
CALLS = 500 if QUICK else 5_000  # per case (the server times calls in whole microseconds)
WINDOW_MS = 10**12
ROUNDS = 1 if QUICK else 9


def run(server):
    """REFUND usec_per_call on one key per form and size, holding `size` lone
    entries 1,000 ms apart: the newest admission (each REFUND follows the
    ALLOW it gives back, so the window keeps its size), and a stamp in the
    middle (each REFUND of an old stamp is followed by an ALLOW with that
    NOW, which puts it back). Every size's key is built first; then the sizes
    take turns, round after round, so that a slow moment of the machine falls
    on one round of every size. {rows: [{entries, compact: {newest, middle,
    newest_vs_round}, zset: {...}}], newest_flat, middle_compact_over_zset}."""
    limit = 2_000_000
    # A window of 1,000,000 entries plus the one given back takes a limit above MAX-LIMIT's default.
    server.client.call("CONFIG", "SET", "xcloak.max-limit", limit)
    results = {}
    for form in ("compact", "zset"):
        server.storage(form)
        started = time.time()
        keys = {}
        for size in SIZES:
            keys[size] = key = "rf:%s:%d" % (form[0], size)
            server.pipe(allow_cmd(key, WINDOW_MS, limit, BASE_MS + i * 1000) for i in range(size))
            server.expect_type(key, "xcloaklog" if form == "compact" else "zset")
        newest = {size: [] for size in SIZES}
        middle = {size: [] for size in SIZES}
        for round_ in range(ROUNDS):
            shift = round_ % len(SIZES)
            for size in SIZES[shift:] + SIZES[:shift]:
                key, last = keys[size], BASE_MS + (size - 1) * 1000

                def newest_stream():
                    for j in range(CALLS):
                        stamp = last + 1 + j
                        yield allow_cmd(key, WINDOW_MS, limit, stamp)
                        yield encode("XCLOAK.REFUND", key, stamp)

                def middle_stream():
                    # Distinct stamps around the middle, every one in the window.
                    for j in range(CALLS):
                        stamp = BASE_MS + (size // 2 + (j * 7919 + round_ * 101) % max(1, size // 4)) * 1000
                        yield encode("XCLOAK.REFUND", key, stamp)
                        yield allow_cmd(key, WINDOW_MS, limit, stamp)

                for stream, into in ((newest_stream, newest), (middle_stream, middle)):
                    server.reset_stats()
                    server.pipe(stream())
                    calls, usec = server.stat("xcloak.refund")
                    assert calls == CALLS, calls
                    into[size].append(usec)
        for size in SIZES:
            assert server.entries(keys[size], WINDOW_MS, BASE_MS + size * 1000) == size, keys[size]
            against_round = statistics.median(
                newest[size][r] / statistics.mean(newest[s][r] for s in SIZES) for r in range(ROUNDS)
            )
            results[(form, size)] = dict(
                newest=statistics.median(newest[size]),
                middle=statistics.median(middle[size]),
                newest_vs_round=against_round,
            )
            print(
                "  %-7s %8d entries: REFUND of the newest %.2f usec/call (%.2fx the round's mean), of a middle "
                "stamp %.2f usec/call"
                % (form, size, results[(form, size)]["newest"], against_round, results[(form, size)]["middle"]),
                flush=True,
            )
            server.client.call("DEL", keys[size])
        print("  %s: %.0f s" % (form, time.time() - started), flush=True)
    server.storage("compact")
    server.client.call("CONFIG", "SET", "xcloak.max-limit", 1_000_000)
    rows = [dict(entries=size, compact=results[("compact", size)], zset=results[("zset", size)]) for size in SIZES]
    against = [row["compact"]["newest_vs_round"] for row in rows]
    newest = [row["compact"]["newest"] for row in rows]
    largest = rows[-1]
    return dict(
        rows=rows,
        calls=CALLS,
        rounds=ROUNDS,
        newest_flat=max(against) / min(against),
        newest_spread=max(newest) / min(newest),
        middle_compact_over_zset=largest["compact"]["middle"] / largest["zset"]["middle"],
    )
