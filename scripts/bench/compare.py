#!/usr/bin/env python3
"""Compares builds of the module in wall-clock time, interleaved on fresh servers.

Usage: python3 -m scripts.bench.compare A.so B.so [...]   (ROUNDS=n, default 3)
       python3 -m scripts.bench.compare --instructions A.so B.so   (callgrind: repeatable, needs valgrind)
       python3 -m scripts.bench.compare --zset-only A.so B.so   (builds from before the compact form)
       python3 -m scripts.bench.compare --paired A.so B.so   (the main workload and the stream measures,
                                                              every server up at once, slices taking
                                                              turns: SLICES=41, MAIN_SLICES=15)

Each round starts one fresh server per build, in turn (the order rotating),
loaded with `STORAGE compact`, and measures on it, as `usec_per_call` from
INFO commandstats:

- the first workload of `make bench` (workloads.MAIN: 10,000 keys
  prefilled with 5 entries, limit 10, 100,000 pipelined requests, about half
  admitted) for XCLOAK.ALLOW on compact keys and on sorted sets, the article's
  script and a bare ZADD;
- compact windows held at 10, 1,000 and 100,000 live entries by streams with
  NOW (the entries-per-key section's streams, one entry per second, 2 keys):
  admissions alone (each trims one entry and adds one) and rejections alone,
  measured separately;
- XCLOAK.REFUND of the newest entry of a compact window of 100,000 entries
  (skipped for builds without REFUND).

It prints every round, then per measure each build's median and the median
of the per-round ratios against the first build (B / A: below 1 is faster).
Beside usec_per_call (wall time inside the command, which grows when the
server is preempted) it reports the server process's CPU time per call
(INFO cpu), which does not.

`--instructions` runs each build once under `valgrind --tool=callgrind` and
counts the instructions of the command handler per call for the same
measures (smaller: 2,000 keys, 20,000 requests, 4,000 stream calls, 20
refunds; the stream measures on sorted sets too, at 10 and 1,000
entries), and for XCLOAK.ALLOW those of `window::decide` (the trim, the
counts and the record: the storage's part). The handler's count still varies
by a few percent from run to run (the expiry is re-armed, and replicated,
every 500 ms of wall time, and valgrind is slow); `decide`'s does not.
The builds take turns, so a burst of load on a shared machine falls on all of
them alike; keep a copy of the current build (cp target/release/libxcloak.so
/tmp/base.so) before building the change to compare. `--paired` runs the
main workload on compact keys and the stream measures, with one server per
build up at once: the builds take turns (the order alternating) at each slice,
a whole main workload on freshly prefilled keys, or 20,000 calls of a stream
at one size and way. Each ratio compares two measures a second or a few
milliseconds apart, so the machine's drift between rounds cancels; it prints
the median and quartiles of the per-slice ratios (a build against itself reads
1.00x). `--zset-only` measures
only the sorted-set rows of the first workload, on servers loaded without
`STORAGE`, for builds that have no compact form.
"""

import dataclasses
import os
import shutil
import statistics
import sys
import tempfile

from . import callgrind, deps
from .resp import encode
from .server import Server
from .workloads import (
    BASE_MS,
    LABEL,
    MAIN,
    allow_cmd,
    bench_commands,
    benchmark_once,
    measure_stream,
    prefill_keys,
    redis_benchmark,
    steady_stream,
)

STREAM_SIZES = (10, 1_000, 100_000)
ZSET_STREAM_SIZES = (10, 1_000)  # under --instructions only
STREAM_KEYS = 2
STREAM_CALLS = 50_000  # per key and measure (100,000 calls: a preemption of a few ms moves the mean little)
REFUND_CALLS = 1_000
# The window decision's symbol: in the pure core crate since 5994300, in the
# module crate before it (a build from before the split is still comparable).
DECIDE = ("xcloak_core::window::decide", "xcloak::window::decide")


