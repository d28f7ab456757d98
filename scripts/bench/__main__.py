"""`python3 -m scripts.bench [--update] [SECTION...]` (`make bench` runs it with none).

With no section: every section, then the targets (PASS/FAIL; the exit status
is 0 either way, as a FAIL is a finding, not a broken bench), and the docs:
docs/performance.md, docs/performance.json (the run of record), the README's
table and docs/performance-memory.png. With sections: those only, printed,
with the targets they measure; the docs are left as they are. With
`--update SECTION...`: those sections run again and replace theirs in the run
of record (docs/performance.json keeps the others, and records the re-run's
commit and date), then the page and the README's table are written again.
`--render` writes the page and the table again from docs/performance.json,
running nothing (after a change to report.py or targets.toml).

Sections: commands (main, larger, attack), tiers, entries, keyspace, million,
memory (per tracked request and per identity), used, attack, refund,
fallback, fallback-instructions, block-cache. `fallback` and
`fallback-instructions` run on a server without the module and need no build;
`block-cache` runs every client package's attack bench (each starts its own
server with the module)."""

import json
import os
import platform
import subprocess
import sys
import time

from . import deps, report, results, targets
from .sections import block_cache, commands, entries, fallback, memory, refund
from .server import NICE, Server
from .workloads import ATTACK, CLIENTS, LARGER, MAIN, PIPELINE, QUICK, WINDOW_MS

ALL = (
    "commands",
    "tiers",
    "entries",
    "keyspace",
    "million",
    "memory",
    "used",
    "attack",
    "refund",
    "fallback",
    "fallback-instructions",
    "block-cache",
)
NEED_MODULE = set(ALL) - {"fallback", "fallback-instructions", "block-cache"}
CHART = os.path.join(deps.ROOT, "docs/performance-memory.png")
CHART_DATA = os.path.join(deps.ROOT, "target/bench/memory-per-identity.json")
PARTIAL = os.path.join(deps.ROOT, "target/bench/partial.json")


def git(*args):
    return subprocess.run(["git", "-C", deps.ROOT, *args], capture_output=True, text=True).stdout.strip()


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dirty = git("status", "--porcelain", "--", "src")
    return dict(
        cpu=cpu,
        nproc=os.cpu_count(),
        kernel=platform.release(),
        bench=subprocess.run(["redis-benchmark", "--version"], capture_output=True, text=True).stdout.strip(),
        commit=git("rev-parse", "--short", "HEAD") + (" (src modified)" if dirty else ""),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        load_start=", ".join("%.1f" % x for x in os.getloadavg()),
        priority="nice -10" if NICE else "normal priority",
        quick=QUICK,
        window_ms=WINDOW_MS,
        clients=CLIENTS,
        pipeline=PIPELINE,
    )


def server_name(server):
    info = server.client.info("server")
    name = "Valkey" if "valkey_version" in info else "Redis"
    return "%s %s" % (name, info.get("valkey_version", info.get("redis_version")))


def run_module_sections(chosen, data, meta):
    """The sections that run on the server with the module and redis-cell."""
    server = Server(module=deps.MODULE, extra_modules=[deps.cell_module()])
    try:
        sha = server.client.call("SCRIPT", "LOAD", deps.read(deps.ARTICLE))
        meta["server"] = server_name(server)
        print(
            "xcloak bench: %s on %d CPUs (%s), port %d" % (meta["server"], meta["nproc"], meta["cpu"], server.port),
            flush=True,
        )
        steps = [
            (
                "commands",
                "commands: limit 10, half rejections",
                lambda: data.setdefault("commands", {}).update(main=commands.run(server, sha, MAIN, "")),
            ),
            (
                "commands",
                "commands: larger sets",
                lambda: data["commands"].update(larger=commands.run(server, sha, LARGER, "L")),
            ),
            (
                "commands",
                "commands: an attack, most calls rejected",
                lambda: data["commands"].update(attack=commands.run(server, sha, ATTACK, "A")),
            ),
            (
                "tiers",
                "tiers: one 2-tier call against two calls on two keys",
                lambda: data.update(tiers=commands.tiers(server)),
            ),
            (
                "entries",
                "entries per key, sorted sets and compact",
                lambda: data.update(
                    entries=dict(
                        zset=entries.entries(server),
                        compact=entries.entries(server, "compact", entries.COMPACT_SIZES, entries.COMPACT_KEYS),
                    )
                ),
            ),
            ("keyspace", "keys in the keyspace", lambda: data.update(keyspace=entries.keyspace(server))),
            ("million", "one key per client address", lambda: data.update(million=memory.million(server))),
            (
                "memory",
                "memory per tracked request and per identity",
                lambda: data.setdefault("memory", {}).update(
                    per_request=memory.per_request(server, sha), identity=memory.identity(server, sha)
                ),
            ),
            (
                "used",
                "memory per identity as the server pays it (used_memory)",
                lambda: data.setdefault("memory", {}).update(used=memory.used_memory(server, sha)),
            ),
            (
                "attack",
                "the attack: %s identities at limit %d"
                % ("{:,}".format(memory.ATTACK_IDENTITIES), memory.ATTACK_LIMIT),
                lambda: data.setdefault("memory", {}).update(attack=memory.attack(server, sha)),
            ),
            ("refund", "XCLOAK.REFUND against the window's size", lambda: data.update(refund=refund.run(server))),
        ]
        for name, title, step in steps:
            if name in chosen:
                started = time.time()
                print("== %s" % title, flush=True)
                step()
                meta.setdefault("section_seconds", {})[title] = round(time.time() - started)
                # What is measured so far survives a later section's failure.
                os.makedirs(os.path.dirname(PARTIAL), exist_ok=True)
                results.save(data, PARTIAL)
    finally:
        server.stop()


