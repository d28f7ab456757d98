"""Sections "entries" and "keyspace": deterministic streams with NOW, fed with
`redis-cli --pipe`, in which every admission trims exactly one entry and adds
one, so the work per call is the same at every size; only the size (entries
per key, or keys in the keyspace) changes."""

import statistics
import time

from ..workloads import BASE_MS, QUICK, WINDOW_MS, measure_stream, steady_stream

ROUNDS = 1 if QUICK else 15  # the sizes take turns, round after round (medians)
CALLS = 200 if QUICK else 3_000  # calls per key and round, each way (x10 keys: 30,000 calls a measure)
ZSET_SIZES = (10, 100, 1_000, 10_000)
ZSET_KEYS = 10
# The compact form's sizes go up to MAX-LIMIT's default (1,000,000 entries per
# key) on 2 keys: every entry has its own stamp (one per 1,000 ms), so the
# prefill is one call per entry.
COMPACT_SIZES = (10, 100, 1_000, 10_000, 100_000) + (() if QUICK else (1_000_000,))
COMPACT_KEYS = 2


def entries(server, form="zset", sizes=ZSET_SIZES, keys=ZSET_KEYS):
    """Admission and rejection cost at `sizes` live entries per key, on keys of
    `form`: [{entries, admission, rejection, admission_vs_round,
    rejection_vs_round}]. The sizes take turns, round after round (median of
    ROUNDS), so a burst of load on the machine does not land on one size
    only; each size is also read against the mean of every size in the same
    round (median of those ratios), which cancels the drift between rounds.
    Each measurement is 10 * CALLS calls, whatever `keys`."""
    rounds = CALLS * 10 // keys
    tag = "e" if form == "zset" else "ec"
    server.storage(form)
    for size in sizes:
        started = time.time()
        server.pipe(steady_stream("%s%d" % (tag, size), keys, size, 1000, size, 0))
        server.expect_type("%s%d:0" % (tag, size), "zset" if form == "zset" else "xcloaklog")
        if size >= 100_000:
            print(
                "  prefilled %d keys of %d entries (%s) in %.0f s" % (keys, size, form, time.time() - started),
                flush=True,
            )
    samples = {size: ([], []) for size in sizes}

    def check(prefix, size, last_round):
        found = server.entries(prefix + ":0", size * 1000, BASE_MS + last_round * 1000)
        assert found == size, (prefix, found, size)

    for round_ in range(ROUNDS):
        for size in sizes[round_ % len(sizes) :] + sizes[: round_ % len(sizes)]:
            prefix = "%s%d" % (tag, size)
            start = size + round_ * rounds
            admit = measure_stream(
                server, lambda: steady_stream(prefix, keys, size, 1000, rounds, start), keys * rounds
            )
            check(prefix, size, start + rounds - 1)
            reject = measure_stream(
                server, lambda: steady_stream(prefix, keys, size, 1000, rounds, start + rounds, True), keys * rounds
            )
            check(prefix, size, start + rounds - 1)
            samples[size][0].append(admit)
            samples[size][1].append(reject)
    relative = {size: ([], []) for size in sizes}
    for round_ in range(ROUNDS):
        for way in (0, 1):
            mean = statistics.mean(samples[size][way][round_] for size in sizes)
            for size in sizes:
                relative[size][way].append(samples[size][way][round_] / mean)
    rows = []
    for size in sizes:
        row = dict(
            entries=size,
            admission=statistics.median(samples[size][0]),
            rejection=statistics.median(samples[size][1]),
            admission_vs_round=statistics.median(relative[size][0]),
            rejection_vs_round=statistics.median(relative[size][1]),
        )
        rows.append(row)
        print(
            "  %s %8d entries/key: admission (trim 1, add 1) %.2f usec/call, rejection %.2f usec/call (median of %d; "
            "against the round's mean %.2f, %.2f)"
            % (
                form,
                size,
                row["admission"],
                row["rejection"],
                ROUNDS,
                row["admission_vs_round"],
                row["rejection_vs_round"],
            ),
            flush=True,
        )
    server.client.call("FLUSHALL")
    server.storage("zset")
    out = dict(rows=rows, rounds=ROUNDS, calls=10 * CALLS, keys=keys)
    first, last = rows[0], rows[-1]
    # Sorted sets: the cost at the largest size against the smallest, in medians.
    out["admission_last_over_first"] = last["admission"] / first["admission"]
    out["rejection_last_over_first"] = last["rejection"] / first["rejection"]
    # Flatness: largest / smallest of the per-round relative costs' medians.
    ra, rr = [r["admission_vs_round"] for r in rows], [r["rejection_vs_round"] for r in rows]
    out["admission_flat"], out["rejection_flat"] = max(ra) / min(ra), max(rr) / min(rr)
    out["flat"] = max(out["admission_flat"], out["rejection_flat"])
    out["growth"] = max(out["admission_last_over_first"], out["rejection_last_over_first"])
    return out


def keyspace(server):
    """The same per-call work (a sorted-set key holding two entries: trim one,
    add one) over 1 to 1,000,000 keys, round-robin, with INCR over as many
    keys as the floor under the same access pattern."""
    rows = []
    for keys in (1, 1_000, 1_000_000):
        if QUICK and keys > 100_000:
            keys = 100_000
        rounds = max(1, 100_000 // keys)
        prefix = "k"
        server.pipe(steady_stream(prefix, keys, 2, WINDOW_MS // 2, 2, 0))
        usec = measure_stream(server, lambda: steady_stream(prefix, keys, 2, WINDOW_MS // 2, rounds, 2), keys * rounds)
        dbsize = server.client.call("DBSIZE")
        names = [("i:%d" % k).encode() for k in range(keys)]
        incr = measure_stream(
            server,
            lambda: (b"*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n" % (len(n), n) for _ in range(rounds) for n in names),
            keys * rounds,
            "incr",
        )
        rows.append(dict(keys=keys, dbsize=dbsize, usec=usec, incr=incr))
        print(
            "  %9d keys (%d in the keyspace): XCLOAK.ALLOW %.2f usec/call, INCR %.2f usec/call"
            % (keys, dbsize, usec, incr),
            flush=True,
        )
        server.client.call("FLUSHALL")
    return rows