class Probe:
    """How a measure is read: usec_per_call and process CPU per call, or
    (under callgrind) instructions per call."""

    def __init__(self, server, callgrind_dir=None):
        self.server, self.callgrind_dir, self.dumps = server, callgrind_dir, 0

    def run(self, stat, calls, send, handler="RedisModuleCommandDispatcher"):
        """Runs `send()` and returns {"usec": .., "cpu": ..} or {"instructions": ..}
        (inclusive, of the function `handler`) per call of `stat`."""
        server = self.server
        server.reset_stats()
        if self.callgrind_dir:
            self.dumps += 1
            dump = callgrind.phase(server, self.callgrind_dir, send, "m%d" % self.dumps)
            got, _ = server.stat(stat)
            assert got == calls, (stat, got, calls)
            out = {"instructions": callgrind.inclusive(dump, handler) / calls}
            if stat == "xcloak.allow":
                # The decision over the log (trim, counts, record): the code a
                # layout changes, and the part that does not vary with the
                # wall clock (replication and the expiry's re-arm, every
                # 500 ms of it, are in the handler's count).
                out["decide"] = callgrind.inclusive_any(dump, DECIDE) / calls
            return out
        cpu = server.cpu_seconds()
        send()
        cpu = server.cpu_seconds() - cpu
        got, usec = server.stat(stat)
        assert got == calls, (stat, got, calls)
        return {"usec": usec, "cpu": cpu * 1e6 / calls}


def streams(probe, out, calls, form="compact", sizes=STREAM_SIZES):
    """Admissions and rejections on windows of `form` held at `sizes` entries."""
    server = probe.server
    server.storage(form)
    for size in sizes:
        prefix = "%s%d" % (form[:3], size)
        server.pipe(steady_stream(prefix, STREAM_KEYS, size, 1000, size, 0))
        server.expect_type(prefix + ":0", "xcloaklog" if form == "compact" else "zset")
        n = STREAM_KEYS * calls
        out["%s %s entries: admission" % (form, "{:,}".format(size))] = probe.run(
            "xcloak.allow", n, lambda: server.pipe(steady_stream(prefix, STREAM_KEYS, size, 1000, calls, size))
        )
        out["%s %s entries: rejection" % (form, "{:,}".format(size))] = probe.run(
            "xcloak.allow",
            n,
            lambda: server.pipe(steady_stream(prefix, STREAM_KEYS, size, 1000, calls, size + calls, True)),
        )
        server.client.call("FLUSHALL")


def refunds(probe, out, calls):
    """REFUND of the newest entry, each right after the ALLOW it gives back
    (ced23cf's took about 2 ms a call)."""
    server = probe.server
    size = 100_000
    window, limit = 10**12, 1_000_000
    server.storage("compact")
    server.pipe(allow_cmd("cmpr", window, limit, BASE_MS + i * 1000) for i in range(size))
    last = BASE_MS + size * 1000

    def stream():
        for j in range(calls):
            yield allow_cmd("cmpr", window, limit, last + j)
            yield encode("XCLOAK.REFUND", "cmpr", last + j)

    try:
        out["compact 100,000 entries: REFUND of the newest"] = probe.run(
            "xcloak.refund", calls, lambda: server.pipe(stream())
        )
    except SystemExit:
        pass  # a build without XCLOAK.REFUND
    server.client.call("FLUSHALL")


class ZsetOnlyServer(Server):
    """A server loaded without STORAGE, for builds from before the compact form:
    picking a form is a no-op."""

    def storage(self, form):
        pass


