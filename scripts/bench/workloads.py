"""The workloads: what is sent, to which keys, prefilled how. redis-benchmark
runs over random keys, deterministic streams with NOW for `redis-cli --pipe`,
the prefill of each layout. Imports resp and server."""

import dataclasses
import os
import subprocess
import sys

from .resp import encode
from .server import NICE

QUICK = os.environ.get("BENCH_QUICK") == "1"
KEYS = 10_000
WINDOW_MS = 3_600_000
CLIENTS = 50
PIPELINE = 16
BASE_MS = 1_732_941_234_567  # a real stamp: members then take their full width (t mod 10^11 is not small)


@dataclasses.dataclass(frozen=True)
class Mix:
    """A redis-benchmark workload: `keys` random keys, each prefilled with
    `prefill` live entries, `calls` calls per key on average under `limit`;
    `rounds` rounds of each `modes` (True: pipelined)."""

    prefill: int
    limit: int
    calls: int
    rounds: int
    modes: tuple
    keys: int = KEYS

    @property
    def requests(self):
        return self.keys * self.calls


# MAIN is the article's limit of 10, half of the calls rejected; LARGER: every
# call works on a set of 50-70 entries; ATTACK: each address already near its
# limit, about one call in ten admitted (pipelined only).
MAIN = Mix(prefill=5, limit=10, calls=10, rounds=1 if QUICK else 3, modes=(True, False))
LARGER = Mix(prefill=50, limit=60, calls=20, rounds=1, modes=(True, False))
ATTACK = Mix(prefill=9, limit=10, calls=10, rounds=1 if QUICK else 3, modes=(True,))

# The form each layout's keys are created in, and the TYPE they must have.
LAYOUT_FORM = {"xcloak": "zset", "compact": "compact", "script": "zset", "zadd": "zset", "cell": "zset", None: "zset"}
LAYOUT_TYPE = {
    "xcloak": "zset",
    "compact": "xcloaklog",
    "script": "zset",
    "zadd": "zset",
    "cell": "string",
    None: "string",
}

# Rows of the command tables, in order: the internal name and the label shown.
ROWS = ["XCLOAK.ALLOW", "XCLOAK.ALLOW compact", "EVALSHA script", "ZADD", "CL.THROTTLE", "INCR"]
# Their keys in the result data (docs/performance.json).
SLUG = {
    "XCLOAK.ALLOW": "allow_zset",
    "XCLOAK.ALLOW compact": "allow_compact",
    "EVALSHA script": "script",
    "ZADD": "zadd",
    "CL.THROTTLE": "cell",
    "INCR": "incr",
}
LABEL = {
    "XCLOAK.ALLOW": "XCLOAK.ALLOW (sorted set)",
    "XCLOAK.ALLOW compact": "XCLOAK.ALLOW (compact)",
    "EVALSHA script": "EVALSHA script",
    "ZADD": "ZADD",
    "CL.THROTTLE": "redis-cell CL.THROTTLE",
    "INCR": "INCR",
}


@dataclasses.dataclass(frozen=True)
class Command:
    """One row of the command tables: its name, its INFO commandstats name, its
    key prefix, the layout its keys are prefilled in, and argv(prefix)."""

    name: str
    stat: str
    prefix: str
    layout: object
    argv: object


