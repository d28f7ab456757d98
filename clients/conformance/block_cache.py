#!/usr/bin/env python3
"""Writes clients/conformance/block_cache.json: the block cache's rules as data.

The block cache (docs/clients.md, "Block cache") is a pure component of every
package: after a server rejection with retry_after > 0 it remembers the key
until local-monotonic-now + retry_after, and answers later requests of the
same shape and a cost at least as large without a call. These vectors drive
that component alone, on a virtual monotonic clock (`at`, in ms):

- a step with "sent": true must miss; its "reply" is what the server answered
  (recorded here from a live server with the module, at NOW = T0 + at), and the
  package records it as sent at `at`;
- a step with "sent": false must hit and return exactly "decision" (with
  "via": "cache"), whose headers are "headers";
- "forget" is what refund and reset do; "size" checks the entries held.

The expected cache answers come from the reference model below (Cache), the
contract in executable form. Standard library only; the server part reuses
generate.py's.

    python3 clients/conformance/block_cache.py [--module ...] [--check]
"""

import argparse
import json
import os
import sys
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402  (the vectors' server, commands, Decision and headers)

OUT = Path(__file__).resolve().parent / "block_cache.json"


class Cache:
    """The contract's block cache: one entry per key, least recently used out."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.entries = OrderedDict()

    def lookup(self, key, sig, cost, at):
        entry = self.entries.get(key)
        if entry is None:
            return None
        if at >= entry["deadline"]:
            del self.entries[key]  # an expired entry is dropped when met
            return None
        if entry["sig"] != sig or cost < entry["cost"]:
            return None  # another shape, or a smaller cost: the server decides
        if cost > min([sig[1]] + [limit for _, limit in sig[2]]):
            return None  # above a tier's limit: it can never fit, and the server says so (-1)
        self.entries.move_to_end(key)
        elapsed = at - entry["sent_at"]
        d = entry["decision"]
        age = lambda ms: max(0, ms - elapsed)  # noqa: E731
        return dict(allowed=False, limit=d["limit"], remaining=0, retry_after_ms=max(1, entry["deadline"] - at),
                    reset_after_ms=age(d["reset_after_ms"]), cost_exceeds_limit=False, window_ms=d["window_ms"],
                    tier=d["tier"],
                    tiers=[dict(t, retry_after_ms=age(t["retry_after_ms"]), reset_after_ms=age(t["reset_after_ms"]))
                           for t in d["tiers"]],
                    stamp=None, via="cache")

    def record(self, key, sig, cost, d, sent_at):
        if d["allowed"]:
            self.entries.pop(key, None)  # the window opened: someone refunded
            return
        if d["retry_after_ms"] <= 0:
            return  # never fits: nothing to wait for
        self.entries.pop(key, None)
        self.entries[key] = dict(sig=sig, cost=cost, sent_at=sent_at, deadline=sent_at + d["retry_after_ms"],
                                 decision=d)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def forget(self, key):
        self.entries.pop(key, None)


class Run:
    """Plays one case against the server and the model, writing its steps."""

    def __init__(self, conn, name, description, capacity=10_000):
        self.conn, self.cache = conn, Cache(capacity)
        self.case = {"name": name, "description": description, "capacity": capacity, "steps": []}
        self.prefix = f"bc:{name}:"

    def allow(self, at, key, window, limit, tiers=(), cost=1, expect=None):
        sig = (window, limit, tuple(tuple(t) for t in tiers))
        step = {"op": "allow", "at": at, "key": key, "window": window, "limit": limit,
                "tiers": [list(t) for t in tiers], "cost": cost}
        cached = self.cache.lookup(key, sig, cost, at)
        if cached is not None:
            assert expect in (None, "hit"), f"{self.case['name']} at {at}: the model hit, the case expects {expect}"
            step.update(sent=False, decision=cached, headers=g.headers([cached], cached, [None]))
        else:
            assert expect in (None, "sent"), f"{self.case['name']} at {at}: the model missed, the case expects {expect}"
            cmd = g.allow_command(self.prefix + key, window, limit, tiers, cost, now=g.T0 + at)
            reply = self.conn.call(*cmd)
            self.cache.record(key, sig, cost, g.decision(reply, window, tiers, False), at)
            step.update(sent=True, reply=reply)
        self.case["steps"].append(step)

    def forget(self, at, key):
        self.cache.forget(key)
        self.case["steps"].append({"op": "forget", "at": at, "key": key})

    def size(self, at):
        self.case["steps"].append({"op": "size", "at": at, "entries": len(self.cache.entries)})


def cases(conn):
    out = []

    r = Run(conn, "expiry", "A rejection is cached until sent_at + retry_after: retry_after counts down to 1 ms, "
                            "and at the deadline the request is sent again (and its admission clears the key).")
    r.allow(0, "k", 60000, 2, expect="sent")
    r.allow(10000, "k", 60000, 2, expect="sent")
    r.allow(20000, "k", 60000, 2, expect="sent")  # rejected: retry_after 40000
    r.allow(20001, "k", 60000, 2, expect="hit")
    r.allow(45000, "k", 60000, 2, expect="hit")
    r.allow(59999, "k", 60000, 2, expect="hit")
    r.size(59999)
    r.allow(60000, "k", 60000, 2, expect="sent")  # the deadline: sent, admitted
    r.size(60000)
    out.append(r.case)

    r = Run(conn, "cost", "A cost at least the rejected one's is answered by the cache; a smaller cost is sent. "
                          "A smaller cost rejected replaces the entry; an admission drops it.")
    r.allow(0, "k", 60000, 5, cost=3, expect="sent")
    r.allow(1000, "k", 60000, 5, cost=3, expect="sent")  # rejected: 2 left, cost 3
    r.allow(2000, "k", 60000, 5, cost=3, expect="hit")
    r.allow(2000, "k", 60000, 5, cost=5, expect="hit")
    r.allow(3000, "k", 60000, 5, cost=2, expect="sent")  # admitted: fits, drops the entry
    r.allow(4000, "k", 60000, 5, cost=3, expect="sent")  # sent again, rejected
    r.allow(5000, "k", 60000, 5, cost=1, expect="sent")  # rejected with cost 1: replaces the entry
    r.allow(6000, "k", 60000, 5, cost=1, expect="hit")
    r.allow(6000, "k", 60000, 5, cost=4, expect="hit")
    out.append(r.case)

    r = Run(conn, "shape", "Only a request of the same window, limit and tiers is answered: other tiers, another "
                           "window or limit are sent, and the entry stays until a rejection of the new shape "
                           "replaces it. Cached tiers are aged; the binding tier's index is kept.")
    tiers = [[60000, 5]]
    for at in (0, 100, 200):
        r.allow(at, "k", 1000, 3, tiers, expect="sent")
    r.allow(300, "k", 1000, 3, tiers, expect="sent")  # rejected by tier 0
    r.allow(500, "k", 1000, 3, tiers, expect="hit")
    r.allow(500, "k", 1000, 3, expect="sent")  # no tiers: another shape (rejected, replaces)
    r.allow(600, "k", 1000, 3, tiers, expect="sent")  # the tiered shape again: sent
    r.allow(600, "k", 1000, 4, tiers, expect="sent")  # another limit: sent (admitted: drops)
    out.append(r.case)

    r = Run(conn, "binding-tier", "The second tier binds: the cached decision keeps its index, window and limit, "
                                  "and every tier's retry_after and reset_after count down, never below 0.")
    tiers = [[1000, 10], [60000, 3]]
    for at in (0, 1, 2):
        r.allow(at, "k", 1000, 10, tiers[1:], expect="sent")
    r.allow(3, "k", 1000, 10, tiers[1:], expect="sent")  # rejected by tier 1 (3 in 60 s)
    r.allow(2000, "k", 1000, 10, tiers[1:], expect="hit")
    r.allow(59999, "k", 1000, 10, tiers[1:], expect="hit")
    out.append(r.case)

    r = Run(conn, "never-fits", "A cost above the limit can never be admitted: retry_after is -1, nothing is "
                                "cached, and the same request is sent again. On a blocked key too: a cost above "
                                "a tier's limit is sent (the server answers never-fits, not a wait), and the "
                                "entry stays for the costs that fit.")
    r.allow(0, "k", 60000, 3, cost=4, expect="sent")
    r.allow(1, "k", 60000, 3, cost=4, expect="sent")
    r.size(1)
    for at in (2, 3, 4, 5):
        r.allow(at, "k", 60000, 3, expect="sent")  # 3 admitted, then rejected: cached
    r.allow(6, "k", 60000, 3, expect="hit")
    r.allow(7, "k", 60000, 3, cost=3, expect="hit")
    r.allow(8, "k", 60000, 3, cost=4, expect="sent")  # never fits: the server's answer, not the cache's
    r.allow(9, "k", 60000, 3, expect="hit")
    for at in (10, 11, 12):
        r.allow(at, "t", 1000, 10, [[60000, 2]], expect="sent")  # 2 admitted, then rejected by the 2-in-60 s tier
    r.allow(13, "t", 1000, 10, [[60000, 2]], cost=2, expect="hit")
    r.allow(14, "t", 1000, 10, [[60000, 2]], cost=3, expect="sent")  # above the tier's limit: never fits
    r.size(14)
    out.append(r.case)

    r = Run(conn, "forget", "A refund or reset through the same limiter forgets the key first: the next request "
                            "is sent.")
    r.allow(0, "k", 60000, 1, expect="sent")
    r.allow(1, "k", 60000, 1, expect="sent")
    r.allow(2, "k", 60000, 1, expect="hit")
    r.forget(3, "k")
    r.size(3)
    r.allow(4, "k", 60000, 1, expect="sent")
    r.allow(5, "k", 60000, 1, expect="hit")
    out.append(r.case)

    r = Run(conn, "lru", "Capacity 2: a third key evicts the least recently used one; a hit counts as a use.",
            capacity=2)
    for i, key in enumerate(("a", "b", "c")):
        r.allow(2 * i, key, 60000, 1, expect="sent")
        r.allow(2 * i + 1, key, 60000, 1, expect="sent")  # a and b cached; c evicts a
    r.size(5)
    r.allow(6, "a", 60000, 1, expect="sent")  # a was evicted: sent, rejected, evicts b
    r.allow(7, "c", 60000, 1, expect="hit")  # c is now the most recent
    r.allow(8, "b", 60000, 1, expect="sent")  # b was evicted: sent, evicts a
    r.allow(9, "c", 60000, 1, expect="hit")
    r.allow(9, "a", 60000, 1, expect="sent")
    r.size(9)
    out.append(r.case)

    r = Run(conn, "expired-met", "An expired entry still counts until it is met; meeting it drops it.", capacity=3)
    r.allow(0, "short", 1000, 1, expect="sent")
    r.allow(1, "short", 1000, 1, expect="sent")  # retry_after 999
    r.allow(1, "long", 60000, 1, expect="sent")
    r.allow(2, "long", 60000, 1, expect="sent")
    r.size(5000)
    r.allow(5000, "short", 1000, 1, expect="sent")  # met after its deadline: dropped, sent, admitted
    r.size(5000)
    r.allow(5000, "long", 60000, 1, expect="hit")
    out.append(r.case)
    return out


def dump(data):
    """One case a block, one step a line (generate.py's layout, with the case's capacity)."""
    line = lambda value: json.dumps(value, separators=(", ", ": "))  # noqa: E731
    out = ["{", f' "schema": {data["schema"]},', f' "about": {line(data["about"])},', ' "cases": [']
    for i, case in enumerate(data["cases"]):
        out.append(f'  {{"name": {line(case["name"])}, "description": {line(case["description"])}, '
                   f'"capacity": {case["capacity"]}, "steps": [')
        out += [f"   {line(step)}," for step in case["steps"]]
        out[-1] = out[-1].rstrip(",")
        out.append("  ]}" + ("," if i + 1 < len(data["cases"]) else ""))
    out += [" ]", "}", ""]
    text = "\n".join(out)
    assert json.loads(text) == data
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default=str(g.ROOT / "target/release/libxcloak.so"))
    parser.add_argument("--server", default=os.environ.get("XCLOAK_SERVER", "redis-server"))
    parser.add_argument("--check", action="store_true", help="fail if block_cache.json differs; write nothing")
    args = parser.parse_args()
    proc, conn = g.start_server(args.server, args.module)
    try:
        data = {
            "schema": 1,
            "about": "The block cache's rules as data (docs/clients.md, Block cache; clients/conformance/README.md). "
                     "Written by clients/conformance/block_cache.py; do not edit by hand.",
            "cases": cases(conn),
        }
    finally:
        proc.terminate()
        proc.wait()
    text = dump(data)
    if args.check:
        if OUT.read_text() != text:
            sys.exit("block_cache.py --check: clients/conformance/block_cache.json differs")
        print("block_cache.json is up to date")
        return
    OUT.write_text(text)
    steps = sum(len(c["steps"]) for c in data["cases"])
    print(f"wrote {OUT.relative_to(g.ROOT)}: {len(data['cases'])} cases, {steps} steps")


if __name__ == "__main__":
    main()
