"""Instructions per call (valgrind --tool=callgrind), the repeatable companion
of `make bench` on a noisy machine: the same commands, prefill and mix of
admissions and rejections as the commands section, on a server under callgrind.

Usage: python3 -m scripts.bench.callgrind_commands [requests-per-command] [--larger|--attack]
           [--only NAME,...] [--cache-sim] [--keep]   (needs valgrind)

--cache-sim also counts simulated first-level and last-level cache misses per
call; --keep keeps the dumps for callgrind_annotate. Every row of the commands
table: XCLOAK.ALLOW on sorted sets and on compact keys (the server loaded with
STORAGE compact, as in `make bench`), the article's script, ZADD, redis-cell's
CL.THROTTLE and INCR. Keys: requests / calls-per-key of the mix, so each key
gets as many calls as in `make bench`, with the same prefill and limit. For
each command it zeroes the counters, runs redis-benchmark (-c 50 -P 16),
dumps, and divides the inclusive instructions of the command's handler (the
code `usec_per_call` times) by the calls. It also prints the costliest
functions under XCLOAK.ALLOW's handler.
"""

import dataclasses
import shutil
import sys
import tempfile

from . import callgrind, deps
from .server import Server
from .workloads import ATTACK, LABEL, LARGER, MAIN, bench_commands, prefill_keys, redis_benchmark


def main(args):
    mix = LARGER if "--larger" in args else ATTACK if "--attack" in args else MAIN
    only = args[args.index("--only") + 1].split(",") if "--only" in args else None
    requests = int(args[0]) if args and args[0].isdigit() else 20_000
    # Fewer keys than make bench (the prefill is slow under valgrind), the same
    # calls per key (so the same share of rejections) and the same set sizes.
    mix = dataclasses.replace(mix, keys=requests // mix.calls)
    workdir = tempfile.mkdtemp(prefix="xcloak-callgrind-")
    cache_sim = "--cache-sim" in args
    server = Server(
        module=deps.MODULE, extra_modules=[deps.cell_module()], wrapper=callgrind.wrapper(workdir, cache_sim=cache_sim)
    )
    results = {}
    try:
        sha = server.client.call("SCRIPT", "LOAD", deps.read(deps.ARTICLE))
        now_ms = int(server.client.call("TIME")[0]) * 1000
        for command in bench_commands(sha, now_ms, mix.limit):
            if only and command.name not in only:
                continue
            argv = command.argv(command.prefix)
            if command.layout:
                prefill_keys(server, command.prefix, command.layout, now_ms, mix.prefill, mix.limit, mix.keys)
            else:
                server.storage("zset")
            server.reset_stats()
            tag = command.name.replace(" ", "_").replace(".", "_")
            dump = callgrind.phase(
                server, workdir, lambda: redis_benchmark(server, argv, True, requests, mix.keys), tag
            )
            calls, _ = server.stat(command.stat)
            handler = callgrind.HANDLERS[command.name]
            results[command.name] = (callgrind.inclusive(dump, handler) / calls, calls, dump)
            print(
                "%-20s %8.0f instructions/call (%d calls, %s)"
                % (command.name, results[command.name][0], calls, handler),
                flush=True,
            )
            if cache_sim:
                events = ["D1mr", "D1mw", "DLmr", "DLmw", "I1mr"]
                counts = callgrind.inclusive_events(dump, handler, events)
                print(
                    "%-20s %s per call" % ("", ", ".join("%s %.1f" % (e, c / calls) for e, c in zip(events, counts))),
                    flush=True,
                )
    finally:
        server.stop()
    print()
    per_call = {name: result[0] for name, result in results.items()}

    def ratio(a, b):
        if a in per_call and b in per_call:
            print("%-40s %.2fx" % ("%s / %s" % (a, b), per_call[a] / per_call[b]))

    for allow in ("XCLOAK.ALLOW", "XCLOAK.ALLOW compact"):
        ratio("EVALSHA script", allow)
        ratio(allow, "ZADD")
        ratio("CL.THROTTLE", allow)
        ratio(allow, "INCR")
    for allow in ("XCLOAK.ALLOW", "XCLOAK.ALLOW compact"):
        if allow in results:
            print()
            print("under %s's handler (%s), instructions per call:" % (allow, LABEL[allow]))
            for cost, function in callgrind.breakdown(results[allow][2], results[allow][1]):
                print("  %8.0f  %s" % (cost, function))
    if "--keep" in args:
        print("\ndumps kept in %s (callgrind_annotate --inclusive=yes --tree=calling FILE)" % workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