def cell_args(limit, window_ms):
    """CL.THROTTLE's parameters for `limit` per `window_ms`: a burst of `limit`
    (max_burst = limit - 1) refilled at `limit` per period (whole seconds)."""
    return [limit - 1, limit, max(1, window_ms // 1000)]


def bench_commands(sha, now_ms, limit):
    key = lambda p: p + ":__rand_int__"  # noqa: E731
    return [
        Command(
            "XCLOAK.ALLOW",
            "xcloak.allow",
            "xa",
            "xcloak",
            lambda p: ["XCLOAK.ALLOW", key(p), str(WINDOW_MS), str(limit)],
        ),
        # The same command on keys of the compact form (xcloaklog).
        Command(
            "XCLOAK.ALLOW compact",
            "xcloak.allow",
            "xc",
            "compact",
            lambda p: ["XCLOAK.ALLOW", key(p), str(WINDOW_MS), str(limit)],
        ),
        Command(
            "EVALSHA script",
            "evalsha",
            "sc",
            "script",
            lambda p: ["EVALSHA", sha, "1", key(p), str(now_ms), str(WINDOW_MS), str(limit)],
        ),
        # A new member (a 13-digit integer, as compact as ours) at the newest score.
        Command("ZADD", "zadd", "zz", "zadd", lambda p: ["ZADD", key(p), str(now_ms), "1__rand_int__"]),
        # redis-cell (GCRA): the peer a user would pick instead; limit per window.
        Command(
            "CL.THROTTLE",
            "cl.throttle",
            "cl",
            "cell",
            lambda p: ["CL.THROTTLE", key(p)] + [str(a) for a in cell_args(limit, WINDOW_MS)] + ["1"],
        ),
        Command("INCR", "incr", "in", None, lambda p: ["INCR", key(p)]),
    ]


def prefill_keys(server, prefix, layout, now_ms, prefill, limit=None, keys=KEYS):
    """`keys` keys named like redis-benchmark's (12-digit __rand_int__), each
    with `prefill` live entries in `layout`: "xcloak" (XCLOAK.ALLOW's sorted
    set), "compact" (the same entries, then XCLOAK.CONVERT key COMPACT),
    "script", "zadd", or "cell" (redis-cell's state after `prefill` units)."""
    server.storage(LAYOUT_FORM[layout])

    def commands():
        stamps = [now_ms - prefill + j for j in range(prefill)]
        for i in range(keys):
            key = "%s:%012d" % (prefix, i)
            if layout == "cell":
                yield encode("CL.THROTTLE", key, *cell_args(limit, WINDOW_MS), prefill)
                continue
            args = ["ZADD", key]
            for j, stamp in enumerate(stamps):
                if layout == "script":
                    args += [stamp, "%d-%d" % (stamp, j + 1)]
                else:
                    args += [stamp, stamp * 1000]
            yield encode(*args)
            if layout == "script":
                yield encode("SET", key + ":seq", prefill)
            if layout == "compact":
                yield encode("XCLOAK.CONVERT", key, "COMPACT")

    server.pipe(commands())
    server.expect_type("%s:%012d" % (prefix, 0), LAYOUT_TYPE[layout])


@dataclasses.dataclass(frozen=True)
class Run:
    """One redis-benchmark run: requests per second, latency (ms), usec_per_call
    of the command timed, and the server process's CPU usec per request."""

    rps: float
    p50: float
    p99: float
    usec: float
    process_usec: float


def redis_benchmark(server, argv, pipelined, requests, keys=KEYS):
    cmd = [
        *NICE,
        "redis-benchmark",
        "-p",
        str(server.port),
        "-c",
        str(CLIENTS),
        "-n",
        str(requests),
        "-r",
        str(keys),
        "--csv",
    ]
    if pipelined:
        cmd += ["-P", str(PIPELINE)]
    out = subprocess.run(cmd + argv, capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith('"') and not line.startswith('"test"')]
    values = rows[-1].split('","')
    return float(values[1]), float(values[4]), float(values[6].strip('"'))


def benchmark_once(server, command, argv, pipelined, requests, keys=KEYS):
    """One redis-benchmark run of `argv` after CONFIG RESETSTAT, timing
    `command.stat`: a Run."""
    server.reset_stats()
    cpu_before = server.cpu_seconds()
    rps, p50, p99 = redis_benchmark(server, argv, pipelined, requests, keys)
    process_usec = (server.cpu_seconds() - cpu_before) * 1e6 / requests
    calls, usec = server.stat(command.stat)
    if calls < requests:
        sys.exit("bench: %s: commandstats shows %d calls of %d" % (command.name, calls, requests))
    return Run(rps, p50, p99, usec, process_usec)


def steady_stream(key_prefix, keys, entries, step_ms, rounds, start_round, reject=False):
    """Round-robin XCLOAK.ALLOW over `keys` keys with window entries*step_ms and
    limit `entries`: from round `entries` on, each call trims the entry of
    round r - entries and adds one (or, with reject, finds the window full)."""
    window = entries * step_ms
    names = [("%s:%d" % (key_prefix, k)).encode() for k in range(keys)]
    head = b"*6\r\n$12\r\nXCLOAK.ALLOW\r\n"
    tail_window = b"$%d\r\n%d\r\n$%d\r\n%d\r\n$3\r\nNOW\r\n" % (len(str(window)), window, len(str(entries)), entries)
    for r in range(start_round, start_round + rounds):
        now = BASE_MS + (start_round - 1 if reject else r) * step_ms
        now_arg = b"$%d\r\n%d\r\n" % (len(str(now)), now)
        for name in names:
            yield head + b"$%d\r\n%s\r\n" % (len(name), name) + tail_window + now_arg


def measure_stream(server, make, expect_calls, stat="xcloak.allow"):
    """usec_per_call of `stat` over the stream `make()`, fed with --pipe."""
    server.reset_stats()
    server.pipe(make())
    calls, usec = server.stat(stat)
    assert calls == expect_calls, (calls, expect_calls)
    return usec


def allow_cmd(key, window, limit, now):
    return encode("XCLOAK.ALLOW", key, window, limit, "NOW", now)
