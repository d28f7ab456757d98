#!/usr/bin/env python3
"""Writes clients/conformance/vectors.json: the client contract (docs/clients.md) as data.

Each case is a sequence of calls with an explicit NOW. This script runs the
calls against a live redis-server with the freshly built module (sorted-set
storage) and records, per call, the exact command a client sends, the
server's raw reply, and the Decision and HTTP headers the contract derives
from that reply. `acquire` and `allow_all` are played out against the server
by the contract's algorithms (docs/clients.md), on a virtual clock, and their
calls recorded in order.

    python3 clients/conformance/generate.py [--module target/release/libxcloak.so]
                                            [--server redis-server] [--check]

--check writes nothing and fails if the committed file differs from what the
server answers now. tests/conformance.rs (in `make test`) replays the file
against the module on both storage forms and against the Lua scripts, so the
vectors can't drift from the server; every client package runs them through
its own API. Standard library only.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "vectors.json"

MAX_EXACT_MS = 2**53 - 1
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z: every NOW is explicit


# --------------------------------------------------------------- a RESP client

class ServerError(Exception):
    pass


class Resp:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._read()

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b":":
            return int(rest)
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return ServerError(rest.decode())
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data.decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise ValueError(f"unexpected reply {line!r}")


def start_server(binary, module):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    workdir = tempfile.mkdtemp(prefix="xcloak-vectors-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--loadmodule", str(module)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
        try:
            conn = Resp(port)
            if conn.call("PING") == "PONG":
                return proc, conn
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            sys.exit(f"generate.py: {binary} with {module} did not start")
        time.sleep(0.05)


# ------------------------------------------------------ the contract, in Python

def ceil_s(ms):
    return (ms + 999) // 1000


def default_name(window_ms, limit):
    if window_ms % 1000 == 0:
        return f"{limit}-in-{window_ms // 1000}s"
    return f"{limit}-in-{window_ms}ms"


def allow_command(key, window, limit, tiers=(), cost=None, now=None, stamp=False, peek=False, oldest=False):
    cmd = ["XCLOAK.PEEK" if peek else "XCLOAK.ALLOW", key, str(window), str(limit)]
    for w, l in tiers:
        cmd += ["TIER", str(w), str(l)]
    if cost is not None and cost != 1:
        cmd += ["COST", str(cost)]
    if now is not None:
        cmd += ["NOW", str(now)]
    if not peek:
        cmd.append("DETAILS")
        if stamp:
            cmd.append("STAMP")
    elif oldest:
        cmd.append("OLDEST")
    return cmd


def refund_command(key, stamp, cost=None):
    cmd = ["XCLOAK.REFUND", key, str(stamp)]
    if cost is not None and cost != 1:
        cmd += ["COST", str(cost)]
    return cmd


def decision(reply, window, tiers, stamp):
    """The contract's Decision from a DETAILS (or PEEK) reply (a PEEK ... OLDEST
    reply without its last element)."""
    allowed, limit, remaining, retry, reset = reply[:5]
    rest = reply[5:]
    per_tier = []
    if tiers:
        per_tier = [dict(window_ms=t[0], limit=t[1], remaining=t[2], retry_after_ms=t[3], reset_after_ms=t[4])
                    for t in rest[0]]
        rest = rest[1:]
    stamp_value = None
    if stamp:
        stamp_value = rest[0] if rest[0] >= 0 else None
        rest = rest[1:]
    assert not rest, reply
    binding, binding_window = 0, window
    for i, t in enumerate(per_tier):
        if (t["limit"], t["remaining"], t["retry_after_ms"], t["reset_after_ms"]) == (limit, remaining, retry, reset):
            binding, binding_window = i, t["window_ms"]
            break
    else:
        assert not per_tier, f"no tier matches the binding fields of {reply}"
    return dict(allowed=bool(allowed), limit=limit, remaining=remaining, retry_after_ms=retry,
                reset_after_ms=reset, cost_exceeds_limit=retry == -1, window_ms=binding_window,
                tier=binding, tiers=per_tier, stamp=stamp_value)


def policies(d, names):
    rows = d["tiers"] or [dict(window_ms=d["window_ms"], limit=d["limit"], remaining=d["remaining"],
                               reset_after_ms=d["reset_after_ms"])]
    names = names or [default_name(t["window_ms"], t["limit"]) for t in rows]
    assert len(names) == len(rows)
    return ([f'"{n}";q={t["limit"]};w={ceil_s(t["window_ms"])}' for n, t in zip(names, rows)],
            [f'"{n}";r={t["remaining"]};t={ceil_s(t["reset_after_ms"])}' for n, t in zip(names, rows)])


def headers(decisions, binding, names_per_decision):
    """{"ietf": ..., "legacy": ...} for one decision or a MultiDecision."""
    policy, state = [], []
    for d, names in zip(decisions, names_per_decision):
        p, s = policies(d, names)
        policy += p
        state += s
    ietf = {"RateLimit-Policy": ", ".join(policy), "RateLimit": ", ".join(state)}
    legacy = {"RateLimit-Limit": str(binding["limit"]), "RateLimit-Remaining": str(binding["remaining"]),
              "RateLimit-Reset": str(ceil_s(binding["reset_after_ms"]))}
    if not binding["allowed"] and binding["retry_after_ms"] > 0:
        ietf["Retry-After"] = legacy["Retry-After"] = str(ceil_s(binding["retry_after_ms"]))
    return {"ietf": ietf, "legacy": legacy}


def encode(reply):
    if isinstance(reply, ServerError):
        return {"error": str(reply)}
    return reply


# ------------------------------------------------------------------ the cases

def inputs(op, key, window, limit, tiers, cost):
    """A step's inputs as a client receives them (absent when defaulted)."""
    step = {"op": op, "key": key, "window": window, "limit": limit}
    if tiers:
        step["tiers"] = [list(t) for t in tiers]
    if cost is not None:
        step["cost"] = cost
    return step


