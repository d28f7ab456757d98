#!/usr/bin/env python3
"""`make bench`: XCLOAK.ALLOW (sorted-set and compact forms) against the
article's script, a bare ZADD, redis-cell's CL.THROTTLE and INCR.

One run, one freshly started server (a free loopback port, the module from
target/release loaded with `STORAGE compact`, and redis-cell 0.2.2 built from
crates.io by scripts/fetch-redis-cell.sh into ~/.cache/xcloak-bench), the
same keyspace and pipelining for every command. `CONFIG SET xcloak.storage
zset|compact` before a command's keys are created picks their form; TYPE on
sample keys checks it. Prints the tables, the targets with PASS/FAIL, writes
docs/performance.md and draws docs/performance-memory.png (scripts/chart.py,
with a pinned matplotlib in a venv under ~/.cache/xcloak-bench).

Sections (each on the same server, FLUSHALL between them):
  1. redis-benchmark, pipelined (-P 16 -c 50) and unpipelined (-c 50), random
     keys (-r), windows prefilled to the same size: rps, server CPU per call
     (INFO commandstats usec_per_call after CONFIG RESETSTAT), p50/p99; then
     larger windows (1b), and an attack mix, one call in ten admitted (1c);
     then tiers (1d): one 2-tier XCLOAK.ALLOW against two separate calls on
     two keys, CPU per request and memory per identity, on both forms.
  2. Entries per key (sorted sets 10 .. 10,000; compact keys 10 .. 1,000,000)
     and 3. keys in the keyspace (1 .. 1,000,000):
     deterministic command streams with NOW, fed with `redis-cli --pipe`, in
     which every admission trims exactly one entry and adds one, so the work
     per call is the same at every size; only the size changes.
  4. 1,000,000 distinct keys (one per client address): used_memory, and all
     of it returned once the window passes.
  5. Memory per tracked request (MEMORY USAGE), both forms and the script's layout.
  6. Memory per identity (window 60 s filled to its limit, limits 10 .. 10,000):
     the script, both forms, redis-cell (MEMORY USAGE).
  7. Memory per identity as the server pays it: the used_memory delta over
     10,000 identities at limits 10, 100, 1,000 (issue 25's targets); drawn.
  8. 1,000,000 identities at limit 10: used_memory of each layout.
  9. XCLOAK.REFUND's cost on windows of 10 .. 1,000,000 entries, both forms:
     of the newest entry and of a middle stamp; drawn.
  10. This build against a baseline build (BENCH_BASELINE, default ced23cf,
     0.1.0's compact encoding), with scripts/compare.py's measures.

Environment: XCLOAK_SERVER (server binary, default redis-server),
XCLOAK_MODULE (default target/release/libxcloak.so), XCLOAK_CELL_MODULE
(a redis-cell build instead of the cached one), BENCH_BASELINE (a commit,
built into the bench cache) or XCLOAK_BASELINE_MODULE (a build) for section
10, BENCH_QUICK=1 (smaller runs, for trying the script out; the numbers in
docs/ come from a full run). `python3 scripts/bench.py memory [--attack]`
runs sections 7 (and 8) alone, `memory --refund` section 9, `memory
--entries` the compact rows of section 2; docs are left as they are.
`python3 scripts/bench.py tiers` runs section 1d alone and prints its table
(docs/performance.md is left as it is).
"""

import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.environ.get("XCLOAK_SERVER", "redis-server")
MODULE = os.environ.get("XCLOAK_MODULE", os.path.join(ROOT, "target/release/libxcloak.so"))
QUICK = os.environ.get("BENCH_QUICK") == "1"
OUT = os.path.join(ROOT, "docs/performance.md")
BEGIN, END = "<!-- bench:begin (scripts/bench.py rewrites this part) -->", "<!-- bench:end -->"


def _nice_prefix():
    """Server and redis-benchmark run at nice -10 when allowed (root or
    CAP_SYS_NICE): on a shared machine other processes then preempt them less,
    which is what makes wall-clock usec_per_call noisy. Same for every command."""
    try:
        ok = subprocess.run(["nice", "-n", "-10", "true"], capture_output=True).returncode == 0
        probe = subprocess.run(["nice", "-n", "-10", "nice"], capture_output=True, text=True).stdout.strip()
        return ["nice", "-n", "-10"] if ok and probe.lstrip("-").isdigit() and int(probe) < 0 else []
    except OSError:
        return []


NICE = _nice_prefix()
ARTICLE = os.path.join(ROOT, "tests/oracle/article.lua")

# Section 1: KEYS random keys, each prefilled with `prefill` live entries, and
# `calls` calls per key on average: the limit lets about half of them in.
# MAIN is the article's limit of 10 (the targets are read from it); LARGER
# shows how the ratios move when every call works on a set of 50-60 entries.
KEYS = 10_000
WINDOW_MS = 3_600_000
MAIN = dict(prefill=5, limit=10, calls=10, rounds=1 if QUICK else 3, modes=(True, False))
LARGER = dict(prefill=50, limit=60, calls=20, rounds=1, modes=(True, False))
# A credential-stuffing attack: each address is already near its limit, so
# about one call in ten is admitted. Pipelined only; shown beside MAIN, whose
# even mix of admissions and rejections the targets are read from.
ATTACK = dict(prefill=9, limit=10, calls=10, rounds=1 if QUICK else 3, modes=(True,))
CLIENTS = 50
PIPELINE = 16


# --------------------------------------------------------------------------
# A minimal RESP client (the standard library only).

