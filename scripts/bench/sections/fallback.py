"""Section "fallback": what a call costs on a server without the module (a
managed Redis), where the packages send `src/lua/xcloak_allow.lua`, against
the article's script and limits 5.8.0's moving window (the peer behind
Flask-Limiter and slowapi), on one server, in the same run.

Server CPU per call is EVALSHA's usec / calls in INFO commandstats after
CONFIG RESETSTAT: it includes the script's inner calls. Two workloads, each
a deterministic stream fed with `redis-cli --pipe` (pipelined), key after
key, round after round:
- admissions: 10,000 keys, limit 1,000, 10 calls per key (all admitted);
- rejections: 1,000 keys filled to limit 10 by the same script, then 20
  calls per key (all rejected).
Window 60 s. ROUNDS rounds, the order of the scripts rotating, fresh keys
each round; a ratio is the median of the per-round ratios. Then, once, the
same on a server under callgrind (fewer keys): EVALSHA's inclusive
instructions per call, the repeatable measure."""

import hashlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

from .. import callgrind, deps
from ..resp import encode
from ..server import Server

ROUNDS = 1 if os.environ.get("BENCH_QUICK") == "1" else 3
WINDOW_MS = 60_000
ADMIT = dict(keys=10_000, limit=1_000, calls=10)
REJECT = dict(keys=1_000, limit=10, calls=20)
# Under callgrind (about 50 times slower): fewer keys and calls, the same shapes.
CG_ADMIT = dict(keys=1_000, limit=1_000, calls=5)
CG_REJECT = dict(keys=200, limit=10, calls=5)
NAMES = ("details", "plain", "article", "limits")
LABELS = {
    "details": "xcloak_allow.lua with DETAILS (what every package sends)",
    "plain": "xcloak_allow.lua without DETAILS (the article's 1/0 reply)",
    "article": "the article's script (tests/oracle/article.lua)",
    "limits": "limits 5.8.0 acquire_moving_window.lua",
}
RATIOS = (("details", "article"), ("plain", "article"), ("details", "limits"), ("plain", "limits"))


def argv_names(source):
    """The script's ARGV, in order, as it names them (`local name = tonumber(ARGV[i])`)."""
    found = {int(i): name for name, i in re.findall(r"local\s+(\w+)\s*=\s*tonumber\(ARGV\[(\d+)\]\)", source)}
    return [found[i] for i in range(1, len(found) + 1)] if found and max(found) == len(found) else None


class Script:
    """One script: its source, its SHA1, and how one call's arguments after
    the key are built for a window and a limit."""

    def __init__(self, name, source, args):
        self.name, self.source, self.args = name, source, args
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def call(self, key, limit):
        return encode("EVALSHA", self.sha, 1, key, *self.args(limit))

    def shape(self):
        return "EVALSHA <sha> 1 key " + " ".join(str(a) for a in self.args("LIMIT"))