class Case:
    def __init__(self, conn, name, description):
        self.conn = conn
        self.out = {"name": name, "description": description, "steps": []}
        conn.call("FLUSHALL")

    def _send(self, cmd):
        reply = self.conn.call(*cmd)
        # Keys must not expire by the wall clock while a client replays a case.
        for key in {cmd[1]} if len(cmd) > 1 and cmd[0].upper().startswith("XCLOAK.") else ():
            self.conn.call("PERSIST", key)
        return reply

    def setup(self, *cmd):
        cmd = [str(c) for c in cmd]
        self.out["steps"].append({"op": "setup", "command": cmd, "reply": encode(self.conn.call(*cmd))})

    def raw(self, *cmd):
        cmd = [str(c) for c in cmd]
        reply = self._send(cmd)
        self.out["steps"].append({"op": "raw", "command": cmd, "reply": encode(reply)})
        return reply

    def _call(self, op, key, window, limit, now, cost=None, tiers=(), stamp=False, names=None, oldest=False):
        cmd = allow_command(key, window, limit, tiers, cost, now, stamp, peek=op == "peek", oldest=oldest)
        reply = self._send(cmd)
        step = inputs(op, key, window, limit, tiers, cost)
        if now is not None:
            step["now"] = now
        if stamp:
            step["stamp"] = True
        if names:
            step["names"] = names
        if oldest:
            step["oldest"] = True
        step["command"] = cmd
        step["reply"] = encode(reply)
        if isinstance(reply, ServerError):
            step["error"] = str(reply)
        else:
            if oldest:
                # The oldest live entry of the binding tier's window: -1 (none) as null.
                step["oldest_ms"] = reply[-1] if reply[-1] >= 0 else None
                reply = reply[:-1]
            d = decision(reply, window, tiers, stamp)
            step["decision"] = d
            step["headers"] = headers([d], d, [names])
        self.out["steps"].append(step)
        return step.get("decision")

    def allow(self, key, window, limit, now, **kw):
        return self._call("allow", key, window, limit, now, **kw)

    def peek(self, key, window, limit, now, **kw):
        return self._call("peek", key, window, limit, now, **kw)

    def refund(self, key, stamp, cost=None):
        cmd = refund_command(key, stamp, cost)
        reply = self._send(cmd)
        step = {"op": "refund", "key": key, "stamp": stamp}
        if cost is not None:
            step["cost"] = cost
        step["command"] = cmd
        step["reply"] = encode(reply)
        if isinstance(reply, ServerError):
            step["error"] = str(reply)
        else:
            step["removed"] = reply
        self.out["steps"].append(step)

    def reset(self, key):
        reply = self.conn.call("DEL", key)
        self.out["steps"].append({"op": "reset", "key": key, "command": ["DEL", key], "reply": reply,
                                  "existed": reply == 1})

    def acquire(self, key, window, limit, start, max_wait_ms, cost=None, tiers=(), jitter_fraction=0.0,
                random=()):
        """docs/clients.md, acquire: on a virtual clock starting at `start`."""
        now, deadline, draws = start, start + max_wait_ms, list(random)
        calls = []
        while True:
            cmd = allow_command(key, window, limit, tiers, cost, now)
            reply = self._send(cmd)
            d = decision(reply, window, tiers, False)
            call = {"now": now, "command": cmd, "reply": reply, "sleep_ms": None}
            calls.append(call)
            if d["allowed"]:
                outcome = "admitted"
                break
            if d["cost_exceeds_limit"]:
                outcome = "never"
                break
            left = deadline - now
            if d["retry_after_ms"] > left:
                outcome = "deadline"
                break
            u = draws.pop(0) if jitter_fraction else 0.0
            jitter = int(d["retry_after_ms"] * jitter_fraction * u)
            sleep = max(1, min(d["retry_after_ms"] + jitter, left))
            call["sleep_ms"] = sleep
            now += sleep
        step = inputs("acquire", key, window, limit, tiers, cost)
        step.update(start=start, max_wait_ms=max_wait_ms, jitter_fraction=jitter_fraction,
                    random=list(random), calls=calls, outcome=outcome, decision=d)
        assert not draws, "unused random draws"
        self.out["steps"].append(step)

    def allow_all(self, requests, now, names=None):
        """docs/clients.md, allow_all: in order, STAMP each, refund the earlier ones on a rejection."""
        calls, decisions, rejected = [], [], None
        for i, r in enumerate(requests):
            tiers = r.get("tiers", ())
            cmd = allow_command(r["key"], r["window"], r["limit"], tiers, r.get("cost"), now, stamp=True)
            reply = self._send(cmd)
            calls.append({"command": cmd, "reply": reply})
            d = decision(reply, r["window"], tiers, True)
            decisions.append(d)
            if not d["allowed"]:
                rejected = i
                break
        if rejected is not None:
            for r, d in zip(requests, decisions[:rejected]):
                cmd = refund_command(r["key"], d["stamp"], r.get("cost"))
                calls.append({"command": cmd, "reply": self._send(cmd)})
        if rejected is not None:
            binding = rejected
        else:
            binding = min(range(len(decisions)), key=lambda i: (decisions[i]["remaining"], i))
        step = {"op": "allow_all", "requests": [dict(r, tiers=[list(t) for t in r["tiers"]]) if "tiers" in r else r
                                                for r in requests], "now": now}
        if names:
            step["names"] = names
        step.update(calls=calls, allowed=rejected is None, rejected=rejected, binding=binding,
                    decisions=decisions,
                    headers=headers(decisions, decisions[binding], (names or [None] * len(requests))[:len(decisions)]))
        self.out["steps"].append(step)


