"""Section "commands": XCLOAK.ALLOW on both forms, the article's script, ZADD,
redis-cell's CL.THROTTLE and INCR under redis-benchmark on the same server
(main, larger and attack mixes); and tiers: one 2-tier call against two
calls on two keys."""

import statistics

from ..resp import encode
from ..workloads import (
    BASE_MS,
    KEYS,
    WINDOW_MS,
    LABEL,
    SLUG,
    LAYOUT_FORM,
    LAYOUT_TYPE,
    PIPELINE,
    QUICK,
    benchmark_once,
    bench_commands,
    prefill_keys,
)

MODE = {True: "pipelined", False: "unpipelined"}


def mean_card(server, prefix, layout, keys=KEYS, sample=200):
    """Mean live entries per key over a sample of the keys (None: no entries to count)."""
    if layout in (None, "cell"):
        return None
    picks = range(0, keys, keys // sample)
    total = 0
    for i in picks:
        key = "%s:%012d" % (prefix, i)
        total += server.entries(key, WINDOW_MS) if layout == "compact" else server.client.call("ZCARD", key)
    return total / len(picks)


def run(server, sha, mix, tag):
    """{command name: {mode: {rps, usec, p50, p99, card_before, card_after,
    admitted, process_usec}}}: medians of mix.rounds rounds, fresh keys each
    round, the order of the commands rotating."""
    now_ms = int(server.client.call("TIME")[0]) * 1000
    commands = bench_commands(sha, now_ms, mix.limit)
    samples = {}
    for round_ in range(mix.rounds):
        for pipelined in mix.modes:
            mode = "p" if pipelined else "u"
            # No command always runs first after a FLUSHALL or right after another one.
            shift = round_ % len(commands)
            for command in commands[shift:] + commands[:shift]:
                prefix = "%s%s%s%d" % (command.prefix, tag, mode, round_)
                if command.layout:
                    prefill_keys(server, prefix, command.layout, now_ms, mix.prefill, mix.limit, mix.keys)
                else:
                    server.storage(LAYOUT_FORM[None])
                card_before = mean_card(server, prefix, command.layout, mix.keys)
                admitted_before = int(server.client.info("xcloak").get("xcloak_admitted", 0))
                result = benchmark_once(server, command, command.argv(prefix), pipelined, mix.requests, mix.keys)
                card_after = mean_card(server, prefix, command.layout, mix.keys)
                admitted = int(server.client.info("xcloak").get("xcloak_admitted", 0)) - admitted_before
                # Each row ran on the intended form (a sample key; INCR's exist only once called).
                for i in (0, mix.keys // 2, mix.keys - 1):
                    key = "%s:%012d" % (prefix, i)
                    if command.layout or server.client.call("EXISTS", key):
                        server.expect_type(key, LAYOUT_TYPE[command.layout])
                row = dict(
                    rps=result.rps,
                    usec=result.usec,
                    p50=result.p50,
                    p99=result.p99,
                    card_before=card_before,
                    card_after=card_after,
                    process_usec=result.process_usec,
                    admitted=admitted / mix.requests if command.stat == "xcloak.allow" else None,
                )
                samples.setdefault(SLUG[command.name], {}).setdefault(MODE[pipelined], []).append(row)
                print(
                    "  round %d %-11s %-25s %9.0f rps %6.2f usec/call (process %5.2f)  p50 %.3f p99 %.3f ms"
                    % (
                        round_ + 1,
                        MODE[pipelined],
                        LABEL[command.name],
                        result.rps,
                        result.usec,
                        result.process_usec,
                        result.p50,
                        result.p99,
                    ),
                    flush=True,
                )
        server.client.call("FLUSHALL")
    out = {}
    for name, modes in samples.items():
        for mode, rows in modes.items():
            out.setdefault(name, {})[mode] = {
                field: statistics.median(r[field] for r in rows) if rows[0][field] is not None else None
                for field in rows[0]
            }
    usec = lambda name: out[name]["pipelined"]["usec"]  # noqa: E731
    process = lambda name: out[name]["pipelined"]["process_usec"]  # noqa: E731
    ratios = {}
    for a, b in (
        ("script", "allow_compact"),
        ("script", "allow_zset"),
        ("allow_compact", "zadd"),
        ("allow_zset", "zadd"),
        ("cell", "allow_compact"),
        ("cell", "allow_zset"),
        ("script", "zadd"),
    ):
        ratios["%s_over_%s" % (a, b)] = usec(a) / usec(b)
        ratios["%s_over_%s_process" % (a, b)] = process(a) / process(b)
    ratios["rps_allow_zset_over_script"] = out["allow_zset"]["pipelined"]["rps"] / out["script"]["pipelined"]["rps"]
    ratios["rps_zadd_over_script"] = out["zadd"]["pipelined"]["rps"] / out["script"]["pipelined"]["rps"]
    if "unpipelined" in out["script"]:
        ratios["script_over_allow_zset_unpipelined"] = (
            out["script"]["unpipelined"]["usec"] / out["allow_zset"]["unpipelined"]["usec"]
        )
        ratios["allow_zset_over_zadd_unpipelined"] = (
            out["allow_zset"]["unpipelined"]["usec"] / out["zadd"]["unpipelined"]["usec"]
        )
    return dict(
        rows=out,
        ratios=ratios,
        mix=dict(
            prefill=mix.prefill,
            limit=mix.limit,
            calls=mix.calls,
            rounds=mix.rounds,
            keys=mix.keys,
            requests=mix.requests,
            modes=[MODE[m] for m in mix.modes],
        ),
    )


TIER_SHORT = (1000, 10)
TIER_LONG = (3_600_000, 1000)
TIER_ROUNDS = 1 if QUICK else 3


def tiers(server):
    """An API quota of 10 a second and 1,000 an hour per identity. Per form: CPU
    per request (pipelined, fresh random keys, about 10 calls per key within a
    few seconds, so the per-second tier rejects some) of one 2-tier call
    against the two separate calls on two keys users make today (one
    redis-benchmark run each, their usec_per_call summed); then memory per
    identity once an hour's quota is used (1,000 admissions 100 ms apart)."""
    (short_ms, short_limit), (long_ms, long_limit) = TIER_SHORT, TIER_LONG
    requests = KEYS * 10
    allow = bench_commands("", 0, 10)[0]  # its stat: xcloak.allow
    forms = {}
    for form, type_name in (("zset", "zset"), ("compact", "xcloaklog")):
        server.storage(form)
        tiered, separate = [], []
        for round_ in range(TIER_ROUNDS):
            prefix = "%s%d" % (form[0], round_)
            argv = [
                "XCLOAK.ALLOW",
                "t%s:__rand_int__" % prefix,
                str(short_ms),
                str(short_limit),
                "TIER",
                str(long_ms),
                str(long_limit),
            ]
            tiered.append(benchmark_once(server, allow, argv, True, requests))
            both = [
                benchmark_once(
                    server,
                    allow,
                    ["XCLOAK.ALLOW", "%s%s:__rand_int__" % (kind, prefix), str(window), str(limit)],
                    True,
                    requests,
                )
                for kind, (window, limit) in (("s", TIER_SHORT), ("h", TIER_LONG))
            ]
            separate.append((both[0].usec + both[1].usec, both[0].process_usec + both[1].process_usec))
            print(
                "  %-7s round %d  2-tier %6.2f usec/request (process %5.2f); two calls %6.2f usec/request "
                "(process %5.2f)"
                % (form, round_ + 1, tiered[-1].usec, tiered[-1].process_usec, separate[-1][0], separate[-1][1]),
                flush=True,
            )
            server.client.call("FLUSHALL")
        t0 = BASE_MS
        server.pipe(
            encode("XCLOAK.ALLOW", "mt", short_ms, short_limit, "TIER", long_ms, long_limit, "NOW", t0 + 100 * j)
            for j in range(long_limit)
        )
        server.pipe(
            encode("XCLOAK.ALLOW", key, window, limit, "NOW", t0 + 100 * j)
            for j in range(long_limit)
            for key, (window, limit) in (("ms", TIER_SHORT), ("mh", TIER_LONG))
        )
        for key in ("mt", "ms", "mh"):
            server.expect_type(key, type_name)
        usage = lambda key: server.client.call("MEMORY", "USAGE", key, "SAMPLES", 0)  # noqa: E731
        held = lambda key: server.entries(key, long_ms, t0 + 100 * (long_limit - 1))  # noqa: E731
        memory = dict(
            tiered=usage("mt"),
            separate=usage("ms") + usage("mh"),
            tiered_entries=held("mt"),
            separate_entries=held("ms") + held("mh"),
        )
        print(
            "  %-7s memory per identity: 2-tier %d B (%d entries), two keys %d B (%d entries)"
            % (form, memory["tiered"], memory["tiered_entries"], memory["separate"], memory["separate_entries"]),
            flush=True,
        )
        server.client.call("FLUSHALL")
        forms[form] = dict(
            tiered=dict(
                usec=statistics.median(r.usec for r in tiered),
                process_usec=statistics.median(r.process_usec for r in tiered),
            ),
            separate=dict(
                usec=statistics.median(s[0] for s in separate), process_usec=statistics.median(s[1] for s in separate)
            ),
            memory=memory,
        )
        forms[form]["cpu_separate_over_tiered"] = forms[form]["separate"]["usec"] / forms[form]["tiered"]["usec"]
        forms[form]["memory_separate_over_tiered"] = memory["separate"] / memory["tiered"]
    server.storage("compact")
    return dict(forms=forms, requests=requests, rounds=TIER_ROUNDS, short=TIER_SHORT, long=TIER_LONG, pipeline=PIPELINE)