def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if not isinstance(arg, bytes):
            arg = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class Client:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def call(self, *args):
        self.sock.sendall(encode(*args))
        return self.read()

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("bad reply %r" % line)

    def info(self, section):
        fields = {}
        for line in self.call("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                name, value = line.split(":", 1)
                fields[name] = value
        return fields


# --------------------------------------------------------------------------
# The server under test.

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cell_module():
    """redis-cell 0.2.2 (CL.THROTTLE), built from crates.io into a cache outside
    the repository by scripts/fetch-redis-cell.sh (XCLOAK_CELL_MODULE: another build)."""
    path = os.environ.get("XCLOAK_CELL_MODULE")
    if path:
        return path
    out = subprocess.run([os.path.join(ROOT, "scripts/fetch-redis-cell.sh")], stdout=subprocess.PIPE, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        sys.exit("bench: could not build redis-cell (scripts/fetch-redis-cell.sh)")
    return out.stdout.strip().splitlines()[-1]


class Server:
    """One server with the module loaded with `STORAGE compact` (so both forms
    can be created: `CONFIG SET xcloak.storage zset|compact` picks the form of
    the keys created next) and, with `cell`, redis-cell beside it."""

    def __init__(self, wrapper=(), storage="compact", cell=True):
        self.dir = tempfile.mkdtemp(prefix="xcloak-bench-")
        self.port = free_port()
        self.log = os.path.join(self.dir, "server.log")
        modules = ["--loadmodule", os.path.abspath(MODULE)] + (["STORAGE", storage] if storage else [])
        if cell:
            modules += ["--loadmodule", cell_module()]
        self.proc = subprocess.Popen(
            [*NICE, *wrapper, SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "no", "--logfile", self.log, *modules],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                self.client = Client(self.port)
                self.client.call("PING")
                break
            except (OSError, RuntimeError):
                if self.proc.poll() is not None or time.time() > deadline:
                    sys.exit("bench: the server did not start; its log:\n" + open(self.log).read())
                time.sleep(0.05)

    def stop(self):
        try:
            self.client.call("SHUTDOWN", "NOSAVE")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def pipe(self, commands):
        """Sends an iterable of encoded commands with `redis-cli --pipe`."""
        proc = subprocess.Popen(["redis-cli", "-p", str(self.port), "--pipe"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        # Its output is read as it comes: redis-cli prints every error reply,
        # and a full pipe would stop it reading what is sent.
        chunks = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(65536), b"")))
        reader.start()
        batch = []
        for command in commands:
            batch.append(command)
            if len(batch) >= 20_000:
                proc.stdin.write(b"".join(batch))
                batch = []
        proc.stdin.write(b"".join(batch))
        proc.stdin.close()
        reader.join()
        output = b"".join(chunks).decode(errors="replace")
        proc.wait()
        match = re.search(r"errors: (\d+), replies: (\d+)", output)
        if proc.returncode != 0 or not match or match.group(1) != "0":
            sys.exit("bench: redis-cli --pipe failed: " + output)

    def stat(self, command):
        """(calls, usec per call) of `command` since the last CONFIG RESETSTAT,
        from the total `usec` (`usec_per_call` has two decimals: too coarse for
        a ratio of short measures)."""
        line = self.client.info("commandstats").get("cmdstat_" + command.lower(), "")
        fields = dict(part.split("=") for part in line.split(",") if "=" in part)
        calls = int(fields.get("calls", 0))
        return calls, int(fields["usec"]) / calls if calls else float("nan")

    def storage(self, form):
        """The form of the windows that calls create from now on."""
        self.client.call("CONFIG", "SET", "xcloak.storage", form)

    def expect_type(self, key, expected):
        """Checks that a sample key really is in the intended form."""
        found = self.client.call("TYPE", key)
        if found != expected:
            sys.exit("bench: %s is a %s, expected %s" % (key, found, expected))

    def entries(self, key, window, now=None):
        """Live entries of a window in either form: XCLOAK.PEEK with the largest
        limit (count = limit - remaining)."""
        top = 1_000_000
        reply = self.client.call("XCLOAK.PEEK", key, window, top, *(("NOW", now) if now is not None else ()))
        return top - reply[2]

    def cpu_seconds(self):
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def used_memory(self):
        return int(self.client.info("memory")["used_memory"])


# --------------------------------------------------------------------------
# Section 1: the four commands under redis-benchmark.

# The form each layout's keys are created in, and the TYPE they must have.
LAYOUT_FORM = {"xcloak": "zset", "compact": "compact", "script": "zset", "zadd": "zset", "cell": "zset", None: "zset"}
LAYOUT_TYPE = {"xcloak": "zset", "compact": "xcloaklog", "script": "zset", "zadd": "zset", "cell": "string", None: "string"}


def cell_args(limit, window_ms):
    """CL.THROTTLE's parameters for `limit` per `window_ms`: a burst of `limit`
    (max_burst = limit - 1) refilled at `limit` per period (whole seconds)."""
    return [limit - 1, limit, max(1, window_ms // 1000)]


def prefill_keys(server, prefix, layout, now_ms, prefill, limit=None):
    """KEYS keys named like redis-benchmark's (12-digit __rand_int__), each with
    `prefill` live entries in `layout`: "xcloak" (XCLOAK.ALLOW's sorted set),
    "compact" (the same entries, then XCLOAK.CONVERT key COMPACT), "script",
    "zadd", or "cell" (redis-cell's state after `prefill` admitted units)."""
    server.storage(LAYOUT_FORM[layout])

    def commands():
        stamps = [now_ms - prefill + j for j in range(prefill)]
        for i in range(KEYS):
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


def redis_benchmark(server, argv, pipelined, requests):
    cmd = [*NICE, "redis-benchmark", "-p", str(server.port), "-c", str(CLIENTS), "-n", str(requests),
           "-r", str(KEYS), "--csv"]
    if pipelined:
        cmd += ["-P", str(PIPELINE)]
    out = subprocess.run(cmd + argv, capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith('"') and not line.startswith('"test"')]
    values = rows[-1].split('","')
    rps, p50, p99 = float(values[1]), float(values[4]), float(values[6].strip('"'))
    return rps, p50, p99


def benchmark_once(server, name, stat, argv, pipelined, requests):
    """One redis-benchmark run of `argv` after CONFIG RESETSTAT: (rps, p50, p99,
    usec_per_call of `stat`, server process CPU usec per request)."""
    server.client.call("CONFIG", "RESETSTAT")
    cpu_before = server.cpu_seconds()
    rps, p50, p99 = redis_benchmark(server, argv, pipelined, requests)
    process_usec = (server.cpu_seconds() - cpu_before) * 1e6 / requests
    calls, usec = server.stat(stat)
    if calls < requests:
        sys.exit("bench: %s: commandstats shows %d calls of %d" % (name, calls, requests))
    return rps, p50, p99, usec, process_usec


def mean_card(server, prefix, layout, sample=200):
    """Mean live entries per key over a sample of the keys (None: no entries to count)."""
    if layout in (None, "cell"):
        return None
    total = 0
    for i in range(0, KEYS, KEYS // sample):
        key = "%s:%012d" % (prefix, i)
        total += server.entries(key, WINDOW_MS) if layout == "compact" else server.client.call("ZCARD", key)
    return total / len(range(0, KEYS, KEYS // sample))


# Rows of the tables, in order: the internal name and the label shown.
ROWS = ["XCLOAK.ALLOW", "XCLOAK.ALLOW compact", "EVALSHA script", "ZADD", "CL.THROTTLE", "INCR"]
LABEL = {"XCLOAK.ALLOW": "XCLOAK.ALLOW (sorted set)", "XCLOAK.ALLOW compact": "XCLOAK.ALLOW (compact)",
         "EVALSHA script": "EVALSHA script", "ZADD": "ZADD", "CL.THROTTLE": "redis-cell CL.THROTTLE",
         "INCR": "INCR"}


def bench_commands(sha, now_ms, limit):
    """(name in the tables, commandstats name, key prefix, prefill layout, argv(prefix))."""
    return [
        # name in the tables, stat name, prefix, layout, argv
        ("XCLOAK.ALLOW", "xcloak.allow", "xa", "xcloak",
         lambda p: ["XCLOAK.ALLOW", p + ":__rand_int__", str(WINDOW_MS), str(limit)]),
        # The same command on keys of the compact form (xcloaklog).
        ("XCLOAK.ALLOW compact", "xcloak.allow", "xc", "compact",
         lambda p: ["XCLOAK.ALLOW", p + ":__rand_int__", str(WINDOW_MS), str(limit)]),
        ("EVALSHA script", "evalsha", "sc", "script",
         lambda p: ["EVALSHA", sha, "1", p + ":__rand_int__", str(now_ms), str(WINDOW_MS), str(limit)]),
        # A new member (a 13-digit integer, as compact as ours) at the newest score.
        ("ZADD", "zadd", "zz", "zadd",
         lambda p: ["ZADD", p + ":__rand_int__", str(now_ms), "1__rand_int__"]),
        # redis-cell (GCRA): the peer a user would pick instead; limit per window.
        ("CL.THROTTLE", "cl.throttle", "cl", "cell",
         lambda p: ["CL.THROTTLE", p + ":__rand_int__"] + [str(a) for a in cell_args(limit, WINDOW_MS)] + ["1"]),
        ("INCR", "incr", "in", None,
         lambda p: ["INCR", p + ":__rand_int__"]),
    ]


def section_commands(server, sha, config, tag):
    now_ms = int(server.client.call("TIME")[0]) * 1000
    requests = KEYS * config["calls"]
    commands = bench_commands(sha, now_ms, config["limit"])
    results = {}  # (name, pipelined) -> list of (rps, usec, p50, p99, card_before, card_after, admitted)
    for round_ in range(config["rounds"]):
        for pipelined in config["modes"]:
            mode = "p" if pipelined else "u"
            # The order rotates from round to round: no command always runs
            # first after a FLUSHALL or right after another one.
            shift = round_ % len(commands)
            for name, stat, prefix, layout, argv in commands[shift:] + commands[:shift]:
                key_prefix = "%s%s%s%d" % (prefix, tag, mode, round_)
                if layout:
                    prefill_keys(server, key_prefix, layout, now_ms, config["prefill"], config["limit"])
                else:
                    server.storage(LAYOUT_FORM[layout])
                card_before = mean_card(server, key_prefix, layout)
                admitted_before = int(server.client.info("xcloak").get("xcloak_admitted", 0))
                rps, p50, p99, usec, process_usec = benchmark_once(server, name, stat, argv(key_prefix), pipelined, requests)
                card_after = mean_card(server, key_prefix, layout)
                admitted = int(server.client.info("xcloak").get("xcloak_admitted", 0)) - admitted_before
                # Each row ran on the intended form (a sample key; INCR's exist only once called).
                for i in (0, KEYS // 2, KEYS - 1):
                    if layout or server.client.call("EXISTS", "%s:%012d" % (key_prefix, i)):
                        server.expect_type("%s:%012d" % (key_prefix, i), LAYOUT_TYPE[layout])
                results.setdefault((name, pipelined), []).append(
                    (rps, usec, p50, p99, card_before, card_after, admitted / requests if stat == "xcloak.allow" else None,
                     process_usec))
                print("  round %d %-11s %-25s %9.0f rps %6.2f usec/call (process %5.2f)  p50 %.3f p99 %.3f ms" % (
                    round_ + 1, "pipelined" if pipelined else "unpipelined", LABEL[name], rps, usec, process_usec, p50, p99), flush=True)
        server.client.call("FLUSHALL")
    return {key: [statistics.median(column) if column[0] is not None else None for column in zip(*rows)]
            for key, rows in results.items()}


# --------------------------------------------------------------------------
# Section 1d: tiers. An API quota of 10 a second and 1,000 an hour, per identity.

TIER_SHORT = (1000, 10)
TIER_LONG = (3_600_000, 1000)
TIER_ROUNDS = 1 if QUICK else 3


def section_tiers(server):
    """Per form: CPU per request (pipelined, fresh random keys, about 10 calls
    per key within a few seconds, so the per-second tier rejects some) of one
    2-tier call against the two separate calls on two keys users make today
    (one redis-benchmark run each, their usec_per_call summed); then memory per
    identity once an hour's quota is used (1,000 admissions 100 ms apart)."""
    (short_ms, short_limit), (long_ms, long_limit) = TIER_SHORT, TIER_LONG
    requests = KEYS * 10
    results = {}
    for form, type_name in (("zset", "zset"), ("compact", "xcloaklog")):
        server.storage(form)
        tiered, separate = [], []
        for round_ in range(TIER_ROUNDS):
            prefix = "%s%d" % (form[0], round_)
            argv = ["XCLOAK.ALLOW", "t%s:__rand_int__" % prefix, str(short_ms), str(short_limit), "TIER", str(long_ms), str(long_limit)]
            tiered.append(benchmark_once(server, "2-tier", "xcloak.allow", argv, True, requests))
            both = [benchmark_once(server, "separate", "xcloak.allow",
                                   ["XCLOAK.ALLOW", "%s%s:__rand_int__" % (kind, prefix), str(window), str(limit)], True, requests)
                    for kind, (window, limit) in (("s", TIER_SHORT), ("h", TIER_LONG))]
            separate.append((both[0][3] + both[1][3], both[0][4] + both[1][4]))
            print("  %-7s round %d  2-tier %6.2f usec/request (process %5.2f); two calls %6.2f usec/request (process %5.2f)" % (
                form, round_ + 1, tiered[-1][3], tiered[-1][4], separate[-1][0], separate[-1][1]), flush=True)
            server.client.call("FLUSHALL")
        t0 = BASE_MS
        server.pipe(encode("XCLOAK.ALLOW", "mt", short_ms, short_limit, "TIER", long_ms, long_limit, "NOW", t0 + 100 * j)
                    for j in range(long_limit))
        server.pipe(encode("XCLOAK.ALLOW", key, window, limit, "NOW", t0 + 100 * j)
                    for j in range(long_limit) for key, (window, limit) in (("ms", TIER_SHORT), ("mh", TIER_LONG)))
        for key in ("mt", "ms", "mh"):
            server.expect_type(key, type_name)
        usage = lambda key: server.client.call("MEMORY", "USAGE", key, "SAMPLES", 0)  # noqa: E731
        held = lambda key, window: server.entries(key, window, t0 + 100 * (long_limit - 1))  # noqa: E731
        memory = (usage("mt"), usage("ms") + usage("mh"), held("mt", long_ms), held("ms", long_ms) + held("mh", long_ms))
        print("  %-7s memory per identity: 2-tier %d B (%d entries), two keys %d B (%d entries)" % (
            form, memory[0], memory[2], memory[1], memory[3]), flush=True)
        server.client.call("FLUSHALL")
        median = lambda rows, i: statistics.median(row[i] for row in rows)  # noqa: E731
        results[form] = dict(tiered=(median(tiered, 3), median(tiered, 4)), separate=(median(separate, 0), median(separate, 1)),
                             memory=memory)
    server.storage("compact")
    return dict(forms=results, requests=requests)


def tiers_table(w, tiers):
    (short_ms, short_limit), (long_ms, long_limit) = TIER_SHORT, TIER_LONG
    w("An API quota of %d a second and %d an hour per identity: one call with `TIER`, against the two "
      "calls on two keys users make today (a per-second key and a per-hour key). %d pipelined requests "
      "per run over %d fresh keys (`-P %d -c %d -r %d`), median of %d round(s), each form in turn; for the "
      "two calls, the CPU of both runs is added (one request = one call on each key). Memory: one identity "
      "after %d admissions 100 ms apart (`MEMORY USAGE`)." % (
          short_limit, long_limit, tiers["requests"], KEYS, PIPELINE, CLIENTS, KEYS, TIER_ROUNDS, long_limit))
    w("")
    w("```")
    w("redis-benchmark ... -P %d XCLOAK.ALLOW t:__rand_int__ %d %d TIER %d %d" % (PIPELINE, short_ms, short_limit, long_ms, long_limit))
    w("redis-benchmark ... -P %d XCLOAK.ALLOW s:__rand_int__ %d %d   (then h:__rand_int__ %d %d)" % (
        PIPELINE, short_ms, short_limit, long_ms, long_limit))
    w("```")
    w("")
    w("| form | calls | usec_per_call per request | server process CPU usec/request | memory per identity | entries |")
    w("|---|---|---|---|---|---|")
    for form, label in (("zset", "sorted set"), ("compact", "compact")):
        r = tiers["forms"][form]
        t, s, m = r["tiered"], r["separate"], r["memory"]
        w("| %s | XCLOAK.ALLOW with TIER, one key | %.2f | %.2f | %d B | %d |" % (label, t[0], t[1], m[0], m[2]))
        w("| %s | two XCLOAK.ALLOW, two keys | %.2f | %.2f | %d B | %d |" % (label, s[0], s[1], m[1], m[3]))
    w("")
    z, c = tiers["forms"]["zset"], tiers["forms"]["compact"]
    w("Ratios, two calls / one 2-tier call: CPU %.2fx on sorted sets, %.2fx on compact keys; memory %.2fx and "
      "%.2fx. The 2-tier call is also all or nothing: a rejection by either tier consumes neither, which two "
      "calls cannot do." % (z["separate"][0] / z["tiered"][0], c["separate"][0] / c["tiered"][0],
                            z["memory"][1] / z["memory"][0], c["memory"][1] / c["memory"][0]))
    w("")


# --------------------------------------------------------------------------
# Sections 2 and 3: steady-state streams with NOW.

ENTRY_ROUNDS = 1 if QUICK else 15  # entries per key: rounds in which the sizes take turns (medians: a burst of load on the machine moves a few rounds, not the median)
ENTRY_CALLS = 200 if QUICK else 3_000  # calls per key and round, each way (x10 keys: 30,000 calls a measure)
BASE_MS = 1_732_941_234_567  # a real stamp: members then take their full width (t mod 10^11 is not small)


def steady_stream(key_prefix, keys, entries, step_ms, rounds, start_round, reject=False):
    """Round-robin XCLOAK.ALLOW over `keys` keys with window entries*step_ms and
    limit `entries`: from round `entries` on, each call trims the entry of
    round r - entries and adds one (or, with reject, finds the window full)."""
    window = entries * step_ms
    names = [("%s:%d" % (key_prefix, k)).encode() for k in range(keys)]
    head = b"*6\r\n$12\r\nXCLOAK.ALLOW\r\n"
    tail_window = b"$%d\r\n%d\r\n$%d\r\n%d\r\n$3\r\nNOW\r\n" % (
        len(str(window)), window, len(str(entries)), entries)
    for r in range(start_round, start_round + rounds):
        now = BASE_MS + (start_round - 1 if reject else r) * step_ms
        now_arg = b"$%d\r\n%d\r\n" % (len(str(now)), now)
        for name in names:
            yield head + b"$%d\r\n%s\r\n" % (len(name), name) + tail_window + now_arg


def measure_stream(server, make, expect_calls):
    server.client.call("CONFIG", "RESETSTAT")
    server.pipe(make())
    calls, usec = server.stat("xcloak.allow")
    assert calls == expect_calls, (calls, expect_calls)
    return usec


# The compact form's sizes go up to MAX-LIMIT's default (1,000,000 entries per
# key) on 2 keys: every entry has its own stamp (one per 1,000 ms, as in the
# sorted-set rows), so the prefill is one call per entry, fed with --pipe.
COMPACT_SIZES = (10, 100, 1_000, 10_000, 100_000) + (() if QUICK else (1_000_000,))
COMPACT_KEYS = 2


def section_entries(server, form="zset", sizes=(10, 100, 1_000, 10_000), keys=10):
    """Admission and rejection cost at `sizes` live entries per key, on keys of
    `form`. The sizes take turns, round after round (median of ENTRY_ROUNDS),
    so a burst of load on the machine does not land on one size only. Each
    measurement is keys * rounds = 10 * ENTRY_CALLS calls, whatever `keys`."""
    rounds = ENTRY_CALLS * 10 // keys
    tag = "e" if form == "zset" else "ec"
    server.storage(form)
    for entries in sizes:
        started = time.time()
        server.pipe(steady_stream("%s%d" % (tag, entries), keys, entries, 1000, entries, 0))
        server.expect_type("%s%d:0" % (tag, entries), "zset" if form == "zset" else "xcloaklog")
        if entries >= 100_000:
            print("  prefilled %d keys of %d entries (%s) in %.0f s" % (keys, entries, form, time.time() - started), flush=True)
    samples = {entries: ([], []) for entries in sizes}

    def check(prefix, entries, last_round):
        found = server.entries(prefix + ":0", entries * 1000, BASE_MS + last_round * 1000)
        assert found == entries, (prefix, found, entries)

    for round_ in range(ENTRY_ROUNDS):
        for entries in sizes[round_ % len(sizes):] + sizes[:round_ % len(sizes)]:
            prefix = "%s%d" % (tag, entries)
            start = entries + round_ * rounds
            admit = measure_stream(server, lambda: steady_stream(prefix, keys, entries, 1000, rounds, start), keys * rounds)
            check(prefix, entries, start + rounds - 1)
            reject = measure_stream(server, lambda: steady_stream(prefix, keys, entries, 1000, rounds, start + rounds, True), keys * rounds)
            check(prefix, entries, start + rounds - 1)
            samples[entries][0].append(admit)
            samples[entries][1].append(reject)
    # Each size against the mean of every size in the same round: the machine's
    # speed drifts between rounds (a neighbour's load), and a ratio taken
    # within a round cancels it. Flatness is read from these (`compact_targets`).
    relative = {entries: ([], []) for entries in sizes}
    for round_ in range(ENTRY_ROUNDS):
        for way in (0, 1):
            mean = statistics.mean(samples[entries][way][round_] for entries in sizes)
            for entries in sizes:
                relative[entries][way].append(samples[entries][way][round_] / mean)
    rows = []
    for entries in sizes:
        admit, reject = (statistics.median(column) for column in samples[entries])
        rows.append((entries, admit, reject, statistics.median(relative[entries][0]), statistics.median(relative[entries][1])))
        print("  %s %8d entries/key: admission (trim 1, add 1) %.2f usec/call, rejection %.2f usec/call (median of %d; "
              "against the round's mean %.2f, %.2f)" % (form, entries, admit, reject, ENTRY_ROUNDS, rows[-1][3], rows[-1][4]), flush=True)
    server.client.call("FLUSHALL")
    server.storage("zset")
    return rows


def section_keyspace(server):
    rows = []
    for keys in (1, 1_000, 1_000_000):
        if QUICK and keys > 100_000:
            keys = 100_000
        rounds = max(1, 100_000 // keys)
        prefix = "k"
        # Two entries per key, one trimmed and one added by every measured call.
        server.pipe(steady_stream(prefix, keys, 2, WINDOW_MS // 2, 2, 0))
        usec = measure_stream(server, lambda: steady_stream(prefix, keys, 2, WINDOW_MS // 2, rounds, 2), keys * rounds)
        dbsize = server.client.call("DBSIZE")
        # The floor under the same access pattern: INCR over as many keys.
        server.client.call("CONFIG", "RESETSTAT")
        names = [("i:%d" % k).encode() for k in range(keys)]
        server.pipe(b"*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n" % (len(n), n) for _ in range(rounds) for n in names)
        _, incr = server.stat("incr")
        rows.append((keys, dbsize, usec, incr))
        print("  %9d keys (%d in the keyspace): XCLOAK.ALLOW %.2f usec/call, INCR %.2f usec/call" % (keys, dbsize, usec, incr), flush=True)
        server.client.call("FLUSHALL")
    return rows


# --------------------------------------------------------------------------
# Section 4: one million distinct keys.

def settle_memory(server):
    time.sleep(0.5)
    return server.used_memory()


def section_million(server):
    keys = 100_000 if QUICK else 1_000_000
    # Long enough that every key is still live when the load ends (it takes
    # 5-15 s on a busy 2-core machine), short enough to wait for.
    window = 30_000
    server.client.call("FLUSHALL")
    baseline = settle_memory(server)
    server.client.call("CONFIG", "RESETSTAT")
    start = time.time()
    server.pipe(encode("XCLOAK.ALLOW", "ip:%d" % i, window, 10) for i in range(keys))
    elapsed = time.time() - start
    calls, usec = server.stat("xcloak.allow")
    loaded = server.used_memory()
    dbsize = server.client.call("DBSIZE")
    if dbsize != keys:
        print("  note: only %d of %d keys live when the load ended (it took %.0f s)" % (dbsize, keys, elapsed), flush=True)
    # Wait for the window (plus the TTL margin) to pass; the server's active
    # expiry reclaims the keys without any command touching them.
    deadline = time.time() + 180
    while server.client.call("DBSIZE") > 0 and time.time() < deadline:
        time.sleep(0.5)
    emptied_after = time.time() - start
    left = server.client.call("DBSIZE")
    after = settle_memory(server)
    result = dict(keys=keys, window=window, usec=usec, calls=calls, dbsize=dbsize, baseline=baseline,
                  loaded=loaded, after=after, left=left, emptied_after=emptied_after, load_seconds=elapsed)
    print("  %d keys: +%.1f MB (%.0f B/key), %.2f usec/call; DBSIZE %d after %.0f s, used_memory %+.2f MB vs baseline" % (
        keys, (loaded - baseline) / 1e6, (loaded - baseline) / keys, usec, left, emptied_after, (after - baseline) / 1e6), flush=True)
    return result


# --------------------------------------------------------------------------
# Section 5: memory per tracked request.

def section_memory(server, sha, copies=5):
    """Bytes per tracked request, summed over `copies` keys of each layout (a
    skiplist's node sizes are random: several keys average that out): rows of
    (entries, XCLOAK.ALLOW sorted set, script, XCLOAK.ALLOW compact)."""
    rows = []
    for entries in (100, 1_000, 10_000):
        ours_b = script_b = compact_b = 0
        for copy in range(copies):
            ours, script, compact = "m:x%d:%d" % (entries, copy), "m:s%d:%d" % (entries, copy), "m:c%d:%d" % (entries, copy)
            t0 = BASE_MS
            server.storage("zset")
            server.pipe(encode("XCLOAK.ALLOW", ours, 10 ** 9, entries, "NOW", t0 + j) for j in range(entries))
            server.pipe(encode("EVALSHA", sha, 1, script, t0 + j, 10 ** 9, entries) for j in range(entries))
            server.storage("compact")
            server.pipe(encode("XCLOAK.ALLOW", compact, 10 ** 9, entries, "NOW", t0 + j) for j in range(entries))
            server.expect_type(ours, "zset")
            server.expect_type(compact, "xcloaklog")
            assert server.client.call("ZCARD", ours) == entries == server.client.call("ZCARD", script)
            assert server.entries(compact, 10 ** 9, t0 + entries - 1) == entries
            ours_b += server.client.call("MEMORY", "USAGE", ours, "SAMPLES", 0)
            compact_b += server.client.call("MEMORY", "USAGE", compact, "SAMPLES", 0)
            script_b += server.client.call("MEMORY", "USAGE", script, "SAMPLES", 0) + \
                server.client.call("MEMORY", "USAGE", script + ":seq", "SAMPLES", 0)
        n = entries * copies
        rows.append((entries, ours_b / n, script_b / n, compact_b / n))
        print("  %6d entries: XCLOAK sorted set %.2f B/request, compact %.2f B/request, script %.2f B/request" % (
            entries, ours_b / n, compact_b / n, script_b / n), flush=True)
    server.client.call("FLUSHALL")
    server.storage("zset")
    return rows


# --------------------------------------------------------------------------
# Section 6: memory per identity.

IDENTITY_WINDOW_MS = 60_000
IDENTITY_LIMITS = (10, 100, 1_000, 10_000)


def section_identity(server, sha, copies=5):
    """Bytes per identity (MEMORY USAGE ... SAMPLES 0, mean over `copies` keys):
    a window of 60 s filled to its limit, stamps evenly spaced over the window,
    for the article's script (its set and its :seq key), XCLOAK.ALLOW on a
    sorted set, XCLOAK.ALLOW compact, and redis-cell (one key after `limit`
    admitted CL.THROTTLE calls). Rows of (limit, {layout: bytes})."""
    rows = []
    window = IDENTITY_WINDOW_MS
    for limit in IDENTITY_LIMITS:
        sizes = {"script": 0, "zset": 0, "compact": 0, "cell": 0}
        t0 = BASE_MS
        stamps = [t0 + j * window // limit for j in range(limit)]
        now = stamps[-1]
        for copy in range(copies):
            # Names of the same length for every layout (the name is counted).
            key = {layout: "id:%s:%d:%d" % (letter, limit, copy)
                   for layout, letter in (("script", "s"), ("zset", "z"), ("compact", "c"), ("cell", "r"))}
            server.pipe(encode("EVALSHA", sha, 1, key["script"], t, window, limit) for t in stamps)
            server.storage("zset")
            server.pipe(encode("XCLOAK.ALLOW", key["zset"], window, limit, "NOW", t) for t in stamps)
            server.storage("compact")
            server.pipe(encode("XCLOAK.ALLOW", key["compact"], window, limit, "NOW", t) for t in stamps)
            server.storage("zset")
            server.pipe(encode("CL.THROTTLE", key["cell"], *cell_args(limit, window), 1) for _ in stamps)
            # Filled to the limit: every one of them admits nothing more.
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
        per_identity = {layout: total / copies for layout, total in sizes.items()}
        rows.append((limit, per_identity))
        print("  limit %6d: script %.0f B, sorted set %.0f B, compact %.0f B, redis-cell %.0f B per identity" % (
            limit, per_identity["script"], per_identity["zset"], per_identity["compact"], per_identity["cell"]), flush=True)
    server.client.call("FLUSHALL")
    return rows


# --------------------------------------------------------------------------
# Section 7: memory per identity as the server pays it (issue 25): the
# used_memory delta over many identities, so the allocator's real size
# classes, the key, its expiry and the keyspace's tables all count.

USED_IDENTITIES = 2_000 if QUICK else 10_000
USED_LIMITS = (10, 100, 1_000)
USED_LAYOUTS = ("compact", "zset", "script", "cell")
# A sorted set of 1,000 entries costs about 110 kB: 10,000 of them (and as
# many of the script's) would need 2.3 GB on a shared machine; 1,000 do.
USED_BIG_SET_IDENTITIES = 1_000
ATTACK_IDENTITIES = 100_000 if QUICK else 1_000_000
ATTACK_LIMIT = 10


def fill_identities(server, sha, layout, identities, limit, window=IDENTITY_WINDOW_MS):
    """`identities` windows of `layout`, each filled to `limit` with stamps
    evenly spaced over `window`, round after round (the j-th call of every
    identity, then the (j+1)-th): every key's last call is in the last round,
    so none reaches its TTL (window + 1 s on the server clock) before the
    measurement, however long the fill takes. The commands are encoded once
    per round (the key names once in all), so the fill runs at the server's pace."""
    letter = {"compact": "c", "zset": "z", "script": "s", "cell": "r"}[layout]
    names = [("u:%s:%07d" % (letter, i)).encode() for i in range(identities)]  # the same length for every layout
    keys = [b"$%d\r\n%s\r\n" % (len(n), n) for n in names]
    server.storage("compact" if layout == "compact" else "zset")
    t0 = BASE_MS
    bulk = lambda value: b"$%d\r\n%s\r\n" % (len(str(value)), str(value).encode())  # noqa: E731

    def commands():
        for j in range(limit):
            now = t0 + j * window // limit
            if layout == "script":
                head, tail = b"*7\r\n$7\r\nEVALSHA\r\n" + bulk(sha) + bulk(1), bulk(now) + bulk(window) + bulk(limit)
            elif layout == "cell":
                head, tail = b"*6\r\n$11\r\nCL.THROTTLE\r\n", b"".join(bulk(a) for a in cell_args(limit, window)) + bulk(1)
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
        sys.exit("bench: %d of %d keys left after filling %s identities (expired before the measurement?)" % (
            dbsize, expected_keys, layout))


def used_per_identity(server, sha, layout, identities, limit):
    """The used_memory delta per identity, read as soon as the fill ends (the
    server's accounting is exact: no settling needed; redis-cell's keys expire
    soon after their last call when the fill is slower than their refill),
    then checked: every window full and every key still there."""
    server.client.call("FLUSHALL")
    before = settle_memory(server)
    started = time.time()
    names = fill_identities(server, sha, layout, identities, limit)
    after = server.used_memory()
    check_filled(server, layout, names, limit)
    server.client.call("FLUSHALL")
    return (after - before) / identities, time.time() - started


def section_used_memory(server, sha):
    """Rows of (limit, identities per layout, {layout: bytes per identity}):
    the median of three fills where a fill is quick (limits 10 and 100),
    after one fill that is thrown away (a fresh server's first keys cost some
    10 B more each: tables and buffers the server keeps once grown)."""
    used_per_identity(server, sha, "compact", USED_IDENTITIES, 10)
    rows = []
    for limit in USED_LIMITS:
        per, counts = {}, {}
        for layout in USED_LAYOUTS:
            n = USED_BIG_SET_IDENTITIES if limit >= 1_000 and layout in ("zset", "script") else USED_IDENTITIES
            reps = 3 if limit <= 100 else 1
            runs = [used_per_identity(server, sha, layout, n, limit) for _ in range(reps)]
            per[layout] = statistics.median(r[0] for r in runs)
            counts[layout] = n
            print("  limit %5d, %-7s %7d identities: used_memory %+.0f B per identity (%s; %.0f s)" % (
                limit, layout, n, per[layout], ", ".join("%.0f" % r[0] for r in runs), sum(r[1] for r in runs)), flush=True)
        rows.append((limit, counts, per))
    server.storage("compact")
    return rows


def section_attack(server, sha):
    """1,000,000 identities at limit 10, each window full: used_memory per layout."""
    out = {}
    for layout in USED_LAYOUTS:
        per, seconds = used_per_identity(server, sha, layout, ATTACK_IDENTITIES, ATTACK_LIMIT)
        out[layout] = per
        print("  %d identities at limit %d, %-7s: used_memory %+.1f MB (%.0f B per identity, %.0f s)" % (
            ATTACK_IDENTITIES, ATTACK_LIMIT, layout, per * ATTACK_IDENTITIES / 1e6, per, seconds), flush=True)
    server.storage("compact")
    return out


# --------------------------------------------------------------------------
# Section 9: XCLOAK.REFUND's cost against the size of the window (issue 25).

REFUND_SIZES = (10, 100, 1_000, 10_000, 100_000) + (() if QUICK else (1_000_000,))
REFUND_CALLS = 500 if QUICK else 5_000  # per case (the server times calls in whole microseconds)
REFUND_WINDOW_MS = 10 ** 12
REFUND_ROUNDS = 1 if QUICK else 9


def allow_cmd(key, window, limit, now):
    return encode("XCLOAK.ALLOW", key, window, limit, "NOW", now)


def section_refund(server):
    """REFUND usec_per_call on one key per form and size, holding `size` lone
    entries 1,000 ms apart: (a) the newest admission (each REFUND follows the
    ALLOW it gives back, so the window keeps its size), (b) a stamp in the
    middle (each REFUND of an old stamp is followed by an ALLOW with that NOW,
    which puts it back). Only REFUND's own usec_per_call is read. Every size's
    key is built first; then the sizes take turns, round after round (the
    order rotating), so that a slow moment of the machine falls on one round
    of every size rather than on every round of one size. Rows of (size,
    {form: (newest, middle, newest against the round's mean)}): medians of
    REFUND_ROUNDS rounds, the last one the median of this size's newest
    divided by the mean of every size's newest in the same round."""
    limit = 2_000_000
    # A window of 1,000,000 entries plus the one given back takes a limit above
    # MAX-LIMIT's default.
    server.client.call("CONFIG", "SET", "xcloak.max-limit", limit)
    results = {}
    for form in ("compact", "zset"):
        server.storage(form)
        started = time.time()
        keys = {}
        for size in REFUND_SIZES:
            keys[size] = key = "rf:%s:%d" % (form[0], size)
            server.pipe(allow_cmd(key, REFUND_WINDOW_MS, limit, BASE_MS + i * 1000) for i in range(size))
            server.expect_type(key, "xcloaklog" if form == "compact" else "zset")
        newest = {size: [] for size in REFUND_SIZES}
        middle = {size: [] for size in REFUND_SIZES}
        for round_ in range(REFUND_ROUNDS):
            shift = round_ % len(REFUND_SIZES)
            for size in REFUND_SIZES[shift:] + REFUND_SIZES[:shift]:
                key, last = keys[size], BASE_MS + (size - 1) * 1000

                def newest_stream():
                    for j in range(REFUND_CALLS):
                        stamp = last + 1 + j
                        yield allow_cmd(key, REFUND_WINDOW_MS, limit, stamp)
                        yield encode("XCLOAK.REFUND", key, stamp)
                server.client.call("CONFIG", "RESETSTAT")
                server.pipe(newest_stream())
                calls, usec = server.stat("xcloak.refund")
                assert calls == REFUND_CALLS, calls
                newest[size].append(usec)

                def middle_stream():
                    # Distinct stamps around the middle, every one in the window.
                    for j in range(REFUND_CALLS):
                        stamp = BASE_MS + (size // 2 + (j * 7919 + round_ * 101) % max(1, size // 4)) * 1000
                        yield encode("XCLOAK.REFUND", key, stamp)
                        yield allow_cmd(key, REFUND_WINDOW_MS, limit, stamp)
                server.client.call("CONFIG", "RESETSTAT")
                server.pipe(middle_stream())
                calls, usec = server.stat("xcloak.refund")
                assert calls == REFUND_CALLS, calls
                middle[size].append(usec)
        for size in REFUND_SIZES:
            assert server.entries(keys[size], REFUND_WINDOW_MS, BASE_MS + size * 1000) == size, keys[size]
            against_round = statistics.median(
                newest[size][r] / statistics.mean(newest[s][r] for s in REFUND_SIZES) for r in range(REFUND_ROUNDS))
            results[(form, size)] = (statistics.median(newest[size]), statistics.median(middle[size]), against_round)
            print("  %-7s %8d entries: REFUND of the newest %.2f usec/call (%.2fx the round's mean), of a middle stamp "
                  "%.2f usec/call" % (form, size, results[(form, size)][0], against_round, results[(form, size)][1]), flush=True)
            server.client.call("DEL", keys[size])
        print("  %s: %.0f s" % (form, time.time() - started), flush=True)
    server.storage("compact")
    server.client.call("CONFIG", "SET", "xcloak.max-limit", 1_000_000)
    return [(size, {form: results[(form, size)] for form in ("compact", "zset")}) for size in REFUND_SIZES]


CHART = os.path.join(ROOT, "docs/performance-memory.png")
CHART_DATA = os.path.join(ROOT, "target/bench/memory-per-identity.json")
MATPLOTLIB = "matplotlib==3.10.3"
BENCH_CACHE = os.environ.get("XCLOAK_BENCH_CACHE", os.path.expanduser("~/.cache/xcloak-bench"))


def chart_python():
    """A Python with matplotlib (pinned): a venv in the bench cache, created
    and filled from PyPI the first time."""
    venv = os.path.join(BENCH_CACHE, "venv")
    python = os.path.join(venv, "bin", "python")
    probe = "import matplotlib, sys; sys.exit(matplotlib.__version__ != %r)" % MATPLOTLIB.split("==")[1]
    if os.path.exists(python) and subprocess.run([python, "-c", probe]).returncode == 0:
        return python
    print("bench: installing %s into %s" % (MATPLOTLIB, venv), flush=True)
    if subprocess.run([sys.executable, "-m", "venv", "--clear", venv]).returncode != 0:
        # Debian's python3 has no venv module without python3-venv.
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(sudo + ["apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "python3-venv"], env=env, check=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", MATPLOTLIB], check=True)
    return python


def draw_chart(used, refunds, m):
    import json
    os.makedirs(os.path.dirname(CHART_DATA), exist_ok=True)
    with open(CHART_DATA, "w") as f:
        json.dump(dict(window_ms=IDENTITY_WINDOW_MS, used=[(limit, per) for limit, _, per in used], refunds=refunds,
                       server=m["server"], commit=m["commit"], date=m["date"],
                       gcra_targets={str(k): v for k, v in TARGET_GCRA.items()}), f, indent=1)
    subprocess.run([chart_python(), os.path.join(ROOT, "scripts/chart.py"), CHART_DATA, CHART], check=True)


# --------------------------------------------------------------------------
# Section 10: this build against a baseline build (scripts/compare.py).

# The release whose compact encoding (version 1) the new one replaces.
BASELINE = os.environ.get("BENCH_BASELINE", "ced23cf")
BASELINE_ROUNDS = 1 if QUICK else 3
# Runs of compare.py's paired measures (every server up at once, slices taking
# turns): what the "this build / the baseline" targets read.
BASELINE_PAIRED_RUNS = 1 if QUICK else 3


def baseline_module():
    """The module built from BASELINE (`git archive` of that commit, built with
    cargo into the bench cache, once); XCLOAK_BASELINE_MODULE: another build."""
    path = os.environ.get("XCLOAK_BASELINE_MODULE")
    if path:
        return path, os.path.basename(path)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", BASELINE + "^{commit}"],
                            capture_output=True, text=True).stdout.strip()
    if not commit:
        sys.exit("bench: the baseline %s is not a commit of this repository (BENCH_BASELINE)" % BASELINE)
    src = os.path.join(BENCH_CACHE, "baseline-" + commit)
    module = os.path.join(src, "target/release/libxcloak.so")
    if not os.path.exists(module):
        print("bench: building the baseline %s into %s" % (commit, src), flush=True)
        shutil.rmtree(src, ignore_errors=True)
        os.makedirs(src)
        archive = subprocess.Popen(["git", "-C", ROOT, "archive", commit], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout, check=True)
        archive.wait()
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=src, check=True)
    return module, commit


BENCH_INSTRUCTIONS = os.environ.get("BENCH_INSTRUCTIONS", "0" if QUICK else "1") == "1"


def section_baseline():
    """compare.py's measures for the baseline and this build, on fresh servers
    taking turns, BASELINE_ROUNDS rounds, then (BENCH_INSTRUCTIONS) once each
    under callgrind: {label: {metric: (baseline median, ours median, median of
    the per-round ratios ours / baseline, the per-round ratios)}} with the
    metrics usec (usec_per_call), cpu (the server process's CPU per call) and
    instructions."""
    import compare
    base, name = baseline_module()
    ours = os.path.abspath(MODULE)
    runs = {base: [], ours: []}
    for round_ in range(BASELINE_ROUNDS):
        for module in ([base, ours] if round_ % 2 == 0 else [ours, base]):
            runs[module].append(compare.measure(module, False))
            print("  round %d %s: %s" % (round_ + 1, "baseline " + name if module == base else "this build", ", ".join(
                "%s %.2f" % (label.split(": ", 1)[-1] if label.startswith("main") else label, values["usec"])
                for label, values in runs[module][-1].items())), flush=True)
    instructions = {}
    if BENCH_INSTRUCTIONS:
        for module in (base, ours):
            instructions[module] = compare.measure(module, False, instructions=True)
            print("  instructions, %s: %s" % ("baseline " + name if module == base else "this build", ", ".join(
                "%s %.0f" % (label, values["instructions"]) for label, values in instructions[module].items())), flush=True)
    out = {}
    for label in runs[ours][0]:
        if not all(label in r for r in runs[base]):
            continue
        out[label] = {}
        for metric in ("usec", "cpu"):
            ratios = [b[label][metric] / a[label][metric] for a, b in zip(runs[base], runs[ours])]
            out[label][metric] = (statistics.median(r[label][metric] for r in runs[base]),
                                  statistics.median(r[label][metric] for r in runs[ours]), statistics.median(ratios), ratios)
        if instructions and label in instructions[base] and label in instructions[ours]:
            for metric in ("instructions", "decide"):
                if metric in instructions[base][label] and instructions[base][label][metric] > 0:
                    a, b = instructions[base][label][metric], instructions[ours][label][metric]
                    out[label][metric] = (a, b, b / a, [b / a])
    # The targets: compare.py's paired measures, BASELINE_PAIRED_RUNS runs; per
    # measure the median of each run's per-slice ratios ours / baseline.
    paired = {}
    for run in range(BASELINE_PAIRED_RUNS):
        columns = compare.paired_measures([base, ours], log=None)
        for label, (a, b) in columns.items():
            ratio = statistics.median(y / x for x, y in zip(a, b))
            paired.setdefault(label, []).append((statistics.median(a), statistics.median(b), ratio))
        print("  paired run %d: %s" % (run + 1, ", ".join(
            "%s %.3fx" % (label, runs[-1][2]) for label, runs in paired.items())), flush=True)
    return dict(baseline=name, rounds=BASELINE_ROUNDS, rows=out, paired=paired,
                paired_slices=(compare.PAIRED_SLICES, compare.PAIRED_MAIN_SLICES))


# --------------------------------------------------------------------------
# Report.

def machine(server):
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = server.client.info("server")
    name = "Valkey" if "valkey_version" in info else "Redis"
    version = info.get("valkey_version", info.get("redis_version"))
    bench_version = subprocess.run(["redis-benchmark", "--version"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "src"], capture_output=True, text=True).stdout.strip()
    return dict(cpu=cpu, nproc=os.cpu_count(), kernel=platform.release(), server="%s %s" % (name, version),
                bench=bench_version, commit=commit + (" (src modified)" if dirty else ""),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load=os.getloadavg())


def verdict(ok):
    return "PASS" if ok else "FAIL"


def commands_table(w, cmds, config):
    requests = KEYS * config["calls"]
    w("%d keys (`-r %d`), every key prefilled with %d live entries in its own layout (redis-cell: %d units "
      "taken), window %d ms, limit %d, %d requests per command and mode (about %d calls per key: roughly the "
      "first %d are admitted, the rest rejected), median of %d round(s), fresh keys each round, the order of "
      "the commands rotating. CPU is "
      "`usec_per_call` from `INFO commandstats` after `CONFIG RESETSTAT` (for EVALSHA it includes the "
      "script's inner calls); the process column is the server's `used_cpu_user + used_cpu_sys` "
      "(INFO cpu) over the run divided by the requests: it also counts reading, parsing and replying, "
      "and is not inflated when the server is preempted. Latency is redis-benchmark's, unpipelined." % (
          KEYS, KEYS, config["prefill"], config["prefill"], WINDOW_MS, config["limit"], requests, config["calls"],
          config["limit"] - config["prefill"], config["rounds"]))
    w("")
    w("```")
    w("redis-benchmark -p PORT -c %d -n %d -r %d [-P %d] --csv XCLOAK.ALLOW xa:__rand_int__ %d %d   # sorted-set keys" % (
        CLIENTS, requests, KEYS, PIPELINE, WINDOW_MS, config["limit"]))
    w("redis-benchmark ... XCLOAK.ALLOW xc:__rand_int__ %d %d   # compact keys (TYPE xcloaklog)" % (WINDOW_MS, config["limit"]))
    w("redis-benchmark ... EVALSHA <sha of tests/oracle/article.lua> 1 sc:__rand_int__ <now-ms> %d %d" % (WINDOW_MS, config["limit"]))
    w("redis-benchmark ... ZADD zz:__rand_int__ <now-ms> 1__rand_int__")
    w("redis-benchmark ... CL.THROTTLE cl:__rand_int__ %s 1" % " ".join(str(a) for a in cell_args(config["limit"], WINDOW_MS)))
    w("redis-benchmark ... INCR in:__rand_int__")
    w("```")
    w("")
    modes = config["modes"]
    if len(modes) == 2:
        w("| command | pipelined rps | usec_per_call (pipelined) | server process CPU usec/request (pipelined) | unpipelined rps | usec_per_call (unpipelined) | p50 ms | p99 ms | entries/key before -> after |")
        w("|---|---|---|---|---|---|---|---|---|")
    else:
        w("| command | pipelined rps | usec_per_call | server process CPU usec/request | entries/key before -> after |")
        w("|---|---|---|---|---|")
    for name in ROWS:
        p = cmds[(name, True)]
        sizes = "%.1f -> %.1f" % (p[4], p[5]) if p[4] is not None else "-"
        if len(modes) == 2:
            u = cmds[(name, False)]
            w("| %s | %.0f | %.2f | %.2f | %.0f | %.2f | %.3f | %.3f | %s |" % (
                LABEL[name], p[0], p[1], p[7], u[0], u[1], u[2], u[3], sizes))
        else:
            w("| %s | %.0f | %.2f | %.2f | %s |" % (LABEL[name], p[0], p[1], p[7], sizes))
    w("")
    w("XCLOAK.ALLOW admitted %.0f%% of the pipelined calls on sorted sets and %.0f%% on compact keys "
      "(the rest were rejections)." % (100 * cmds[("XCLOAK.ALLOW", True)][6], 100 * cmds[("XCLOAK.ALLOW compact", True)][6]))
    w("")


def ratio_line(cmds):
    u = lambda name: cmds[(name, True)][1]  # noqa: E731
    c = u("XCLOAK.ALLOW compact")
    return ("Ratios of usec_per_call (pipelined): EVALSHA / XCLOAK.ALLOW compact %.2fx, EVALSHA / XCLOAK.ALLOW "
            "sorted set %.2fx; XCLOAK.ALLOW compact / ZADD %.2fx, sorted set / ZADD %.2fx; CL.THROTTLE / "
            "XCLOAK.ALLOW compact %.2fx, CL.THROTTLE / sorted set %.2fx." % (
                u("EVALSHA script") / c, u("EVALSHA script") / u("XCLOAK.ALLOW"), c / u("ZADD"),
                u("XCLOAK.ALLOW") / u("ZADD"), u("CL.THROTTLE") / c, u("CL.THROTTLE") / u("XCLOAK.ALLOW")))


# Issue 11's targets.
TARGET_EVAL = 7.0     # EVALSHA / XCLOAK.ALLOW compact, server CPU per call, at least
TARGET_ZADD = 0.8     # XCLOAK.ALLOW compact / ZADD, at most
TARGET_CELL = 1.2     # CL.THROTTLE / XCLOAK.ALLOW compact: "clearly" cheaper, read as at least this
TARGET_MEMORY = {10: 200, 100: 450, 1_000: 3_000}  # bytes per identity, at most
TARGET_PER_REQUEST = 2.5  # bytes per tracked request at 10,000 entries, at most
TARGET_FLAT = 1.3     # compact cost per call, largest / smallest over 10 .. 1,000,000 entries, at most


def compact_targets(workloads, compact_entries, memory, identity):
    targets = []
    for label, cmds in workloads:
        a, e = cmds[("XCLOAK.ALLOW compact", True)], cmds[("EVALSHA script", True)]
        r = e[1] / a[1]
        targets.append(("server CPU per call, EVALSHA / XCLOAK.ALLOW compact, %s" % label, ">= %.0fx" % TARGET_EVAL,
                        "%.2fx (%.2f / %.2f usec; process CPU %.2fx)" % (r, e[1], a[1], e[7] / a[7]), r >= TARGET_EVAL))
    for label, cmds in workloads:
        a, z = cmds[("XCLOAK.ALLOW compact", True)], cmds[("ZADD", True)]
        r = a[1] / z[1]
        targets.append(("server CPU per call, XCLOAK.ALLOW compact / ZADD, %s" % label, "<= %.1fx" % TARGET_ZADD,
                        "%.2fx (%.2f / %.2f usec; process CPU %.2fx)" % (r, a[1], z[1], a[7] / z[7]), r <= TARGET_ZADD))
    for label, cmds in workloads:
        a, c = cmds[("XCLOAK.ALLOW compact", True)], cmds[("CL.THROTTLE", True)]
        r = c[1] / a[1]
        targets.append(("server CPU per call, redis-cell CL.THROTTLE / XCLOAK.ALLOW compact, %s" % label,
                        ">= %.1fx (clearly cheaper)" % TARGET_CELL,
                        "%.2fx (%.2f / %.2f usec; process CPU %.2fx)" % (r, c[1], a[1], c[7] / a[7]), r >= TARGET_CELL))
    per_identity = dict(identity)
    for limit, bound in sorted(TARGET_MEMORY.items()):
        b = per_identity[limit]
        targets.append(("memory per identity, compact, limit %s (window 60 s, full)" % "{:,}".format(limit),
                        "<= {:,} B".format(bound),
                        "{:,.0f} B (sorted set {:,.0f}, script {:,.0f}, redis-cell {:,.0f})".format(
                            b["compact"], b["zset"], b["script"], b["cell"]), b["compact"] <= bound))
    row = next(r for r in memory if r[0] == 10_000)
    targets.append(("memory per tracked request, compact, 10,000 entries", "<= %.1f B" % TARGET_PER_REQUEST,
                    "%.2f B (sorted set %.2f, script %.2f)" % (row[3], row[1], row[2]), row[3] <= TARGET_PER_REQUEST))
    admits = [r[1] for r in compact_entries]
    rejects = [r[2] for r in compact_entries]
    # Largest / smallest of the per-round relative costs' medians (section_entries).
    ra, rr = [r[3] for r in compact_entries], [r[4] for r in compact_entries]
    fa, fr = max(ra) / min(ra), max(rr) / min(rr)
    lo, hi = compact_entries[0][0], compact_entries[-1][0]
    targets.append(("compact cost per call, %s to %s live entries per key (largest / smallest, within each round)" % (
        "{:,}".format(lo), "{:,}".format(hi)), "<= %.1fx" % TARGET_FLAT,
        "admission %.2fx (medians %.2f-%.2f usec: %.2fx), rejection %.2fx (%.2f-%.2f usec: %.2fx)" % (
            fa, min(admits), max(admits), max(admits) / min(admits), fr, min(rejects), max(rejects), max(rejects) / min(rejects)),
        max(fa, fr) <= TARGET_FLAT))
    return targets


# Issue 25's targets.
TARGET_GCRA = {10: 1.15, 100: 2.2, 1_000: 7.0}  # compact / redis-cell, used_memory per identity, at most
TARGET_REFUND_FLAT = 1.3  # REFUND of the newest, largest / smallest over 10 .. 1,000,000 entries, at most
TARGET_REFUND_MIDDLE = 2.0  # REFUND of a middle stamp at 1,000,000 entries, compact / sorted set, at most
TARGET_BASELINE = 1.05  # this build / the baseline, per call, at most


def issue25_targets(used, refunds, cmds, baseline):
    targets = []
    for limit, counts, per in used:
        r = per["compact"] / per["cell"]
        targets.append(("used_memory per identity, compact / redis-cell GCRA, limit %s (%s identities, window 60 s, full)" % (
            "{:,}".format(limit), "{:,}".format(counts["compact"])), "<= %.2fx" % TARGET_GCRA[limit],
            "%.2fx (%.0f / %.0f B; sorted set %.0f B, script %.0f B)" % (r, per["compact"], per["cell"], per["zset"], per["script"]),
            r <= TARGET_GCRA[limit]))
    newest = [row[1]["compact"][0] for row in refunds]
    against_round = [row[1]["compact"][2] for row in refunds]
    flat = max(against_round) / min(against_round)
    targets.append(("REFUND of the newest entry on compact keys, %s to %s entries (largest / smallest, within each round)" % (
        "{:,}".format(refunds[0][0]), "{:,}".format(refunds[-1][0])), "<= %.1fx" % TARGET_REFUND_FLAT,
        "%.2fx (medians %.2f-%.2f usec/call: %.2fx)" % (flat, min(newest), max(newest), max(newest) / min(newest)),
        flat <= TARGET_REFUND_FLAT))
    size, forms = refunds[-1]
    r = forms["compact"][1] / forms["zset"][1]
    targets.append(("REFUND of a middle stamp at %s entries, compact / sorted set" % "{:,}".format(size),
                    "<= %.1fx" % TARGET_REFUND_MIDDLE, "%.2fx (%.2f / %.2f usec/call)" % (r, forms["compact"][1], forms["zset"][1]),
                    r <= TARGET_REFUND_MIDDLE))
    a, z = cmds[("XCLOAK.ALLOW compact", True)], cmds[("ZADD", True)]
    targets.append(("server CPU per call, XCLOAK.ALLOW compact / ZADD, limit 10, half rejections (main)", "<= %.1fx" % TARGET_ZADD,
                    "%.2fx (%.2f / %.2f usec)" % (a[1] / z[1], a[1], z[1]), a[1] / z[1] <= TARGET_ZADD))
    for label, runs in baseline["paired"].items():
        ratio = statistics.median(r[2] for r in runs)
        metrics = baseline["rows"].get(label, {})
        also = "fresh-server rounds %.3fx" % metrics["usec"][2] if "usec" in metrics else ""
        if "instructions" in metrics:
            also += ", instructions %.3fx" % metrics["instructions"][2]
        if "decide" in metrics:
            also += " (the decision over the log %.3fx)" % metrics["decide"][2]
        targets.append(("usec_per_call, this build / %s: %s (paired slices)" % (baseline["baseline"], label), "<= %.2fx" % TARGET_BASELINE,
                        "%.3fx (%.2f / %.2f usec; runs %s; %s)" % (
                            ratio, statistics.median(r[1] for r in runs), statistics.median(r[0] for r in runs),
                            ", ".join("%.3f" % r[2] for r in runs), also),
                        ratio <= TARGET_BASELINE))
    return targets


def issue25_tables(w, used, attack_memory, refunds, baseline):
    w("## Memory per identity as the server pays it")
    w("")
    w("`used_memory` before and after filling many identities, divided by their number: every byte the server "
      "allocates for them counts (the key, its expiry, the keyspace tables, the value in the allocator's real "
      "size classes), not `MEMORY USAGE`. Window 60 s, each identity filled to its limit with stamps evenly "
      "spaced over the window (`XCLOAK.ALLOW key 60000 limit NOW t`, the script with the same stamps, "
      "redis-cell `CL.THROTTLE key limit-1 limit 60 1` as often), every identity's j-th call before any "
      "(j+1)-th so that no key expires before the measurement; median of three fills at limits 10 and 100, "
      "after one fill thrown away. Sorted sets and the script hold 1,000 identities at limit 1,000 (2.3 GB "
      "otherwise). Drawn in [performance-memory.png](performance-memory.png).")
    w("")
    w("| limit | identities | compact | sorted set | article's script | redis-cell (GCRA) | compact / GCRA |")
    w("|---|---|---|---|---|---|---|")
    for limit, counts, per in used:
        identities = "{:,}".format(counts["compact"])
        if counts["zset"] != counts["compact"]:
            identities += " ({:,} for the sorted sets and the script)".format(counts["zset"])
        w("| {:,} | {} | {:,.0f} B | {:,.0f} B | {:,.0f} B | {:,.0f} B | {:.2f}x |".format(
            limit, identities, per["compact"], per["zset"], per["script"], per["cell"], per["compact"] / per["cell"]))
    w("")
    w("### The attack: %s identities at limit %d" % ("{:,}".format(ATTACK_IDENTITIES), ATTACK_LIMIT))
    w("")
    w("The same fill, %s identities (one per address of a credential-stuffing run), each window full:" % "{:,}".format(ATTACK_IDENTITIES))
    w("")
    w("| layout | used_memory | per identity |")
    w("|---|---|---|")
    for layout, label in (("compact", "XCLOAK.ALLOW, compact"), ("zset", "XCLOAK.ALLOW, sorted set"),
                          ("script", "the article's script (+ its `:seq` key)"), ("cell", "redis-cell (GCRA, approximate)")):
        w("| %s | %.1f MB | %.0f B |" % (label, attack_memory[layout] * ATTACK_IDENTITIES / 1e6, attack_memory[layout]))
    w("")
    w("## XCLOAK.REFUND against the size of the window")
    w("")
    w("One key per form and size, holding that many lone entries 1,000 ms apart. The newest: %s times an "
      "`XCLOAK.ALLOW ... NOW t` then the `XCLOAK.REFUND key t` that gives it back. A middle stamp: %s times a "
      "`REFUND` of an old stamp (all distinct, around the middle) then the `ALLOW ... NOW` that puts it back. "
      "REFUND's own `usec_per_call` (INFO commandstats), median of %d rounds in which the sizes take turns; "
      "the flatness target reads each size's newest against the mean of every size's in the same round "
      "(median over the rounds), as the entries-per-key section does." % (
          "{:,}".format(REFUND_CALLS), "{:,}".format(REFUND_CALLS), REFUND_ROUNDS))
    w("")
    w("| entries | compact: newest | compact: newest / the round's mean | compact: middle stamp | sorted set: newest | sorted set: middle stamp |")
    w("|---|---|---|---|---|---|")
    for size, forms in refunds:
        w("| {:,} | {:.2f} | {:.2f}x | {:.2f} | {:.2f} | {:.2f} |".format(
            size, forms["compact"][0], forms["compact"][2], forms["compact"][1], forms["zset"][0], forms["zset"][1]))
    w("")
    w("## This build against %s" % baseline["baseline"])
    w("")
    w("`scripts/compare.py`'s measures, on fresh servers loaded with `STORAGE compact`, the two builds taking "
      "turns, %d rounds: the main workload above, compact windows held at 10, 1,000 and 100,000 entries by "
      "streams with `NOW` (admissions alone, each trimming one entry and adding one, and rejections alone, "
      "100,000 calls each), and REFUND of the newest of 100,000 entries. usec_per_call is the wall time inside "
      "the command (it grows when the server is preempted); process CPU is the server's CPU time per call "
      "(INFO cpu: parsing and replying included, preemption not); instructions are the command handler's per "
      "call under callgrind (`compare.py --instructions`: 2,000 keys, 4,000 stream calls, 20 refunds; the "
      "repeatable measure; the handler's count still moves by a few percent, as the expiry is re-armed and "
      "replicated every 500 ms of wall time under valgrind's slow clock, while the decision's does not). Medians; "
      "a ratio is the median of the per-round ratios." % baseline["rounds"])
    w("")
    rounds = [r for label, metrics in baseline["rows"].items() if "REFUND" not in label for r in metrics["usec"][3]]
    w("Fresh-server rounds follow the machine's drift between rounds (single rounds above read %.2fx-%.2fx). "
      "The targets read `compare.py --paired` instead: both builds' servers up at once, taking turns slice by "
      "slice (the order alternating), so that each ratio compares two measures a second or a few milliseconds "
      "apart; a build against itself reads 1.00x. %d runs, each of %d slices of 20,000 calls per stream size and "
      "way and %d whole main workloads on freshly prefilled keys; a run's ratio is the median of its per-slice "
      "ratios." % (min(rounds), max(rounds), BASELINE_PAIRED_RUNS, *baseline["paired_slices"]))
    w("")
    w("| measure | %s usec/call | this build usec/call | ratio per run | median |" % baseline["baseline"])
    w("|---|---|---|---|---|")
    for label, runs in baseline["paired"].items():
        w("| %s | %.3f | %.3f | %s | %.3fx |" % (
            label, statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
            ", ".join("%.3fx" % r[2] for r in runs), statistics.median(r[2] for r in runs)))
    w("")
    w("| measure | %s usec/call | this build usec/call | usec ratio | process CPU ratio | instructions (%s / this build), ratio | of which the decision over the log, ratio |" % (
        baseline["baseline"], baseline["baseline"]))
    w("|---|---|---|---|---|---|---|")
    for label, metrics in baseline["rows"].items():
        old, new, ratio, ratios = metrics["usec"]
        cell = lambda m: "{:,.0f} / {:,.0f}, {:.3f}x".format(*metrics[m][:3]) if m in metrics else "-"  # noqa: E731
        w("| %s | %.2f | %.2f | %.3fx (%s) | %.3fx | %s | %s |" % (
            label, old, new, ratio, ", ".join("%.2f" % x for x in ratios), metrics["cpu"][2], cell("instructions"), cell("decide")))
    w("")


def report(m, cmds, larger, attack, tiers, entries, compact_entries, keyspace, million, memory, identity, seconds,
           used, attack_memory, refunds, baseline):
    def get(name, pipelined):
        return cmds[(name, pipelined)]

    lines = []
    w = lines.append
    w("Produced by `make bench` (`scripts/bench.py`) in one run on one freshly started server, with the "
      "module loaded as `--loadmodule libxcloak.so STORAGE compact` and redis-cell 0.2.2 (crates.io, built by "
      "`scripts/fetch-redis-cell.sh`) loaded beside it; `CONFIG SET xcloak.storage zset|compact` before each "
      "command's keys are created picks their form, and `TYPE` on sample keys checks it.")
    w("Ratios are the claim; absolute numbers depend on the machine: a 2-core VM shared with other "
      "engineers' builds while this ran.")
    w("")
    w("- machine: %d CPUs (`nproc`), %s, Linux %s" % (m["nproc"], m["cpu"], m["kernel"]))
    w("- server: %s; %s; xcloak at commit %s" % (m["server"], m["bench"], m["commit"]))
    w("- run: %s, %.0f s in all%s; server and redis-benchmark at %s" % (
        m["date"], seconds, " (BENCH_QUICK: reduced sizes)" if QUICK else "",
        "nice -10" if NICE else "normal priority"))
    w("- the machine's load average (1, 5, 15 min) was %s at the start and %s at the end: the other "
      "processes on it, with which this run shared the %d CPUs" % (
          ", ".join("%.1f" % x for x in m["load"]), ", ".join("%.1f" % x for x in os.getloadavg()), m["nproc"]))
    w("")
    workloads = [("limit 10, half rejections (main)", cmds), ("limit 60, sets of 50-70 (larger)", larger),
                 ("limit 10, one call in ten admitted (attack)", attack)]
    issue25 = issue25_targets(used, refunds, cmds, baseline)
    w("## Targets: exact at the memory of an approximation (issue 25)")
    w("")
    w("| measure | target | this run | |")
    w("|---|---|---|---|")
    for measure, target, value, ok in issue25:
        w("| %s | %s | %s | %s |" % (measure, target, value, verdict(ok)))
    w("")
    w("![Memory per identity and REFUND's cost](performance-memory.png)")
    w("")
    compact = compact_targets(workloads, compact_entries, memory, identity)
    w("## Targets: compact storage (issue 11)")
    w("")
    w("| measure | target | this run | |")
    w("|---|---|---|---|")
    for measure, target, value, ok in compact:
        w("| %s | %s | %s | %s |" % (measure, target, value, verdict(ok)))
    w("")
    allow_p, allow_u = get("XCLOAK.ALLOW", True), get("XCLOAK.ALLOW", False)
    eval_p, eval_u = get("EVALSHA script", True), get("EVALSHA script", False)
    zadd_p, zadd_u = get("ZADD", True), get("ZADD", False)
    incr_p = get("INCR", True)
    cpu_eval = eval_p[1] / allow_p[1]
    rps_ratio = allow_p[0] / eval_p[0]
    cpu_zadd = allow_p[1] / zadd_p[1]
    e10 = next(r for r in entries if r[0] == 10)
    e10k = next(r for r in entries if r[0] == 10_000)
    grow_admit = e10k[1] / e10[1]
    grow_reject = e10k[2] / e10[2]
    mem = {r[0]: r[1] / r[2] for r in memory}
    targets = [
        ("server CPU per call, EVALSHA / XCLOAK.ALLOW (pipelined)", ">= 5x", "%.2fx (%.2f / %.2f usec; unpipelined %.2fx; process CPU %.2fx; a bare ZADD: EVALSHA / ZADD %.2fx)" % (
            cpu_eval, eval_p[1], allow_p[1], eval_u[1] / allow_u[1], eval_p[7] / allow_p[7], eval_p[1] / zadd_p[1]), cpu_eval >= 5),
        ("pipelined rps, XCLOAK.ALLOW / EVALSHA", ">= 3.5x", "%.2fx (%.0f / %.0f; a bare ZADD: ZADD / EVALSHA %.2fx)" % (
            rps_ratio, allow_p[0], eval_p[0], zadd_p[0] / eval_p[0]), rps_ratio >= 3.5),
        ("server CPU per call, XCLOAK.ALLOW / ZADD, same sized sets (pipelined)", "<= 1.3x", "%.2fx (%.2f / %.2f usec; unpipelined %.2fx; process CPU %.2fx)" % (
            cpu_zadd, allow_p[1], zadd_p[1], allow_u[1] / zadd_u[1], allow_p[7] / zadd_p[7]), cpu_zadd <= 1.3),
        ("cost per call at 10,000 live entries vs 10", "<= 1.5x", "admission %.2fx (%.2f / %.2f usec), rejection %.2fx" % (
            grow_admit, e10k[1], e10[1], grow_reject), max(grow_admit, grow_reject) <= 1.5),
    ]
    for entries_n, ratio in sorted(mem.items()):
        bound = 0.8 if entries_n == 100 else 1.0
        targets.append(("memory per tracked request vs the script's layout, %d entries" % entries_n,
                        "<= 0.8x" if entries_n == 100 else "< 1x", "%.3fx" % ratio,
                        ratio <= bound if entries_n == 100 else ratio < bound))
    w("## Targets: the sorted-set form (issue 5)")
    w("")
    w("XCLOAK.ALLOW on sorted sets, the default form, against the same script, ZADD and INCR rows.")
    w("")
    w("| measure | target | this run | |")
    w("|---|---|---|---|")
    for measure, target, value, ok in targets:
        w("| %s | %s | %s | %s |" % (measure, target, value, verdict(ok)))
    w("")
    w("For scale: INCR (the floor of any command) took %.2f usec/call pipelined, XCLOAK.ALLOW %.1fx that on "
      "sorted sets and %.1fx on compact keys." % (
          incr_p[1], allow_p[1] / incr_p[1], get("XCLOAK.ALLOW compact", True)[1] / incr_p[1]))
    w("")
    w("## XCLOAK.ALLOW (both forms), the article's script, ZADD, redis-cell, INCR")
    w("")
    w("redis-cell's `CL.THROTTLE key max_burst count_per_period period 1` is given the same limit per window: "
      "`max_burst = limit - 1` (a burst of `limit`), `count_per_period = limit`, `period = window` in seconds. "
      "It is GCRA: one string per key, approximate, on the server clock.")
    w("")
    commands_table(w, cmds, MAIN)
    w(ratio_line(cmds))
    w("")
    w("## The same with larger sets")
    w("")
    w("Every call of every command works on a window of 50-70 entries: for the sorted sets a listpack whose "
      "linear scans (ZADD's and XCLOAK.ALLOW's insert, the script's ZADD) then dominate.")
    w("")
    commands_table(w, larger, LARGER)
    w(ratio_line(larger))
    w("")
    w("## An attack: most calls rejected")
    w("")
    w("The credential-stuffing case: every key prefilled with %d live entries (its own layout), limit %d, "
      "about %d calls per key, so roughly one call in ten is admitted; pipelined only." % (
          ATTACK["prefill"], ATTACK["limit"], ATTACK["calls"]))
    w("")
    commands_table(w, attack, ATTACK)
    w(ratio_line(attack))
    w("")
    w("## Tiers: one call against two")
    w("")
    tiers_table(w, tiers)
    w("## Entries per key")
    w("")
    w("Keys held at a fixed number of live entries by a stream with `NOW` (fed with `redis-cli --pipe`), "
      "one entry per 1,000 ms: each admission trims the oldest entry and adds one, so the window keeps its size; "
      "then the same number of calls at the last `NOW`, all rejected. The sizes take turns over %d rounds of "
      "%d calls each way; the tables show the median per size, and the flatness target reads each size against "
      "the mean of every size in the same round (the median of those ratios), which cancels the machine's drift "
      "between rounds. Sorted sets (10 keys) switch from listpack to "
      "skiplist above 128 entries. Compact keys (%d keys, so that 1,000,000 entries per key, MAX-LIMIT's default, "
      "can be prefilled: one `XCLOAK.ALLOW ... NOW t` per entry, every entry its own stamp) go up to %s entries." % (
          ENTRY_ROUNDS, 10 * ENTRY_CALLS, COMPACT_KEYS, "{:,}".format(COMPACT_SIZES[-1])))
    w("")
    w("| live entries per key | sorted set: admission (trim 1, add 1) usec/call | sorted set: rejection usec/call | compact: admission usec/call | compact: rejection usec/call |")
    w("|---|---|---|---|---|")
    zset_rows = {r[0]: r for r in entries}
    for n, admit, reject, _, _ in compact_entries:
        z = zset_rows.get(n)
        w("| %s | %s | %s | %.2f | %.2f |" % ("{:,}".format(n), "%.2f" % z[1] if z else "-", "%.2f" % z[2] if z else "-",
                                              admit, reject))
    w("")
    w("## Keys in the keyspace")
    w("")
    w("The same per-call work (a sorted-set key holding two entries: trim one, add one) over 1 to 1,000,000 keys, "
      "round-robin, with INCR over as many keys as the floor under the same access pattern.")
    w("")
    w("| keys | keys in the keyspace | XCLOAK.ALLOW usec/call | INCR usec/call |")
    w("|---|---|---|---|")
    for keys, dbsize, usec, incr in keyspace:
        w("| %d | %d | %.2f | %.2f |" % (keys, dbsize, usec, incr))
    w("")
    w("## One key per client address")
    w("")
    mm = million
    w("%d calls `XCLOAK.ALLOW ip:<n> %d 10` (server clock, sorted-set form), one per key, fed with `redis-cli --pipe`:" % (
        mm["keys"], mm["window"]))
    w("")
    w("- loaded in %.0f s; DBSIZE %d, used_memory +%.1f MB (%.0f bytes per live tracked address), %.2f usec/call;" % (
        mm["load_seconds"], mm["dbsize"], (mm["loaded"] - mm["baseline"]) / 1e6,
        (mm["loaded"] - mm["baseline"]) / max(1, mm["dbsize"]), mm["usec"]))
    w("- %.0f s after the first call (window %d ms + 1 s TTL margin, then the server's active expiry): DBSIZE %d, "
      "used_memory %+.2f MB against the baseline before the load (%.1f%% of what the load took)." % (
          mm["emptied_after"], mm["window"], mm["left"], (mm["after"] - mm["baseline"]) / 1e6,
          100.0 * (mm["after"] - mm["baseline"]) / max(1, mm["loaded"] - mm["baseline"])))
    w("")
    w("## Memory per tracked request")
    w("")
    w("`MEMORY USAGE key SAMPLES 0` after N admissions one millisecond apart (window 10^9 ms), summed over five "
      "keys of each layout; the script's layout is its sorted set plus its `:seq` key.")
    w("")
    w("| entries | XCLOAK.ALLOW sorted set bytes/request | XCLOAK.ALLOW compact bytes/request | script bytes/request | sorted set / script | compact / script |")
    w("|---|---|---|---|---|---|")
    for n, ours, script, comp in memory:
        w("| %s | %.2f | %.2f | %.2f | %.3fx | %.4fx |" % ("{:,}".format(n), ours, comp, script, ours / script, comp / script))
    w("")
    w("## Memory per identity")
    w("")
    w("One identity's key(s), window %d ms filled to its limit with stamps evenly spaced over the window "
      "(`XCLOAK.ALLOW key %d limit NOW t`, the script with the same stamps), `MEMORY USAGE key SAMPLES 0`, "
      "mean of five keys; the script counts its `:seq` key too; redis-cell is its one key after `limit` "
      "admitted `CL.THROTTLE key limit-1 limit 60 1` (its size does not depend on the limit: it stores one "
      "timestamp, and is approximate). Drawn in [performance-memory.png](performance-memory.png)." % (
          IDENTITY_WINDOW_MS, IDENTITY_WINDOW_MS))
    w("")
    w("| limit | article's script | XCLOAK.ALLOW sorted set | XCLOAK.ALLOW compact | redis-cell | compact bytes per request |")
    w("|---|---|---|---|---|---|")
    for limit, b in identity:
        w("| {:,} | {:,.0f} B | {:,.0f} B | {:,.0f} B | {:,.0f} B | {:.2f} |".format(
            limit, b["script"], b["zset"], b["compact"], b["cell"], b["compact"] / limit))
    w("")
    issue25_tables(w, used, attack_memory, refunds, baseline)
    return "\n".join(lines), issue25 + compact + targets


def main():
    if not os.path.exists(MODULE):
        sys.exit("bench: no module at %s (run `make build`)" % MODULE)
    started = time.time()
    server = Server()
    try:
        sha = server.client.call("SCRIPT", "LOAD", open(ARTICLE).read())
        m = machine(server)
        print("xcloak bench: %s on %d CPUs (%s), port %d" % (m["server"], m["nproc"], m["cpu"], server.port), flush=True)
        print("1. XCLOAK.ALLOW / EVALSHA / ZADD / INCR under redis-benchmark", flush=True)
        cmds = section_commands(server, sha, MAIN, "")
        print("1b. the same with larger sets", flush=True)
        larger = section_commands(server, sha, LARGER, "L")
        print("1c. an attack: most calls rejected", flush=True)
        attack = section_commands(server, sha, ATTACK, "A")
        print("1d. tiers: one 2-tier call against two calls on two keys", flush=True)
        tiers = section_tiers(server)
        print("2. entries per key", flush=True)
        entries = section_entries(server)
        print("2b. entries per key, compact form", flush=True)
        compact_entries = section_entries(server, "compact", COMPACT_SIZES, COMPACT_KEYS)
        print("3. keys in the keyspace", flush=True)
        keyspace = section_keyspace(server)
        print("4. one key per client address", flush=True)
        million = section_million(server)
        print("5. memory per tracked request", flush=True)
        memory = section_memory(server, sha)
        print("6. memory per identity", flush=True)
        identity = section_identity(server, sha)
        print("7. memory per identity as the server pays it (used_memory)", flush=True)
        used = section_used_memory(server, sha)
        print("8. the attack: %s identities at limit %d" % ("{:,}".format(ATTACK_IDENTITIES), ATTACK_LIMIT), flush=True)
        attack_memory = section_attack(server, sha)
        print("9. XCLOAK.REFUND against the window's size", flush=True)
        refunds = section_refund(server)
    finally:
        server.stop()
    print("10. this build against the baseline %s (scripts/compare.py)" % BASELINE, flush=True)
    baseline = section_baseline()
    draw_chart(used, refunds, m)
    text, targets = report(m, cmds, larger, attack, tiers, entries, compact_entries, keyspace, million, memory, identity,
                           time.time() - started, used, attack_memory, refunds, baseline)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # Only the generated part is replaced: what the file says around it
    # (profiles, the optimisation log) is kept.
    old = open(OUT).read() if os.path.exists(OUT) else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1]
    else:
        new = "# Performance\n\n" + BEGIN + "\n" + text + "\n" + END + "\n"
    with open(OUT, "w") as f:
        f.write(new)
    print()
    print(text)
    print()
    for measure, target, value, ok in targets:
        print("%-4s %s: %s (target %s)" % (verdict(ok), measure, value, target))
    print("wrote %s and %s" % (os.path.relpath(OUT, ROOT), os.path.relpath(CHART, ROOT)))


def main_tiers():
    """`scripts/bench.py tiers`: section 1d alone, printed, docs untouched."""
    if not os.path.exists(MODULE):
        sys.exit("bench: no module at %s (run `make build`)" % MODULE)
    server = Server(cell=False)
    try:
        m = machine(server)
        print("xcloak bench, tiers only: %s on %d CPUs (%s), port %d, commit %s" % (
            m["server"], m["nproc"], m["cpu"], server.port, m["commit"]), flush=True)
        tiers = section_tiers(server)
    finally:
        server.stop()
    lines = []
    tiers_table(lines.append, tiers)
    print()
    print("\n".join(lines))


def main_memory():
    """`scripts/bench.py memory`: sections 7 and 8 alone, printed, docs untouched."""
    server = Server()
    try:
        sha = server.client.call("SCRIPT", "LOAD", open(ARTICLE).read())
        m = machine(server)
        print("xcloak bench, memory only: %s, commit %s" % (m["server"], m["commit"]), flush=True)
        if "--refund" in sys.argv:
            section_refund(server)
            return
        if "--entries" in sys.argv:
            section_entries(server, "compact", COMPACT_SIZES, COMPACT_KEYS)
            return
        section_used_memory(server, sha)
        if "--attack" in sys.argv:
            section_attack(server, sha)
    finally:
        server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["memory"]:
        main_memory()
    elif sys.argv[1:] == ["tiers"]:
        main_tiers()
    else:
        main()