def measure(module, zset_only, instructions=False):
    """Every measure on a fresh server running `module`: {label: {"usec", "cpu"}}
    or, with `instructions`, {label: {"instructions"}} under callgrind (2,000
    keys instead of 10,000)."""
    callgrind_dir = tempfile.mkdtemp(prefix="xcloak-compare-") if instructions else None
    wrapper = callgrind.wrapper(callgrind_dir) if instructions else ()
    kind = ZsetOnlyServer if zset_only else Server
    server = kind(module=module, storage=None if zset_only else "compact", wrapper=wrapper)
    probe = Probe(server, callgrind_dir)
    mix = dataclasses.replace(MAIN, keys=2_000) if instructions else MAIN
    try:
        sha = server.client.call("SCRIPT", "LOAD", deps.read(deps.ARTICLE))
        now_ms = int(server.client.call("TIME")[0]) * 1000
        names = ("XCLOAK.ALLOW", "EVALSHA script", "ZADD") + (() if zset_only else ("XCLOAK.ALLOW compact",))
        out = {}
        for command in bench_commands(sha, now_ms, mix.limit):
            if command.name not in names:
                continue
            prefill_keys(server, command.prefix, command.layout, now_ms, mix.prefill, keys=mix.keys)
            argv = command.argv(command.prefix)
            out["main workload: " + LABEL[command.name]] = probe.run(
                command.stat,
                mix.requests,
                lambda: redis_benchmark(server, argv, True, mix.requests, mix.keys),
                callgrind.HANDLERS[command.name],
            )
        server.client.call("FLUSHALL")
        if not zset_only:
            streams(probe, out, 2_000 if instructions else STREAM_CALLS)
            if instructions:
                # The same streams on sorted sets (the other storage form).
                streams(probe, out, 2_000, "zset", ZSET_STREAM_SIZES)
            refunds(probe, out, 20 if instructions else REFUND_CALLS)
        return out
    finally:
        server.stop()
        if callgrind_dir:
            shutil.rmtree(callgrind_dir, ignore_errors=True)


PAIRED_SLICES = int(os.environ.get("SLICES", "41"))
PAIRED_CALLS = 10_000  # per key and slice: 20,000 calls a measure


PAIRED_MAIN_SLICES = int(os.environ.get("MAIN_SLICES", "15"))


