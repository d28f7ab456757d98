#!/usr/bin/env python3
"""Instructions per call (valgrind --tool=callgrind), the repeatable companion
of `make bench` on a noisy machine: the same commands, prefill and mix of
admissions and rejections as section 1 of scripts/bench.py, on a server running under callgrind.

Usage: python3 scripts/callgrind.py [requests-per-command] [--larger|--attack] [--only NAME,...]
                                    [--cache-sim] [--keep]   (needs valgrind)

--cache-sim also counts simulated first-level and last-level cache misses per
call; --keep keeps the dumps for callgrind_annotate.

Every row of bench.py's first table: XCLOAK.ALLOW on sorted sets and on
compact keys (the server is loaded with STORAGE compact, as in `make bench`),
the article's script, ZADD, redis-cell's CL.THROTTLE and INCR.

Keys: requests / calls-per-key of bench.py's MAIN (or LARGER) setting, so each
key gets as many calls as there, with the same prefill and limit. For each command it zeroes the counters, runs redis-benchmark (-c 50 -P 16
-r 10000), dumps, and divides the inclusive instructions of the command's
handler (the code `usec_per_call` times) by the number of calls. It also
prints the costliest functions under XCLOAK.ALLOW's handler.
"""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

HANDLERS = {
    "XCLOAK.ALLOW": "RedisModuleCommandDispatcher",
    "XCLOAK.ALLOW compact": "RedisModuleCommandDispatcher",
    "EVALSHA script": "evalShaCommand",
    "ZADD": "zaddCommand",
    "CL.THROTTLE": "RedisModuleCommandDispatcher",  # redis-cell's handler, a module command too
    "INCR": "incrCommand",
}


def inclusive_events(dump, function, events):
    """Inclusive counts of `events` (e.g. D1mr,DLmr) of `function` in a dump."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--show=" + ",".join(events), dump],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        head, _, name = line.rpartition("???:")
        if name.split()[:1] == [function]:
            numbers = re.sub(r"\([^)]*\)", " ", head).split()
            return [int(n.replace(",", "")) for n in numbers[:len(events)]]
    return [0] * len(events)


def inclusive(dump, function):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\(.*?\)\s+\?\?\?:(\S+)", line)
        if match and match.group(2) == function:
            return int(match.group(1).replace(",", ""))
    return 0


def phase(server, workdir, send, tag):
    """Zeroes the counters of `server` (running under callgrind with its
    dumps in `workdir`), runs `send()`, dumps, and returns the new dump's path
    (callgrind writes it asynchronously: this waits for the file)."""
    pid = str(server.proc.pid)
    before = len([f for f in os.listdir(workdir) if f.startswith("cg.out.")])
    subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
    send()
    subprocess.run(["callgrind_control", "-d", tag, pid], capture_output=True, check=True)
    deadline = time.time() + 120
    while True:
        dumps = [f for f in os.listdir(workdir) if f.startswith("cg.out.")]
        if len(dumps) > before or time.time() > deadline:
            break
        time.sleep(0.2)
    time.sleep(1)
    return os.path.join(workdir, max(dumps, key=lambda f: int(f.rsplit(".", 1)[1])))


def breakdown(dump, calls, top=25):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--tree=calling", "--threshold=100", dump],
                         capture_output=True, text=True).stdout
    lines, inside = [], False
    for line in out.splitlines():
        if re.search(r"\*\s+\?\?\?:xcloak::commands::execute", line):
            inside = True
            continue
        if inside:
            if not line.strip():
                break
            match = re.match(r"\s*([\d,]+)\s+\(.*?\)\s+>\s+(\S+)", line)
            if match:
                lines.append((int(match.group(1).replace(",", "")) / calls, match.group(2)))
    return lines[:top]


def main():
    config = bench.LARGER if "--larger" in sys.argv else bench.ATTACK if "--attack" in sys.argv else bench.MAIN
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    requests = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20_000
    # Fewer keys than bench.py (the prefill is slow under valgrind), the same
    # calls per key (so the same share of rejections) and the same set sizes.
    bench.KEYS = requests // config["calls"]
    workdir = bench.tempfile.mkdtemp(prefix="xcloak-callgrind-")
    cache_sim = "--cache-sim" in sys.argv
    wrapper = ["valgrind", "--tool=callgrind", "--callgrind-out-file=%s/cg.out" % workdir]
    if cache_sim:
        wrapper.append("--cache-sim=yes")
    server = bench.Server(wrapper=wrapper)
    pid = server.proc.pid
    try:
        sha = server.client.call("SCRIPT", "LOAD", open(bench.ARTICLE).read())
        now_ms = int(server.client.call("TIME")[0]) * 1000
        results = {}
        for name, stat, prefix, layout, argv in bench.bench_commands(sha, now_ms, config["limit"]):
            if only and name not in only:
                continue
            argv = argv(prefix)
            if layout:
                bench.prefill_keys(server, prefix, layout, now_ms, config["prefill"], config["limit"])
            else:
                server.storage("zset")
            server.client.call("CONFIG", "RESETSTAT")
            tag = name.replace(" ", "_").replace(".", "_")
            dump = phase(server, workdir, lambda: bench.redis_benchmark(server, argv, True, requests), tag)
            calls, _ = server.stat(stat)
            results[name] = (inclusive(dump, HANDLERS[name]) / calls, calls, dump)
            print("%-15s %8.0f instructions/call (%d calls, %s)" % (name, results[name][0], calls, HANDLERS[name]), flush=True)
            if cache_sim:
                events = ["D1mr", "D1mw", "DLmr", "DLmw", "I1mr"]
                counts = inclusive_events(dump, HANDLERS[name], events)
                print("%-15s %s per call" % ("", ", ".join("%s %.1f" % (e, c / calls) for e, c in zip(events, counts))),
                      flush=True)
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
            print("under %s's handler (%s), instructions per call:" % (allow, bench.LABEL[allow]))
            for cost, function in breakdown(results[allow][2], results[allow][1]):
                print("  %8.0f  %s" % (cost, function))
    if "--keep" in sys.argv:
        print("\ndumps kept in %s (callgrind_annotate --inclusive=yes --tree=calling FILE)" % workdir)
    else:
        bench.shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
