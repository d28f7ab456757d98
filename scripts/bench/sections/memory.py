"""Memory sections: one key per client address (1,000,000 keys, all returned
once the window passes), bytes per tracked request (MEMORY USAGE), bytes per
identity (MEMORY USAGE and, as the server pays it, the used_memory delta over
many identities), and 1,000,000 identities at limit 10."""

import statistics
import sys
import time

from ..resp import encode
from ..workloads import BASE_MS, QUICK, cell_args

IDENTITY_WINDOW_MS = 60_000
IDENTITY_LIMITS = (10, 100, 1_000, 10_000)
USED_IDENTITIES = 2_000 if QUICK else 10_000
USED_LIMITS = (10, 100, 1_000)
LAYOUTS = ("compact", "zset", "script", "cell")
# A sorted set of 1,000 entries costs about 110 kB: 10,000 of them (and as
# many of the script's) would need 2.3 GB on a shared machine; 1,000 do.
USED_BIG_SET_IDENTITIES = 1_000
ATTACK_IDENTITIES = 100_000 if QUICK else 1_000_000
ATTACK_LIMIT = 10
# redis-cell's key lives until its theoretical arrival time: with a 60 s period
# a fill slower than 60 s (10,000 identities at limit 1,000 on a loaded
# machine) lets the first keys expire before the measurement. Its one string
# has the same size whatever the period, so its fills use an hour.
CELL_FILL_WINDOW_MS = 3_600_000


def settle_memory(server):
    time.sleep(0.5)
    return server.used_memory()


def million(server):
    """1,000,000 calls `XCLOAK.ALLOW ip:<n> 30000 10` (server clock, sorted
    sets), one per key: used_memory loaded, then after the window passes."""
    keys = 100_000 if QUICK else 1_000_000
    # Long enough that every key is still live when the load ends (5-15 s on a
    # busy 2-core machine), short enough to wait for.
    window = 30_000
    server.client.call("FLUSHALL")
    server.storage("zset")
    baseline = settle_memory(server)
    server.reset_stats()
    start = time.time()
    server.pipe(encode("XCLOAK.ALLOW", "ip:%d" % i, window, 10) for i in range(keys))
    elapsed = time.time() - start
    calls, usec = server.stat("xcloak.allow")
    loaded = server.used_memory()
    dbsize = server.client.call("DBSIZE")
    if dbsize != keys:
        print(
            "  note: only %d of %d keys live when the load ended (it took %.0f s)" % (dbsize, keys, elapsed), flush=True
        )
    # The server's active expiry reclaims the keys without any command touching them.
    deadline = time.time() + 180
    while server.client.call("DBSIZE") > 0 and time.time() < deadline:
        time.sleep(0.5)
    emptied_after = time.time() - start
    left = server.client.call("DBSIZE")
    after = settle_memory(server)
    out = dict(
        keys=keys,
        window=window,
        usec=usec,
        calls=calls,
        dbsize=dbsize,
        baseline=baseline,
        loaded=loaded,
        after=after,
        left=left,
        emptied_after=emptied_after,
        load_seconds=elapsed,
        bytes_per_key=(loaded - baseline) / max(1, dbsize),
        loaded_mb=(loaded - baseline) / 1e6,
        left_mb=(after - baseline) / 1e6,
    )
    print(
        "  %d keys: +%.1f MB (%.0f B/key), %.2f usec/call; DBSIZE %d after %.0f s, used_memory %+.2f MB vs baseline"
        % (keys, out["loaded_mb"], out["bytes_per_key"], usec, left, emptied_after, out["left_mb"]),
        flush=True,
    )
    return out