def paired_measures(modules, log=print):
    """Every build's server up at once, the builds taking turns slice by slice
    (the order alternating), so that each ratio compares two measures a few
    milliseconds apart and the machine's drift between rounds cancels:

    - the stream measures: each size and way cut into PAIRED_SLICES slices
      of PAIRED_CALLS calls per key;
    - the main workload on compact keys (workloads.MAIN: 10,000 keys
      prefilled with 5 entries, limit 10, 100,000 pipelined requests, about
      half admitted), run whole PAIRED_MAIN_SLICES times, each time on
      freshly prefilled keys.

    Returns {label: [usec_per_call per slice, per build]} (lists of equal
    length), and logs one line per measure (`log`: print, or None)."""
    servers, out = [], {}
    names = [os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(m)))) or m for m in modules]

    def report(label, columns):
        out[label] = columns
        if log:
            ratios = []
            for i in range(1, len(modules)):
                per = sorted(b / a for a, b in zip(columns[0], columns[i]))
                ratios.append(
                    "[%d] / [0] %.3fx (quartiles %.2f-%.2f)"
                    % (i, statistics.median(per), per[len(per) // 4], per[3 * len(per) // 4])
                )
            log(
                "  %-40s %s   %s"
                % (label, "  ".join("%6.3f" % statistics.median(c) for c in columns), "; ".join(ratios))
            )

    try:
        for module in modules:
            servers.append(Server(module=module, storage="compact"))
        if log:
            log(
                "paired slices (%d of %d calls each way and size; the main workload %d times), usec_per_call: "
                "median per build, and the median of the per-slice ratios against [0] %s"
                % (PAIRED_SLICES, STREAM_KEYS * PAIRED_CALLS, PAIRED_MAIN_SLICES, names[0])
            )
        if PAIRED_MAIN_SLICES:
            columns = [[] for _ in modules]
            for slice_ in range(PAIRED_MAIN_SLICES):
                for i in list(range(len(modules)))[:: -1 if slice_ % 2 else 1]:
                    server = servers[i]
                    server.client.call("FLUSHALL")
                    now_ms = int(server.client.call("TIME")[0]) * 1000
                    command = next(
                        c for c in bench_commands("", now_ms, MAIN.limit) if c.name == "XCLOAK.ALLOW compact"
                    )
                    prefill_keys(server, command.prefix, command.layout, now_ms, MAIN.prefill)
                    columns[i].append(
                        benchmark_once(server, command, command.argv(command.prefix), True, MAIN.requests).usec
                    )
            for server in servers:
                server.client.call("FLUSHALL")
            report("main workload: XCLOAK.ALLOW (compact)", columns)
        for server in servers:
            for size in STREAM_SIZES:
                server.pipe(steady_stream("p%d" % size, STREAM_KEYS, size, 1000, size, 0))
                server.expect_type("p%d:0" % size, "xcloaklog")
        n = STREAM_KEYS * PAIRED_CALLS
        for size in STREAM_SIZES:
            prefix = "p%d" % size
            usec = {way: [[] for _ in modules] for way in ("admission", "rejection")}
            for slice_ in range(PAIRED_SLICES):
                start = size + slice_ * PAIRED_CALLS
                order = list(range(len(modules)))[:: -1 if slice_ % 2 else 1]
                streams = {
                    "admission": lambda: steady_stream(prefix, STREAM_KEYS, size, 1000, PAIRED_CALLS, start),
                    # At the time of the slice's newest admission: the window is full.
                    "rejection": lambda: steady_stream(
                        prefix, STREAM_KEYS, size, 1000, PAIRED_CALLS, start + PAIRED_CALLS, True
                    ),
                }
                for way, make in streams.items():
                    for i in order:
                        usec[way][i].append(measure_stream(servers[i], make, n))
            for way, columns in usec.items():
                report("compact %s entries: %s" % ("{:,}".format(size), way), columns)
        return out
    finally:
        for server in servers:
            server.stop()


def main():
    args = sys.argv[1:]
    zset_only, instructions = "--zset-only" in args, "--instructions" in args
    modules = [a for a in args if not a.startswith("--")]
    if len(modules) < 2 or any(not os.path.exists(m) for m in modules):
        sys.exit(__doc__)
    if "--paired" in args:
        paired_measures(modules, log=lambda line: print(line, flush=True))
        return
    rounds = 1 if instructions else int(os.environ.get("ROUNDS", "3"))
    runs = {m: [] for m in modules}
    for round_ in range(rounds):
        for module in modules[round_ % len(modules) :] + modules[: round_ % len(modules)]:
            out = measure(module, zset_only, instructions)
            runs[module].append(out)
            print("round %d  %s" % (round_ + 1, os.path.basename(module)), flush=True)
            for label, values in out.items():
                print("    %-55s %s" % (label, ", ".join("%s %.2f" % kv for kv in values.items())), flush=True)
    print()
    base = modules[0]
    labels = [label for label in runs[base][0] if all(label in r for m in modules for r in runs[m])]
    names = [os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(m)))) or m for m in modules]
    metrics = []
    for label in labels:
        metrics += [m for m in runs[base][0][label] if m not in metrics]
    for metric in metrics:
        print("%s per call, median: %s" % (metric, "  ".join("[%d] %s" % (i, n) for i, n in enumerate(names))))
        for label in labels:
            if not all(metric in r[label] for m in modules for r in runs[m]):
                continue
            medians = [statistics.median(r[label][metric] for r in runs[m]) for m in modules]
            ratios = []
            for i, m in enumerate(modules[1:], 1):
                per_round = [b[label][metric] / a[label][metric] for a, b in zip(runs[base], runs[m])]
                ratios.append(
                    "[%d] / [0] %.3fx (rounds %s)"
                    % (i, statistics.median(per_round), ", ".join("%.2f" % r for r in per_round))
                )
            print("  %-55s %s   %s" % (label, "  ".join("%10.2f" % v for v in medians), "; ".join(ratios)))
        print()


if __name__ == "__main__":
    main()
