"""Section "block-cache": every client package's attack bench (issue 32;
docs/clients.md, Block cache), each through its main HTTP middleware on a real
HTTP server, the block cache on and off in the same run. Each package's bench
writes its figures as JSON (XCLOAK_ATTACK_JSON=PATH) in one shape; this
section runs them one after the other and keeps what they wrote:
{<package>: {package, middleware, when, load, scale, on: {...}, off: {...},
cached_ns, roundtrip_ns, cached_vs_roundtrip, bytes_per_entry}}."""

import json
import os
import subprocess
import tempfile
import time

from .. import deps

# package -> (working directory under the repository, command). Each bench
# starts its own redis-server with the module at $XCLOAK_MODULE.
BENCHES = {
    "python": ("clients/python", [".venv/bin/python", "bench_attack.py"]),
    "go": ("clients/go/bench", ["go", "test", "-run", "^$", "-bench", "Attack", "-benchtime", "1x", "-count", "1"]),
    "node": ("clients/node", ["node", "bench/attack.mjs"]),
    "rust": ("clients/rust", ["bash", "bench.sh", "attack"]),
}
PACKAGES = tuple(p for p in os.environ.get("XCLOAK_ATTACK_PACKAGES", " ".join(BENCHES)).split())


def run():
    out = {}
    for package in PACKAGES:
        folder, command = BENCHES[package]
        cwd = os.path.join(deps.ROOT, folder)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "attack.json")
            env = dict(os.environ, XCLOAK_ATTACK_JSON=path, XCLOAK_MODULE=deps.MODULE, XCLOAK_REPO=deps.ROOT)
            started = time.time()
            print("   %s: %s (in %s)" % (package, " ".join(command), folder), flush=True)
            done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if not os.path.exists(path):
                print(done.stdout[-4000:])
                raise SystemExit("bench: %s's attack bench wrote no figures (exit %d)" % (package, done.returncode))
            with open(path) as f:
                figures = json.load(f)
            for mode in ("on", "off"):
                figures[mode]["cache_answered_percent"] = 100 * figures[mode]["cache_answered_share"]
            figures["seconds"] = round(time.time() - started)
            figures["exit"] = done.returncode
            out[package] = figures
            on, off = figures["on"], figures["off"]
            print(
                "   %s: calls per attack request %.4f (off %.2f), answered by the cache %.2f%%, cached / round trip "
                "%.3f, over-admitted %d/%d, legitimate rejected %d/%d"
                % (
                    package,
                    on["calls_per_attack_request"],
                    off["calls_per_attack_request"],
                    100 * on["cache_answered_share"],
                    figures["cached_vs_roundtrip"],
                    on["overadmitted"],
                    off["overadmitted"],
                    on["legit_rejected"],
                    off["legit_rejected"],
                ),
                flush=True,
            )
    return out