def per_request(server, sha, copies=5):
    """Bytes per tracked request, over `copies` keys of each layout (a skiplist's
    node sizes are random: several keys average that out), after N admissions
    one millisecond apart: [{entries, zset, script, compact}]."""
    rows = []
    for entries in (100, 1_000, 10_000):
        ours_b = script_b = compact_b = 0
        for copy in range(copies):
            ours, script, compact = (
                "m:x%d:%d" % (entries, copy),
                "m:s%d:%d" % (entries, copy),
                "m:c%d:%d" % (entries, copy),
            )
            t0 = BASE_MS
            server.storage("zset")
            server.pipe(encode("XCLOAK.ALLOW", ours, 10**9, entries, "NOW", t0 + j) for j in range(entries))
            server.pipe(encode("EVALSHA", sha, 1, script, t0 + j, 10**9, entries) for j in range(entries))
            server.storage("compact")
            server.pipe(encode("XCLOAK.ALLOW", compact, 10**9, entries, "NOW", t0 + j) for j in range(entries))
            server.expect_type(ours, "zset")
            server.expect_type(compact, "xcloaklog")
            assert server.client.call("ZCARD", ours) == entries == server.client.call("ZCARD", script)
            assert server.entries(compact, 10**9, t0 + entries - 1) == entries
            usage = lambda key: server.client.call("MEMORY", "USAGE", key, "SAMPLES", 0)  # noqa: E731
            ours_b += usage(ours)
            compact_b += usage(compact)
            script_b += usage(script) + usage(script + ":seq")
        n = entries * copies
        row = dict(entries=entries, zset=ours_b / n, script=script_b / n, compact=compact_b / n)
        row["zset_over_script"] = row["zset"] / row["script"]
        row["compact_over_script"] = row["compact"] / row["script"]
        rows.append(row)
        print(
            "  %6d entries: XCLOAK sorted set %.2f B/request, compact %.2f B/request, script %.2f B/request"
            % (entries, row["zset"], row["compact"], row["script"]),
            flush=True,
        )
    server.client.call("FLUSHALL")
    server.storage("zset")
    return rows