def cases(conn):
    out = []

    def case(name, description):
        c = Case(conn, name, description)
        out.append(c.out)
        return c

    # --- plain
    c = case("plain", "3 a minute: three admitted, the fourth waits for the oldest, which then leaves")
    for dt in (0, 100, 200, 300):
        c.allow("plain", 60000, 3, T0 + dt)
    c.allow("plain", 60000, 3, T0 + 60000)
    c.allow("plain", 60000, 3, T0 + 60099)
    c.allow("plain", 60000, 3, T0 + 60100)

    c = case("plain-exact-boundary", "an entry stamped t counts while now - window < t: it leaves at t + window exactly")
    c.allow("boundary", 60000, 1, T0)
    c.allow("boundary", 60000, 1, T0 + 59999)
    c.allow("boundary", 60000, 1, T0 + 60000)

    c = case("plain-bare-replies", "without DETAILS the reply is 1/0, with STAMP alone the stamp or -1 (raw: no client sends these)")
    c.raw("XCLOAK.ALLOW", "bare", 60000, 1, "NOW", T0)
    c.raw("XCLOAK.ALLOW", "bare", 60000, 1, "NOW", T0 + 1)
    c.raw("XCLOAK.ALLOW", "bare", 60000, 2, "NOW", T0 + 2, "STAMP")
    c.raw("XCLOAK.ALLOW", "bare", 60000, 2, "NOW", T0 + 3, "STAMP")

    c = case("plain-limit-zero", "a limit of 0 admits nothing, and the request can never fit")
    c.allow("zero", 60000, 0, T0)
    c.peek("zero", 60000, 0, T0)

    c = case("plain-reset", "reset deletes one identity's window; a missing window resets to nothing")
    c.allow("reset", 60000, 1, T0)
    c.allow("reset", 60000, 1, T0 + 1)
    c.reset("reset")
    c.allow("reset", 60000, 1, T0 + 2)
    c.reset("reset:missing")

    c = case("plain-clock-behind", "NOW behind the stored entries: they still count, waits never go negative")
    c.allow("behind", 60000, 2, T0 + 5000)
    c.allow("behind", 60000, 2, T0)
    c.allow("behind", 60000, 2, T0 + 1000)
    c.peek("behind", 60000, 2, T0)

    # --- cost
    c = case("cost-all-or-nothing", "COST 2 with 2 of 3 taken is rejected whole and records nothing")
    c.allow("cost", 60000, 3, T0)
    c.allow("cost", 60000, 3, T0 + 100)
    c.allow("cost", 60000, 3, T0 + 200, cost=2)
    c.allow("cost", 60000, 3, T0 + 300)
    c.allow("cost", 60000, 3, T0 + 400)

    c = case("cost-equal-limit", "a cost equal to the limit fits an empty window, then nothing else does")
    c.allow("cost-eq", 60000, 5, T0, cost=5)
    c.allow("cost-eq", 60000, 5, T0 + 10)
    c.allow("cost-eq", 60000, 5, T0 + 60000, cost=5)

    c = case("cost-above-limit", "a cost above the limit can never fit: retry_after -1, no Retry-After")
    c.allow("cost-big", 60000, 3, T0, cost=4)
    c.allow("cost-big", 60000, 3, T0 + 1)
    c.peek("cost-big", 60000, 3, T0 + 2, cost=4)
    c.allow("cost-big", 60000, 1000000, T0 + 3, cost=1000000)

    c = case("cost-retry-after", "retry_after is when the (count + cost - limit)-th oldest entry leaves")
    for dt in (0, 1000, 2000, 3000):
        c.allow("cost-retry", 60000, 4, T0 + dt)
    c.allow("cost-retry", 60000, 4, T0 + 4000, cost=3)
    c.peek("cost-retry", 60000, 4, T0 + 4000, cost=2)
    c.allow("cost-retry", 60000, 4, T0 + 63000, cost=3)

    # --- peek
    c = case("peek", "PEEK answers what ALLOW would decide and records nothing")
    c.peek("peek", 60000, 5, T0)
    c.allow("peek", 60000, 5, T0 + 100)
    c.allow("peek", 60000, 5, T0 + 200, cost=3)
    c.peek("peek", 60000, 5, T0 + 300)
    c.peek("peek", 60000, 5, T0 + 300, cost=2)
    c.peek("peek", 60000, 5, T0 + 300, cost=1)
    c.peek("peek", 60000, 5, T0 + 300, cost=6)
    c.allow("peek", 60000, 5, T0 + 400)
    c.peek("peek", 60000, 5, T0 + 60150)
    c.peek("peek", 60000, 5, T0 + 60250)
    c.setup("EXISTS", "peek:never-created")
    c.peek("peek:never-created", 60000, 5, T0)
    c.setup("EXISTS", "peek:never-created")

    c = case("peek-oldest", "PEEK ... OLDEST: where the binding tier's window starts (a moving window's start), null if empty")
    c.peek("oldest", 60000, 3, T0, oldest=True)
    c.allow("oldest", 60000, 3, T0 + 100)
    c.allow("oldest", 60000, 3, T0 + 200, cost=2)
    c.peek("oldest", 60000, 3, T0 + 300, oldest=True)
    c.peek("oldest", 60000, 3, T0 + 60100, oldest=True)
    c.peek("oldest", 60000, 3, T0 + 60200, oldest=True)
    c.peek("oldest", 1000, 3, T0 + 60150, tiers=[(60000, 3)], oldest=True)
    c.peek("oldest", 60000, 3, T0 + 60050, tiers=[(120000, 4)], oldest=True)
    c.peek("oldest", 60000, 3, T0 + 50, oldest=True)
    c.raw("XCLOAK.PEEK", "oldest", 60000, 3, "OLDEST", "OLDEST")
    c.raw("XCLOAK.ALLOW", "oldest", 60000, 3, "DETAILS", "OLDEST")

    # --- tiers
    c = case("tiers-two", "3 a second and 5 a minute (docs/commands.md): a rejection consumes neither tier")
    tiers = [(60000, 5)]
    c.allow("dave", 1000, 3, T0, tiers=tiers, cost=2)
    c.allow("dave", 1000, 3, T0 + 100, tiers=tiers)
    c.allow("dave", 1000, 3, T0 + 200, tiers=tiers)
    c.allow("dave", 1000, 3, T0 + 1000, tiers=tiers, cost=2)
    c.allow("dave", 1000, 3, T0 + 1500, tiers=tiers)
    c.peek("dave", 1000, 3, T0 + 1500, tiers=tiers)

    c = case("tiers-login", "5 a minute and 20 an hour on one key, with policy names")
    names = ["per-minute", "per-hour"]
    for i in range(5):
        c.allow("alice", 60000, 5, T0 + i * 1000, tiers=[(3600000, 20)], names=names)
    c.allow("alice", 60000, 5, T0 + 5000, tiers=[(3600000, 20)], names=names)

    c = case("tiers-admit-tie", "admitted: the tier with the fewest remaining binds; a tie goes to the earliest tier")
    c.allow("tie-a", 60000, 5, T0, tiers=[(120000, 5)])
    c.allow("tie-a", 60000, 5, T0 + 1, tiers=[(120000, 5), (60000, 5)])
    c.allow("tie-a", 120000, 9, T0 + 2, tiers=[(60000, 4), (90000, 4)])

    c = case("tiers-reject-tie", "rejected: the violated tier with the longest wait binds; a tie goes to the earliest")
    c.allow("tie-r", 60000, 1, T0, tiers=[(120000, 2)])
    c.allow("tie-r", 60000, 1, T0 + 60000, tiers=[(120000, 2)])
    c.allow("tie-r", 60000, 1, T0 + 60001, tiers=[(120000, 2)])
    c.allow("tie-r", 120000, 2, T0 + 60001, tiers=[(60000, 1)])
    c.peek("tie-r", 60000, 1, T0 + 60001, tiers=[(120000, 2), (60000, 1)])

    c = case("tiers-never-binds", "a tier whose limit is below the cost waits forever (-1), and -1 beats any wait")
    c.allow("never", 60000, 1, T0, tiers=[(120000, 5)])
    c.allow("never", 60000, 1, T0 + 1, tiers=[(120000, 5), (60000, 0)])
    c.allow("never", 60000, 5, T0 + 2, tiers=[(120000, 1)], cost=2)

    c = case("tiers-three", "a second, a minute and an hour")
    tiers = [(60000, 5), (3600000, 7)]
    for dt in (0, 10, 20, 1000, 1010, 2000, 2500, 3000):
        c.allow("three", 1000, 2, T0 + dt, tiers=tiers)
    c.allow("three", 1000, 2, T0 + 61000, tiers=tiers)
    c.allow("three", 1000, 2, T0 + 62000, tiers=tiers)

    c = case("tiers-four", "four tiers, a limit of 0 among them, and PEEK over all four")
    tiers = [(60000, 4), (600000, 6), (3600000, 8)]
    for dt in (0, 100, 600, 700, 1200):
        c.allow("four", 500, 2, T0 + dt, tiers=tiers)
    c.allow("four", 500, 2, T0 + 61000, tiers=tiers, cost=2)
    c.peek("four", 500, 2, T0 + 61000, tiers=tiers)
    c.peek("four", 500, 2, T0 + 61000, tiers=[(60000, 4), (600000, 0), (3600000, 8)])

    c = case("tiers-equal", "two tiers with the same window and limit: the first binds")
    c.allow("equal", 60000, 2, T0, tiers=[(60000, 2)])
    c.allow("equal", 60000, 2, T0 + 1, tiers=[(60000, 2)])
    c.allow("equal", 60000, 2, T0 + 2, tiers=[(60000, 2)])

    # --- stamps and refunds
    c = case("stamp", "STAMP: the admission's millisecond, none on a rejection, last after the tiers")
    c.allow("stamp", 60000, 2, T0, stamp=True)
    c.allow("stamp", 60000, 2, T0 + 7, stamp=True, cost=1)
    c.allow("stamp", 60000, 2, T0 + 9, stamp=True)
    c.allow("stamp:tiers", 60000, 2, T0, tiers=[(3600000, 3)], stamp=True)
    c.allow("stamp:tiers", 60000, 2, T0 + 1, tiers=[(3600000, 3)], stamp=True, cost=3)

    c = case("refund", "REFUND by stamp: exact, at most cost entries, a second refund finds nothing")
    c.allow("refund", 60000, 5, T0, stamp=True)
    c.allow("refund", 60000, 5, T0 + 100, stamp=True, cost=3)
    c.refund("refund", T0 + 100, cost=3)
    c.refund("refund", T0 + 100, cost=3)
    c.peek("refund", 60000, 5, T0 + 200)
    c.allow("refund", 60000, 5, T0 + 200, stamp=True, cost=2)
    c.refund("refund", T0 + 200)
    c.peek("refund", 60000, 5, T0 + 300)
    c.refund("refund", T0 + 200, cost=5)
    c.refund("refund", T0 + 999)
    c.refund("refund", T0)
    c.setup("EXISTS", "refund")
    c.refund("refund:missing", T0)

    c = case("refund-same-millisecond", "two admissions in one millisecond: a refund gives back one, not both")
    c.allow("same-ms", 60000, 3, T0, stamp=True)
    c.allow("same-ms", 60000, 3, T0, stamp=True)
    c.refund("same-ms", T0)
    c.allow("same-ms", 60000, 3, T0 + 1, cost=2)
    c.allow("same-ms", 60000, 3, T0 + 2)

    c = case("refund-expired", "an expired entry is still stored until the next admission's trim")
    c.allow("expired", 60000, 2, T0, stamp=True)
    c.allow("expired", 60000, 2, T0 + 10, stamp=True)
    c.peek("expired", 60000, 2, T0 + 60005)
    c.refund("expired", T0)
    c.allow("expired", 60000, 2, T0 + 70011, stamp=True)
    c.refund("expired", T0 + 10)

    c = case("refund-then-allow", "count only failures: reserve, refund the success, the window holds the failures")
    for i in range(3):
        d = c.allow("login", 60000, 2, T0 + i * 10, stamp=True)
        c.refund("login", d["stamp"])
    c.allow("login", 60000, 2, T0 + 100, stamp=True)
    c.allow("login", 60000, 2, T0 + 110, stamp=True)
    c.allow("login", 60000, 2, T0 + 120, stamp=True)

    # --- errors through the typed API (each names its argument and changes nothing)
    c = case("errors", "every bad argument: the server's text, verbatim, and no change")
    c.allow("err", 60000, 3, T0)
    c.allow("err", 0, 3, T0)
    c.allow("err", MAX_EXACT_MS + 1, 3, T0)
    c.allow("err", -1, 3, T0)
    c.allow("err", 60000, -1, T0)
    c.allow("err", 60000, 1000001, T0)
    c.allow("err", 60000, 3, T0, cost=0)
    c.allow("err", 60000, 3, T0, cost=1000001)
    c.allow("err", 60000, 3, T0, cost=-5)
    c.allow("err", 60000, 3, -1)
    c.allow("err", 60000, 3, MAX_EXACT_MS + 1)
    c.allow("err", 60000, 3, T0, tiers=[(0, 1)])
    c.allow("err", 60000, 3, T0, tiers=[(1000, 1), (60000, -1)])
    c.allow("err", 60000, 3, T0, tiers=[(1000, 1), (MAX_EXACT_MS + 1, 1)])
    c.allow("err", 60000, 3, T0, tiers=[(1000 + i, 1) for i in range(16)])
    c.peek("err", 0, 3, T0)
    c.peek("err", 60000, 1000001, T0)
    c.peek("err", 60000, 3, T0, cost=0)
    c.peek("err", 60000, 3, -1)
    c.peek("err", 60000, 3, T0, tiers=[(1000, 1), (60000, 1000001)])
    c.refund("err", -1)
    c.refund("err", MAX_EXACT_MS + 1)
    c.refund("err", T0, cost=0)
    c.refund("err", T0, cost=1000001)
    c.peek("err", 60000, 3, T0 + 1)
    c.setup("SET", "err:string", "text")
    c.allow("err:string", 60000, 3, T0)
    c.peek("err:string", 60000, 3, T0)
    c.refund("err:string", T0)
    c.setup("GET", "err:string")

    c = case("errors-grammar", "what a typed API can't send: unknown or repeated options, missing values (raw)")
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "FAST")
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "COST")
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "COST", 1, "COST", 1)
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "NOW", T0, "now", T0)
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "DETAILS", "DETAILS")
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "TIER", 1000)
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "COST", "NOW", 5)
    c.raw("XCLOAK.ALLOW", "gr", "60s", 3)
    c.raw("XCLOAK.ALLOW", "gr", 60000, "1.5")
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "TIER", 1000, "COST", 2)
    c.raw("XCLOAK.PEEK", "gr", 60000, 3, "DETAILS")
    c.raw("XCLOAK.PEEK", "gr", 60000, 3, "STAMP")
    c.raw("XCLOAK.PEEK", "gr", 60000, 3, "OLDEST", 5)
    c.raw("XCLOAK.REFUND", "gr", T0, "NOW", 5)
    c.raw("XCLOAK.REFUND", "gr", "abc")
    c.raw("XCLOAK.ALLOW", "gr", 60000, 3, "NOW", T0, "STAMP", "DETAILS")

    # --- windows up to 2^53 - 1
    c = case("huge-windows", "windows and stamps up to 2^53 - 1 are exact")
    c.allow("huge", MAX_EXACT_MS, 2, T0)
    c.allow("huge", MAX_EXACT_MS, 2, T0 + 1)
    c.allow("huge", MAX_EXACT_MS, 2, T0 + 2)
    c.peek("huge", MAX_EXACT_MS, 2, T0 + 3, tiers=[(60000, 5)])
    c.allow("huge:now", 60000, 2, MAX_EXACT_MS - 1, stamp=True)
    c.allow("huge:now", 60000, 2, MAX_EXACT_MS, stamp=True)
    c.allow("huge:now", 60000, 2, MAX_EXACT_MS)
    c.allow("huge:tier", 1000, 5, T0, tiers=[(MAX_EXACT_MS, 1)])
    c.allow("huge:tier", 1000, 5, T0 + 2000, tiers=[(MAX_EXACT_MS, 1)])
    c.allow("huge:zero", 60000, 1, 0, stamp=True)
    c.allow("huge:zero", 60000, 1, 1)

    c = case("small-window", "a window of 1 ms (one call: the key lives about a second)")
    c.allow("small", 1, 1, T0)

    # --- acquire
    c = case("acquire-free", "acquire on a window with room: admitted at once, no sleep")
    c.acquire("acq-free", 60000, 2, T0, 1000)

    c = case("acquire-waits", "acquire sleeps the server's retry-after, then is admitted")
    c.allow("acq", 60000, 2, T0 - 59500)
    c.allow("acq", 60000, 2, T0 - 59000)
    c.acquire("acq", 60000, 2, T0, 2000)
    c.acquire("acq", 60000, 2, T0 + 500, 500, cost=2)

    c = case("acquire-deadline", "retry-after beyond the deadline: acquire returns the rejection without sleeping")
    c.allow("acq-dl", 60000, 1, T0 - 59000)
    c.acquire("acq-dl", 60000, 1, T0, 999)
    c.acquire("acq-dl", 60000, 1, T0, 1000)

    c = case("acquire-never", "a cost above the limit: acquire stops at once")
    c.acquire("acq-never", 60000, 2, T0, 60000, cost=3)

    c = case("acquire-jitter", "jitter adds floor(retry * fraction * u) and is cut at the deadline")
    c.allow("acq-j", 60000, 1, T0 - 59500)
    c.acquire("acq-j", 60000, 1, T0, 5000, jitter_fraction=0.5, random=[0.5])
    c.allow("acq-j2", 60000, 1, T0 - 59500)
    c.acquire("acq-j2", 60000, 1, T0, 600, jitter_fraction=0.5, random=[0.9])
    c.allow("acq-j3", 60000, 1, T0 - 59999)
    c.acquire("acq-j3", 60000, 1, T0, 10, jitter_fraction=0.1, random=[0.99])

    c = case("acquire-tiers", "acquire with tiers waits for the binding tier's figure")
    c.allow("acq-t", 1000, 1, T0 - 200, tiers=[(60000, 3)])
    c.allow("acq-t", 1000, 1, T0 - 59500, tiers=[(60000, 3)])
    c.allow("acq-t", 1000, 1, T0 - 59400, tiers=[(60000, 3)])
    c.acquire("acq-t", 1000, 1, T0, 3000, tiers=[(60000, 3)])

    # --- allow_all
    ip = {"key": "all:ip:203.0.113.7", "window": 60000, "limit": 100}
    acct = {"key": "all:account:alice", "window": 60000, "limit": 2, "tiers": [(3600000, 20)]}
    c = case("allow-all", "an address and an account, all or nothing; a rejection refunds the earlier admission")
    c.allow_all([ip, acct], T0)
    c.allow_all([ip, acct], T0 + 100, names=[["ip-per-minute"], ["per-minute", "per-hour"]])
    c.allow_all([ip, acct], T0 + 200)
    c.peek(ip["key"], 60000, 100, T0 + 300)
    c.peek(acct["key"], 60000, 2, T0 + 300, tiers=[(3600000, 20)])

    c = case("allow-all-middle", "three identities, the middle one full: the first is refunded, the third never asked")
    a = {"key": "all:a", "window": 60000, "limit": 10, "cost": 2}
    b = {"key": "all:b", "window": 60000, "limit": 1}
    z = {"key": "all:c", "window": 60000, "limit": 10}
    c.allow("all:b", 60000, 1, T0)
    c.allow_all([a, b, z], T0 + 1)
    c.peek("all:a", 60000, 10, T0 + 2)
    c.peek("all:c", 60000, 10, T0 + 2)

    c = case("allow-all-last", "the last of three rejects: both earlier admissions are refunded, in order")
    a = {"key": "all:x", "window": 60000, "limit": 3, "cost": 2}
    b = {"key": "all:y", "window": 120000, "limit": 3, "cost": 2}
    z = {"key": "all:z", "window": 60000, "limit": 1, "cost": 2}
    c.allow_all([a, b, z], T0)
    c.peek("all:x", 60000, 3, T0 + 1)
    c.peek("all:y", 120000, 3, T0 + 1)
    c.allow_all([a, b], T0 + 2)

    c = case("allow-all-first", "the first rejects: nothing else is sent")
    c.allow("all:first", 60000, 1, T0)
    c.allow_all([{"key": "all:first", "window": 60000, "limit": 1}, {"key": "all:second", "window": 60000, "limit": 1}], T0 + 1)
    c.setup("EXISTS", "all:second")

    c = case("allow-all-binding", "all admitted: the decision with the fewest remaining binds (ties: the earliest)")
    c.allow_all([{"key": "all:p", "window": 60000, "limit": 4}, {"key": "all:q", "window": 60000, "limit": 3},
                 {"key": "all:r", "window": 60000, "limit": 3}], T0)
    return out