def scripts(now_ms, now_s):
    """The four scripts: the fallback as the packages call it (the window, the
    limit, then DETAILS; no NOW: the server's clock; no STAMP: `allow` sends
    it only when asked), the same without DETAILS, the article's (NOW, window,
    limit), and limits' (ARGV read from the script itself: limits passes the
    client's time.time() in seconds, the limit, the expiry in seconds, the
    amount)."""
    fallback = deps.read(deps.FALLBACK)
    limits = deps.limits_script()
    names = argv_names(limits)
    if names != ["timestamp", "limit", "expiry", "amount"]:
        sys.exit(
            "bench: limits' acquire_moving_window.lua takes ARGV %s; the bench knows "
            "timestamp, limit, expiry, amount" % names
        )
    values = lambda limit: dict(timestamp="%.6f" % now_s, limit=limit, expiry=WINDOW_MS // 1000, amount=1)  # noqa: E731
    return {
        "details": Script("details", fallback, lambda limit: [WINDOW_MS, limit, "DETAILS"]),
        "plain": Script("plain", fallback, lambda limit: [WINDOW_MS, limit]),
        "article": Script("article", deps.read(deps.ARTICLE), lambda limit: [now_ms, WINDOW_MS, limit]),
        "limits": Script("limits", limits, lambda limit: [values(limit)[n] for n in names]),
    }


def stream(script, prefix, shape, calls):
    """`calls` rounds of one call per key, key after key."""
    names = ["%s:%d" % (prefix, k) for k in range(shape["keys"])]
    for _ in range(calls):
        for name in names:
            yield script.call(name, shape["limit"])


def held(server, script, key):
    """Entries held in a key of this script (limits keeps a list)."""
    return server.client.call("LLEN" if script.name == "limits" else "ZCARD", key)


def measure(server, script, workload, prefix, shape, send):
    """One workload for one script: (usec per call, process CPU usec per
    call), checked: every call admitted (admissions) or none (rejections)."""
    calls = shape["keys"] * shape["calls"]
    if workload == "rejections":
        send(stream(script, prefix, shape, shape["limit"]))
    server.reset_stats()
    cpu = server.cpu_seconds()
    send(stream(script, prefix, shape, shape["calls"]))
    cpu = server.cpu_seconds() - cpu
    got, usec = server.stat("evalsha")
    assert got == calls, (script.name, workload, got, calls)
    expected = shape["calls"] if workload == "admissions" else shape["limit"]
    for k in (0, shape["keys"] // 2, shape["keys"] - 1):
        found = held(server, script, "%s:%d" % (prefix, k))
        if found != expected:
            sys.exit(
                "bench: fallback %s %s: key %d holds %d entries, expected %d"
                % (script.name, workload, k, found, expected)
            )
    return usec, cpu * 1e6 / calls


def load(server, chosen):
    for script in chosen.values():
        if server.client.call("SCRIPT", "LOAD", script.source) != script.sha:
            sys.exit("bench: SCRIPT LOAD of %s returned another SHA1" % script.name)


def summarise(samples, process):
    """Per-round samples {name: [usec]} and {name: [process CPU usec]} -> medians,
    ranges and the medians of per-round ratios (of both)."""
    out = dict(
        usec={n: statistics.median(v) for n, v in samples.items()},
        low={n: min(v) for n, v in samples.items()},
        high={n: max(v) for n, v in samples.items()},
        process_usec={n: statistics.median(v) for n, v in process.items()},
        ratios={},
        ratio_rounds={},
        process_ratios={},
    )
    for a, b in RATIOS:
        key = "%s_over_%s" % (a, b)
        per_round = [x / y for x, y in zip(samples[a], samples[b])]
        out["ratios"][key] = statistics.median(per_round)
        out["ratio_rounds"][key] = per_round
        out["process_ratios"][key] = statistics.median(x / y for x, y in zip(process[a], process[b]))
    return out


def run(rounds=ROUNDS):
    """The section on its own server without the module."""
    server = Server(module=None)
    try:
        info = server.client.info("server")
        version = "%s %s" % (
            "Valkey" if "valkey_version" in info else "Redis",
            info.get("valkey_version", info.get("redis_version")),
        )
        chosen = scripts(server.now_ms(), time.time())
        load(server, chosen)
        samples = {w: {n: [] for n in NAMES} for w in ("admissions", "rejections")}
        process = {w: {n: [] for n in NAMES} for w in ("admissions", "rejections")}
        for round_ in range(rounds):
            order = NAMES[round_ % len(NAMES) :] + NAMES[: round_ % len(NAMES)]
            for workload, shape in (("admissions", ADMIT), ("rejections", REJECT)):
                for name in order:
                    prefix = "f%s%s%d" % (workload[0], name[0], round_)
                    usec, cpu = measure(server, chosen[name], workload, prefix, shape, server.pipe)
                    samples[workload][name].append(usec)
                    process[workload][name].append(cpu)
                    print(
                        "  round %d %-10s %-8s %6.2f usec/call (process %5.2f)"
                        % (round_ + 1, workload, name, usec, cpu),
                        flush=True,
                    )
                server.client.call("FLUSHALL")
        out = dict(
            server=version,
            rounds=rounds,
            window_ms=WINDOW_MS,
            admit=ADMIT,
            reject=REJECT,
            calls={n: chosen[n].shape() for n in NAMES},
            labels=LABELS,
        )
        for workload in ("admissions", "rejections"):
            out[workload] = summarise(samples[workload], process[workload])
    finally:
        server.stop()
    return out


def instructions():
    """EVALSHA's inclusive instructions per call (evalShaCommand) under
    callgrind, once per script and workload: {admissions: {name: n, ratios},
    rejections: ...}; None when valgrind is missing."""
    if not shutil.which("valgrind"):
        print("  valgrind missing: no instruction counts", flush=True)
        return None
    workdir = tempfile.mkdtemp(prefix="xcloak-bench-cg-")
    server = Server(module=None, wrapper=callgrind.wrapper(workdir))
    try:
        chosen = scripts(server.now_ms(), time.time())
        load(server, chosen)
        out = {}
        for workload, shape in (("admissions", CG_ADMIT), ("rejections", CG_REJECT)):
            counts = {}
            for name in NAMES:
                prefix = "g%s%s" % (workload[0], name[0])
                script, calls = chosen[name], shape["keys"] * shape["calls"]
                if workload == "rejections":
                    server.pipe(stream(script, prefix, shape, shape["limit"]))
                server.reset_stats()
                dump = callgrind.phase(
                    server,
                    workdir,
                    lambda: server.pipe(stream(script, prefix, shape, shape["calls"])),
                    "%s_%s" % (workload, name),
                )
                got, _ = server.stat("evalsha")
                assert got == calls, (name, got, calls)
                counts[name] = callgrind.inclusive(dump, "evalShaCommand") / calls
                if not counts[name]:
                    sys.exit("bench: no evalShaCommand in the callgrind dump (a stripped redis-server?)")
                print("  %-10s %-8s %8.0f instructions/call" % (workload, name, counts[name]), flush=True)
                os.remove(dump)
            server.client.call("FLUSHALL")
            ratios = {"%s_over_%s" % (a, b): counts[a] / counts[b] for a, b in RATIOS}
            out[workload] = dict(count=counts, ratios=ratios, shape=shape)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out
