#!/usr/bin/env python3
"""Writes the persistence fixtures of one xcloak build: tests/fixtures/<version>/.

Usage: python3 scripts/fixtures.py MODULE.so VERSION [--server redis-server]

Run it with a build of a released version (e.g. `git worktree add /tmp/v ced23cf;
cargo build --release` there) whenever the compact form's encoding changes, so
that every encoding version ever written keeps a committed sample that the
current build must load (tests/fixtures.rs loads every folder under
tests/fixtures/). It starts two fresh servers (free loopback ports, the module
loaded with `STORAGE compact`, `appendonly yes`, `appendfsync always`), one
with `aof-use-rdb-preamble yes` and one with `no`, and runs the same
deterministic workload on both (every call with `NOW`, no server clock in any
stored value):

  phase 1  windows of both forms (sorted set: `CONFIG SET xcloak.storage zset`;
           compact) of every shape the encoding has to get right;
  rewrite  BGREWRITEAOF: the base file holds phase 1 (RDB preamble, or the
           type's aof_rewrite `XCLOAK.APPLY key L <bytes>` and ZADDs);
  phase 2  more calls, so the incr file holds the effects as replicated
           (`XCLOAK.APPLY key T..R..A..E..`, `L` from XCLOAK.CONVERT, ZADD,
           ZREM, ZREMRANGEBYSCORE, PEXPIREAT);
  expiry   every key ends with PERSIST or PEXPIREAT 253402300799000 (9999-12-31):
           no key ever expires by the wall clock, and the expected expiry is exact.

Then `SAVE` on the first server gives dump.rdb, both AOF folders are copied
as the servers left them (manifest, base, incr), and expected.json records,
for every key: its type, its stored entries as runs [stamp, count], a sorted
set's members, its absolute expiry (-1: none), PEEK replies at a fixed NOW
(one and several tiers), an ALLOW ... DETAILS at that NOW run on a COPY and the
runs it leaves, and the key's DUMP payload (hex). The answers are read from
the build being recorded; the script checks that both servers agree.

Files: dump.rdb, aof-preamble/appendonlydir/*, aof-plain/appendonlydir/*,
expected.json. The server must be 7.0+ (multi-part AOF, module configs).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from scripts.bench.resp import Client  # noqa: E402  (the bench's RESP client)

T = 1_700_000_000_000
HOUR = 3_600_000
DAY = 86_400_000
MAX_MS = 2 ** 53 - 1
FAR = 253_402_300_799_000  # 9999-12-31T23:59:59Z, an absolute expiry
NOW_CHECK = T + 40 * DAY  # the fixed NOW of the recorded answers
PEEKS = [  # (tiers as [(window, limit), ...], cost)
    ([(60_000, 10)], 1),
    ([(DAY, 5000)], 1),
    ([(400 * DAY, 1_000_000)], 3),
    ([(MAX_MS, 1_000_000)], 1),
    ([(1000, 5), (HOUR, 100), (60 * DAY, 5000)], 1),
    ([(MAX_MS, 10), (1, 1)], 2),
]
PROBE = ([(60 * DAY, 1_000_000), (HOUR, 1000)], 2)  # the ALLOW run on a COPY


def free_port():
    # The tests' range (tests/common): 10000..=22767, never 6379.
    for port in range(10000 + os.getpid() % 5000, 22768):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    sys.exit("fixtures: no free port")


class Server:
    def __init__(self, server, module, preamble):
        self.dir = tempfile.mkdtemp(prefix="xcloak-fixtures-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--logfile", "server.log",
             "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--aof-use-rdb-preamble", "yes" if preamble else "no", "--enable-debug-command", "yes",
             "--loadmodule", os.path.abspath(module), "STORAGE", "compact"],
            cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                self.client = Client(self.port, raw=True)  # bytes: DUMP payloads are binary
                self.client.call("PING")
                break
            except (OSError, RuntimeError):
                if self.proc.poll() is not None or time.time() > deadline:
                    sys.exit("fixtures: the server did not start:\n" + self.log())
                time.sleep(0.05)

    def log(self):
        try:
            return open(os.path.join(self.dir, "server.log")).read()
        except OSError:
            return ""

    def rewrite(self):
        self.client.call("BGREWRITEAOF")
        deadline = time.time() + 60
        while time.time() < deadline:
            info = self.client.text("INFO", "persistence")
            if "aof_rewrite_in_progress:0" in info and "aof_rewrite_scheduled:0" in info:
                return
            time.sleep(0.1)
        sys.exit("fixtures: BGREWRITEAOF did not finish")

    def stop(self):
        try:
            self.client.call("SHUTDOWN", "NOSAVE")
        except Exception:
            pass
        self.proc.wait(timeout=30)


# --------------------------------------------------------------------------
# The workload. Every call names NOW; prefixes: z: sorted set, c: compact.

def allow(c, key, window, limit, now, cost=1, tiers=(), stamp=False):
    args = ["XCLOAK.ALLOW", key, window, limit]
    for w, l in tiers:
        args += ["TIER", w, l]
    args += ["COST", cost, "NOW", now]
    if stamp:
        args.append("STAMP")
    return c.call(*args)


def phase1(c, p):
    allow(c, p + "one", 60_000, 10, T)
    # Evenly spaced over a minute, filled to the limit (the memory bench's shape).
    for limit in (10, 100):
        for j in range(limit):
            allow(c, p + "spaced%d" % limit, 60_000, limit, T + j * 60_000 // limit)
    # Runs of one millisecond: repeated calls, COST, a run of 1,000.
    for now, cost in [(T, 1), (T, 1), (T, 1), (T + 1, 5), (T + 1, 1), (T + 2, 1000), (T + 3, 2), (T + 67, 1), (T + 67, 1)]:
        allow(c, p + "runs", DAY, 5000, now, cost)
    # Tiers: one log answering a second, an hour and a month (multi-byte gaps).
    for offset in [0, 1, 500, 999, 1000, 1001, HOUR - 1, HOUR, HOUR + 1, DAY, 7 * DAY + 12345, 29 * DAY]:
        allow(c, p + "tiers", 1000, 5, T + offset, 1, [(HOUR, 100), (30 * DAY, 1000)])
    # A clock stepping back: entries inserted before the newest.
    for offset in [1000, 2000, 1500, 1500, 999, 3000, 2999, 1, 2000]:
        allow(c, p + "stepback", DAY, 100, T + offset)
    # Refunds: the newest, a middle stamp, part of a COST, one run emptied.
    stamps = [allow(c, p + "refunded", DAY, 100, T + 10 * j, 1 + j % 3, stamp=True) for j in range(12)]
    c.call("XCLOAK.REFUND", p + "refunded", stamps[-1], "COST", 1)  # newest, part of its run
    c.call("XCLOAK.REFUND", p + "refunded", stamps[5], "COST", 3)  # a middle run, all of it
    c.call("XCLOAK.REFUND", p + "refunded", stamps[4], "COST", 1)  # a middle run, part of it
    c.call("XCLOAK.REFUND", p + "refunded", stamps[0], "COST", 1)  # the oldest
    # Trimmed: 40 entries, then a call 30 s later trims the older half.
    for j in range(40):
        allow(c, p + "trimmed", 60_000, 100, T + j * 1500)
    allow(c, p + "trimmed", 60_000, 100, T + 60_000 + 30_000)
    # The edges of time: stamps 0 and 2^53 - 1 in one window.
    allow(c, p + "edges", MAX_MS, 10, 0)
    allow(c, p + "edges", MAX_MS, 10, 0)
    allow(c, p + "edges", MAX_MS, 10, 1)
    allow(c, p + "edges", MAX_MS, 10, MAX_MS)
    # Thousands of entries with every varint width of gap, and some runs.
    gaps = [1, 63, 64, 127, 128, 700, 8191, 8192, 16383, 16384, 0, 2_097_151, 2_097_152, 3]
    now = T
    for j in range(3000):
        now += gaps[j % len(gaps)]
        allow(c, p + "large", 400 * DAY, 1_000_000, now, 3 if j % 17 == 0 else 1)
    if p == "c:":
        # Compact only (a sorted set would hold 100,000 members): big runs.
        allow(c, p + "bigrun", DAY, 200_000, T, 50_000)
        allow(c, p + "bigrun", DAY, 200_000, T + 1, 1)
        allow(c, p + "bigrun", DAY, 200_000, T + 2, 49_999)


def phase2(c, p):
    # After the rewrite: the incr file gets these effects.
    allow(c, p + "one", 60_000, 10, T + 5)                           # A (and E)
    allow(c, p + "trimmed", 60_000, 100, T + 60_000 + 45_000)        # T + A
    allow(c, p + "spaced10", 60_000, 10, T + 59_999)                 # a rejection: nothing
    allow(c, p + "spaced10", 60_000, 0, T + 60_000)                  # T only (trims the oldest)
    stamp = allow(c, p + "late", HOUR, 10, T + 7, 3, stamp=True)     # a new key
    c.call("XCLOAK.REFUND", p + "late", stamp, "COST", 1)            # R
    allow(c, p + "late", HOUR, 10, T + 6)                            # a step back
    c.call("XCLOAK.REFUND", p + "refunded", T + 30, "COST", 1)       # R of a middle stamp


def forms(c, body):
    """Runs `body(prefix)` once per form."""
    for form, prefix in (("zset", "z:"), ("compact", "c:")):
        c.call("CONFIG", "SET", "xcloak.storage", form)
        body(prefix)


def run_workload(server):
    c = server.client
    forms(c, lambda p: phase1(c, p))
    c.call("SET", "plain", "a string beside the windows")
    server.rewrite()
    forms(c, lambda p: phase2(c, p))
    # Conversions (the incr file gets DEL + XCLOAK.APPLY L, and DEL + ZADD).
    c.call("COPY", "z:runs", "c:converted")
    c.call("XCLOAK.CONVERT", "c:converted", "COMPACT")
    c.call("COPY", "c:runs", "z:converted")
    c.call("XCLOAK.CONVERT", "z:converted", "ZSET")
    for i, key in enumerate(sorted(keys(c))):
        if i % 2:
            c.call("PEXPIREAT", key, FAR)
        else:
            c.call("PERSIST", key)


def keys(c):
    return [k.decode() for k in c.call("KEYS", "*")]


# --------------------------------------------------------------------------
# What the build answers.

def runs_of(c, key):
    """Stored entries as [[stamp, count], ...], read through a sorted set."""
    kind = c.text("TYPE", key)
    source = key
    if kind == "xcloaklog":
        source = "{%s}:stamps" % key
        c.call("COPY", key, source, "REPLACE")
        c.call("XCLOAK.CONVERT", source, "ZSET")
    flat = c.call("ZRANGE", source, 0, -1, "WITHSCORES")
    if source != key:
        c.call("DEL", source)
    runs = []
    for score in flat[1::2]:
        stamp = int(float(score))
        if runs and runs[-1][0] == stamp:
            runs[-1][1] += 1
        else:
            runs.append([stamp, 1])
    return runs


def peek_args(key, tiers, cost, command="XCLOAK.PEEK"):
    args = [command, key, tiers[0][0], tiers[0][1]]
    for w, l in tiers[1:]:
        args += ["TIER", w, l]
    return args + ["COST", cost, "NOW", NOW_CHECK]


def fnv1a64(items):
    """FNV-1a (64 bits) of the items, each followed by a newline: a short,
    dependency-free fingerprint of a large sorted set's members."""
    h = 0xcbf29ce484222325
    for item in items:
        for byte in item + b"\n":
            h = ((h ^ byte) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h


def after_allow(runs, drop, now, cost):
    """`runs` with the first `drop` runs trimmed and `cost` entries added at `now`."""
    left = [list(r) for r in runs[drop:]]
    for r in left:
        if r[0] == now:
            r[1] += cost
            return left
    left.append([now, cost])
    return sorted(left)


MAX_INLINE_DUMP = 4096  # bytes: larger sorted-set payloads are left out (the RDB and AOFs hold them)


def answers(server):
    c = server.client
    out = {}
    for key in sorted(keys(c)):
        kind = c.text("TYPE", key)
        entry = {"type": kind}
        if kind == "string":
            entry["value"] = c.text("GET", key)
        else:
            runs = runs_of(c, key)
            entry["runs"] = runs
            if kind == "zset":
                members = c.call("ZRANGE", key, 0, -1)
                entry["members_fnv1a64"] = fnv1a64(members)
                if len(members) <= 200:
                    entry["members"] = [m.decode() for m in members]
            entry["peek"] = [c.call(*peek_args(key, tiers, cost)) for tiers, cost in PEEKS]
            probe = "{%s}:probe" % key
            c.call("COPY", key, probe, "REPLACE")
            tiers, cost = PROBE
            entry["allow"] = c.call(*peek_args(probe, tiers, cost, "XCLOAK.ALLOW"), "DETAILS", "STAMP")
            # What that ALLOW left: a trimmed prefix of the runs and, if it
            # admitted, its entries (checked here against the real result).
            left = runs_of(c, probe)
            cutoff = NOW_CHECK - max(w for w, _ in tiers)
            drop = sum(1 for stamp, _ in runs if stamp <= cutoff)
            added = cost if entry["allow"][0] == 1 else 0
            expected = after_allow(runs, drop, NOW_CHECK, added) if added else runs[drop:]
            if left != expected:
                sys.exit("fixtures: %s after ALLOW is not its trimmed runs plus the admission" % key)
            entry["allow_trims_runs"] = drop
            c.call("DEL", probe)
        entry["pexpiretime"] = c.call("PEXPIRETIME", key)
        dump = c.call("DUMP", key)
        if kind != "zset" or len(dump) <= MAX_INLINE_DUMP:
            entry["dump"] = dump.hex()
        out[key] = entry
    return out


def write_expected(path, expected):
    """JSON with one line per key: readable, and small enough to diff."""
    keys_ = expected.pop("keys")
    head = json.dumps(expected, indent=1, sort_keys=True)
    lines = [json.dumps(k) + ": " + json.dumps(v, sort_keys=True, separators=(",", ":")) for k, v in sorted(keys_.items())]
    with open(path, "w") as f:
        f.write(head[:-2] + ',\n "keys": {\n  ' + ",\n  ".join(lines) + "\n }\n}\n")
    with open(path) as f:
        json.load(f)  # well-formed


def main():
    args = sys.argv[1:]
    server_binary = "redis-server"
    if "--server" in args:
        i = args.index("--server")
        server_binary = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2 or not os.path.exists(args[0]):
        sys.exit(__doc__)
    module, version = args
    target = os.path.join(ROOT, "tests", "fixtures", version)
    servers = [Server(server_binary, module, preamble) for preamble in (True, False)]
    try:
        for server in servers:
            run_workload(server)
        servers[0].client.call("SAVE")
        # The files as the servers left them (appendfsync always: complete),
        # before the answers are read (their probes would add to the AOF).
        if os.path.exists(target):
            shutil.rmtree(target)
        os.makedirs(target)
        shutil.copy(os.path.join(servers[0].dir, "dump.rdb"), os.path.join(target, "dump.rdb"))
        for server, name in zip(servers, ("aof-preamble", "aof-plain")):
            shutil.copytree(os.path.join(server.dir, "appendonlydir"), os.path.join(target, name, "appendonlydir"))
        recorded = [answers(server) for server in servers]
        if recorded[0] != recorded[1]:
            diff = [k for k in recorded[0] if recorded[0].get(k) != recorded[1].get(k)]
            sys.exit("fixtures: the two servers disagree on %s" % diff)
        info = servers[0].client.text("INFO", "server")
        field = lambda name: next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith(name + ":")), "?")  # noqa: E731
        modules = servers[0].client.call("MODULE", "LIST")
        xcloak_ver = next(m[3] for m in modules if m[1] == b"xcloak")
    finally:
        for server in servers:
            server.stop()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    expected = {
        "version": version,
        "written_by": {"server": "%s %s" % ("Valkey" if "valkey" in info else "Redis", field("redis_version")),
                       "rdb_version_note": "RDB and DUMP payloads carry the writing server's RDB version",
                       "module_ver": xcloak_ver, "module": os.path.basename(module),
                       "generated_at_commit": commit},
        "now": NOW_CHECK,
        "peeks": [{"tiers": tiers, "cost": cost} for tiers, cost in PEEKS],
        "probe": {"tiers": PROBE[0], "cost": PROBE[1]},
        "far_expiry": FAR,
        "keys": recorded[0],
    }
    write_expected(os.path.join(target, "expected.json"), expected)
    for server in servers:
        shutil.rmtree(server.dir, ignore_errors=True)
    files = sorted(os.path.relpath(os.path.join(d, f), target) for d, _, fs in os.walk(target) for f in fs)
    print("fixtures: wrote %s: %s (%d keys)" % (os.path.relpath(target, ROOT), ", ".join(files), len(recorded[0])))


if __name__ == "__main__":
    main()
