"""Instruction counts under valgrind --tool=callgrind: the repeatable measure on
a noisy machine. A server started with `wrapper(dir)` writes its dumps into
`dir`; `phase` zeroes the counters, runs a workload and dumps; `inclusive`
reads a function's inclusive count from a dump. Imports nothing of the package."""

import os
import re
import subprocess
import time

# The function each row's command runs in (the code usec_per_call times).
HANDLERS = {
    "XCLOAK.ALLOW": "RedisModuleCommandDispatcher",
    "XCLOAK.ALLOW compact": "RedisModuleCommandDispatcher",
    "EVALSHA script": "evalShaCommand",
    "ZADD": "zaddCommand",
    "CL.THROTTLE": "RedisModuleCommandDispatcher",  # redis-cell's handler, a module command too
    "INCR": "incrCommand",
}


def wrapper(workdir, cache_sim=False, branch_sim=False):
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=%s/cg.out" % workdir]
    if cache_sim:
        command.append("--cache-sim=yes")
    if branch_sim:
        command.append("--branch-sim=yes")
    return command


def inclusive_events(dump, function, events):
    """Inclusive counts of `events` (e.g. D1mr,DLmr) of `function` in a dump."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--show=" + ",".join(events), dump],
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        head, _, name = line.rpartition("???:")
        if name.split()[:1] == [function]:
            numbers = re.sub(r"\([^)]*\)", " ", head).split()
            return [int(n.replace(",", "")) for n in numbers[: len(events)]]
    return [0] * len(events)


def inclusive(dump, function):
    """Inclusive instructions of `function` in a dump (0: not found)."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\(.*?\)\s+\S*?:(\S+)", line)
        if match and match.group(2) == function:
            return int(match.group(1).replace(",", ""))
    return 0


def inclusive_any(dump, functions):
    """Inclusive instructions of the first of `functions` found in a dump (a
    symbol that moved between crates: each build names it once)."""
    for function in functions:
        count = inclusive(dump, function)
        if count:
            return count
    return 0


def phase(server, workdir, send, tag):
    """Zeroes the counters of `server` (running under callgrind with its dumps
    in `workdir`), runs `send()`, dumps, and returns the new dump's path
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
    """The costliest functions under xcloak's execute, per call."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--tree=calling", "--threshold=100", dump],
        capture_output=True,
        text=True,
    ).stdout
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