def dump(data):
    """One case a block, one step a line: a diff shows which call changed."""
    line = lambda value: json.dumps(value, separators=(", ", ": "))
    out = ["{", f' "schema": {data["schema"]},', f' "about": {line(data["about"])},', ' "cases": [']
    for i, case in enumerate(data["cases"]):
        out.append(f'  {{"name": {line(case["name"])}, "description": {line(case["description"])}, "steps": [')
        out += [f"   {line(step)}," for step in case["steps"]]
        out[-1] = out[-1].rstrip(",")
        out.append("  ]}" + ("," if i + 1 < len(data["cases"]) else ""))
    out += [" ]", "}", ""]
    text = "\n".join(out)
    assert json.loads(text) == data
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default=str(ROOT / "target/release/libxcloak.so"))
    parser.add_argument("--server", default=os.environ.get("XCLOAK_SERVER", "redis-server"))
    parser.add_argument("--check", action="store_true", help="fail if vectors.json differs; write nothing")
    args = parser.parse_args()
    proc, conn = start_server(args.server, args.module)
    try:
        data = {
            "schema": 1,
            "about": "The xcloak client contract as data (docs/clients.md, clients/conformance/README.md). "
                     "Written by clients/conformance/generate.py from a live server; do not edit by hand.",
            "cases": cases(conn),
        }
    finally:
        proc.terminate()
        proc.wait()
    text = dump(data)
    if args.check:
        if OUT.read_text() != text:
            sys.exit("generate.py --check: clients/conformance/vectors.json differs from what the server answers")
        print("vectors.json is up to date")
        return
    OUT.write_text(text)
    steps = sum(len(c["steps"]) for c in data["cases"])
    print(f"wrote {OUT.relative_to(ROOT)}: {len(data['cases'])} cases, {steps} steps")


if __name__ == "__main__":
    main()