def identity(server, sha, copies=5):
    """Bytes per identity (MEMORY USAGE ... SAMPLES 0, mean over `copies` keys):
    a window of 60 s filled to its limit, stamps evenly spaced over it, for
    the article's script (its set and its :seq key), both forms and
    redis-cell (one key after `limit` admitted CL.THROTTLE calls):
    [{limit, script, zset, compact, cell}]."""
    rows = []
    window = IDENTITY_WINDOW_MS
    for limit in IDENTITY_LIMITS:
        sizes = {layout: 0 for layout in ("script", "zset", "compact", "cell")}
        stamps = [BASE_MS + j * window // limit for j in range(limit)]
        now = stamps[-1]
        for copy in range(copies):
            # Names of the same length for every layout (the name is counted).
            key = {
                layout: "id:%s:%d:%d" % (letter, limit, copy)
                for layout, letter in (("script", "s"), ("zset", "z"), ("compact", "c"), ("cell", "r"))
            }
            server.pipe(encode("EVALSHA", sha, 1, key["script"], t, window, limit) for t in stamps)
            server.storage("zset")
            server.pipe(encode("XCLOAK.ALLOW", key["zset"], window, limit, "NOW", t) for t in stamps)
            server.storage("compact")
            server.pipe(encode("XCLOAK.ALLOW", key["compact"], window, limit, "NOW", t) for t in stamps)
            server.storage("zset")
            server.pipe(encode("CL.THROTTLE", key["cell"], *cell_args(limit, window), 1) for _ in stamps)
            assert server.client.call("ZCARD", key["script"]) == limit
            server.expect_type(key["zset"], "zset")
            server.expect_type(key["compact"], "xcloaklog")
            server.expect_type(key["cell"], "string")
            for form in ("zset", "compact"):
                assert server.entries(key[form], window, now) == limit, (form, limit)
                assert server.client.call("XCLOAK.PEEK", key[form], window, limit, "NOW", now)[0] == 0
            for layout in sizes:
                sizes[layout] += server.client.call("MEMORY", "USAGE", key[layout], "SAMPLES", 0)
            sizes["script"] += server.client.call("MEMORY", "USAGE", key["script"] + ":seq", "SAMPLES", 0)
        row = dict(limit=limit, **{layout: total / copies for layout, total in sizes.items()})
        row["compact_per_request"] = row["compact"] / limit
        rows.append(row)
        print(
            "  limit %6d: script %.0f B, sorted set %.0f B, compact %.0f B, redis-cell %.0f B per identity"
            % (limit, row["script"], row["zset"], row["compact"], row["cell"]),
            flush=True,
        )
    server.client.call("FLUSHALL")
    return rows


def fill_identities(server, sha, layout, identities, limit, window=IDENTITY_WINDOW_MS):
    """`identities` windows of `layout`, each filled to `limit` with stamps
    evenly spaced over `window`, round after round (the j-th call of every
    identity, then the (j+1)-th): every key's last call is in the last round,
    so none reaches its TTL before the measurement, however long the fill
    takes. Commands are encoded once per round, so the fill runs at the
    server's pace."""
    letter = {"compact": "c", "zset": "z", "script": "s", "cell": "r"}[layout]
    names = [("u:%s:%07d" % (letter, i)).encode() for i in range(identities)]  # the same length for every layout
    keys = [b"$%d\r\n%s\r\n" % (len(n), n) for n in names]
    server.storage("compact" if layout == "compact" else "zset")
    bulk = lambda value: b"$%d\r\n%s\r\n" % (len(str(value)), str(value).encode())  # noqa: E731

    def commands():
        for j in range(limit):
            now = BASE_MS + j * window // limit
            if layout == "script":
                head, tail = b"*7\r\n$7\r\nEVALSHA\r\n" + bulk(sha) + bulk(1), bulk(now) + bulk(window) + bulk(limit)
            elif layout == "cell":
                head, tail = (
                    b"*6\r\n$11\r\nCL.THROTTLE\r\n",
                    b"".join(bulk(a) for a in cell_args(limit, CELL_FILL_WINDOW_MS)) + bulk(1),
                )
            else:
                head, tail = b"*6\r\n$12\r\nXCLOAK.ALLOW\r\n", bulk(window) + bulk(limit) + b"$3\r\nNOW\r\n" + bulk(now)
            yield b"".join(head + key + tail for key in keys)

    server.pipe(commands())
    return names


def check_filled(server, layout, names, limit, window=IDENTITY_WINDOW_MS):
    """Every window full and every key there (the script's :seq keys too)."""
    now = BASE_MS + (limit - 1) * window // limit
    for i in (0, len(names) // 2, len(names) - 1):
        key = names[i].decode()
        server.expect_type(key, {"compact": "xcloaklog", "cell": "string"}.get(layout, "zset"))
        if layout in ("compact", "zset"):
            assert server.entries(key, window, now) == limit, (layout, key)
        elif layout == "script":
            assert server.client.call("ZCARD", key) == limit, (layout, key)
    expected_keys = len(names) * (2 if layout == "script" else 1)
    dbsize = server.client.call("DBSIZE")
    if dbsize != expected_keys:
        sys.exit(
            "bench: %d of %d keys left after filling %s identities (expired before the measurement?)"
            % (dbsize, expected_keys, layout)
        )


def used_per_identity(server, sha, layout, identities, limit):
    """The used_memory delta per identity, read as soon as the fill ends (the
    server's accounting is exact), then checked: every window full and every
    key still there. (bytes per identity, seconds)."""
    server.client.call("FLUSHALL")
    before = settle_memory(server)
    started = time.time()
    names = fill_identities(server, sha, layout, identities, limit)
    after = server.used_memory()
    check_filled(server, layout, names, limit)
    server.client.call("FLUSHALL")
    return (after - before) / identities, time.time() - started


def used_memory(server, sha):
    """[{limit, identities: {layout: n}, bytes: {layout: per identity},
    compact_over_cell}]: the median of three fills where a fill is quick
    (limits 10 and 100), after one fill that is thrown away (a fresh server's
    first keys cost some 10 B more each: tables it keeps once grown)."""
    used_per_identity(server, sha, "compact", USED_IDENTITIES, 10)
    rows = []
    for limit in USED_LIMITS:
        per, counts = {}, {}
        for layout in LAYOUTS:
            n = USED_BIG_SET_IDENTITIES if limit >= 1_000 and layout in ("zset", "script") else USED_IDENTITIES
            reps = 3 if limit <= 100 else 1
            runs = [used_per_identity(server, sha, layout, n, limit) for _ in range(reps)]
            per[layout] = statistics.median(r[0] for r in runs)
            counts[layout] = n
            print(
                "  limit %5d, %-7s %7d identities: used_memory %+.0f B per identity (%s; %.0f s)"
                % (limit, layout, n, per[layout], ", ".join("%.0f" % r[0] for r in runs), sum(r[1] for r in runs)),
                flush=True,
            )
        rows.append(dict(limit=limit, identities=counts, bytes=per, compact_over_cell=per["compact"] / per["cell"]))
    server.storage("compact")
    return rows


def attack(server, sha):
    """ATTACK_IDENTITIES identities at limit 10, each window full: used_memory
    per identity and in all (MB), per layout."""
    out = dict(identities=ATTACK_IDENTITIES, limit=ATTACK_LIMIT, bytes={}, mb={})
    for layout in LAYOUTS:
        per, seconds = used_per_identity(server, sha, layout, ATTACK_IDENTITIES, ATTACK_LIMIT)
        out["bytes"][layout] = per
        out["mb"][layout] = per * ATTACK_IDENTITIES / 1e6
        print(
            "  %d identities at limit %d, %-7s: used_memory %+.1f MB (%.0f B per identity, %.0f s)"
            % (ATTACK_IDENTITIES, ATTACK_LIMIT, layout, out["mb"][layout], per, seconds),
            flush=True,
        )
    server.storage("compact")
    return out