def draw_chart(data):
    used = [(r["limit"], r["bytes"]) for r in data["memory"]["used"]]
    refunds = [
        (r["entries"], {form: (r[form]["newest"], r[form]["middle"]) for form in ("compact", "zset")})
        for r in data["refund"]["rows"]
    ]
    gcra = {
        str(int(t["measure"].split(".")[2])): t["limit"]
        for t in targets.load()
        if t["measure"].startswith("memory.used.") and t["measure"].endswith("compact_over_cell")
    }
    os.makedirs(os.path.dirname(CHART_DATA), exist_ok=True)
    with open(CHART_DATA, "w") as f:
        json.dump(
            dict(
                used=used,
                refunds=refunds,
                server=data["meta"]["server"],
                commit=data["meta"]["commit"],
                date=data["meta"]["date"],
                gcra_targets=gcra,
            ),
            f,
            indent=1,
        )
    subprocess.run(
        [deps.chart_python(), os.path.join(os.path.dirname(os.path.abspath(__file__)), "chart.py"), CHART_DATA, CHART],
        check=True,
    )


def render():
    """`--render`: the page and the README's table written again from docs/performance.json, nothing run."""
    data = results.load()
    flat = results.flatten(data)
    checked = targets.check(targets.load(), flat)
    report.print_targets(checked, flat)
    report.write(report.PAGE, report.page(data, checked, flat))
    report.write_readme(flat, data["meta"])
    report.write_package_readmes(data)
    print("wrote docs/performance.md and README.md's table from docs/performance.json")


def main(argv):
    if argv == ["--render"]:
        return render()
    update = argv[:1] == ["--update"]
    if update:
        argv = argv[1:]
        if not argv:
            sys.exit("bench: --update needs the sections to run again, e.g. --update fallback fallback-instructions")
    chosen = argv or list(ALL)
    unknown = [s for s in chosen if s not in ALL]
    if unknown:
        sys.exit("bench: unknown section(s) %s; sections: %s" % (", ".join(unknown), ", ".join(ALL)))
    full = not argv
    if set(chosen) & NEED_MODULE and not os.path.exists(deps.MODULE):
        sys.exit("bench: no module at %s (run `make build`)" % deps.MODULE)
    started = time.time()
    meta = machine()
    data = results.load() if update else dict(meta=meta)
    if set(chosen) & NEED_MODULE:
        run_module_sections(chosen, data, meta)
    if "fallback" in chosen:
        print(
            "== fallback: a server without the module, the fallback against the article's and limits' scripts",
            flush=True,
        )
        t0 = time.time()
        data["fallback"] = fallback.run()
        meta.setdefault("server", data["fallback"]["server"])
        meta.setdefault("section_seconds", {})["fallback"] = round(time.time() - t0)
    if "fallback-instructions" in chosen:
        print("== fallback: instructions per call under callgrind", flush=True)
        t0 = time.time()
        counted = fallback.instructions()
        if counted:
            data["fallback_instructions"] = counted
        meta.setdefault("section_seconds", {})["fallback-instructions"] = round(time.time() - t0)
    if "block-cache" in chosen:
        print("== block-cache: every package's attack bench, the cache on and off", flush=True)
        t0 = time.time()
        data["block_cache"] = block_cache.run()
        meta.setdefault("section_seconds", {})["block-cache"] = round(time.time() - t0)
    meta["seconds"] = time.time() - started
    meta["load_end"] = ", ".join("%.1f" % x for x in os.getloadavg())
    if update:
        data["meta"].setdefault("updates", []).append(
            dict(
                sections=chosen,
                commit=meta["commit"],
                date=meta["date"],
                seconds=round(meta["seconds"]),
                server=meta.get("server", ""),
                load_start=meta["load_start"],
                load_end=meta["load_end"],
            )
        )
    flat = results.flatten(data)
    measured = [t for t in targets.load() if full or update or t["measure"] in flat]
    checked = targets.check(measured, flat)
    print()
    report.print_targets(checked, flat)
    os.makedirs(os.path.join(deps.ROOT, "target/bench"), exist_ok=True)
    raw = os.path.join(deps.ROOT, "target/bench/results.json")
    results.save(data, raw)
    if full or update:
        if full or {"used", "refund"} & set(chosen):
            draw_chart(data)
        results.save(data)
        report.write(report.PAGE, report.page(data, checked, flat))
        report.write_readme(flat, data["meta"])
        report.write_package_readmes(data)
        print(
            "wrote docs/performance.md, docs/performance.json, README.md's table and the packages' block-cache "
            "tables%s (%.0f s)"
            % (" and docs/performance-memory.png" if full else "", meta["seconds"])
        )
    else:
        print()
        print(report.page(data, checked, flat))
        print("the data: %s (docs untouched)" % os.path.relpath(raw, deps.ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])
