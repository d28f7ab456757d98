"""What the bench fetches or builds outside the repository, into the bench
cache (XCLOAK_BENCH_CACHE, default ~/.cache/xcloak-bench): redis-cell 0.2.2,
limits 5.8.0's moving-window script (read from its released wheel, never
copied into the repository), a venv with a pinned matplotlib. Paths of the
repository. Imports nothing of the package."""

import glob
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("XCLOAK_BENCH_CACHE", os.path.expanduser("~/.cache/xcloak-bench"))
MODULE = os.environ.get("XCLOAK_MODULE", os.path.join(ROOT, "target/release/libxcloak.so"))
ARTICLE = os.path.join(ROOT, "tests/oracle/article.lua")
FALLBACK = os.path.join(ROOT, "src/lua/xcloak_allow.lua")
LIMITS = "limits==5.8.0"
LIMITS_SCRIPT = "limits/resources/redis/lua_scripts/acquire_moving_window.lua"
MATPLOTLIB = "matplotlib==3.10.3"


def read(path):
    with open(path) as f:
        return f.read()


def cell_module():
    """redis-cell 0.2.2 (CL.THROTTLE), built from crates.io into the cache by
    scripts/fetch-redis-cell.sh (XCLOAK_CELL_MODULE: another build)."""
    path = os.environ.get("XCLOAK_CELL_MODULE")
    if path:
        return path
    out = subprocess.run([os.path.join(ROOT, "scripts/fetch-redis-cell.sh")], stdout=subprocess.PIPE, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        sys.exit("bench: could not build redis-cell (scripts/fetch-redis-cell.sh)")
    return out.stdout.strip().splitlines()[-1]


def limits_script():
    """limits 5.8.0's acquire_moving_window.lua, read from the released wheel
    (`pip download --no-deps`, once, into the cache)."""
    folder = os.path.join(CACHE, "limits")
    name, version = LIMITS.split("==")
    pattern = os.path.join(folder, "%s-%s-*.whl" % (name, version))
    if not glob.glob(pattern):
        os.makedirs(folder, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", folder, LIMITS], check=True
        )
    wheels = glob.glob(pattern)
    if not wheels:
        sys.exit("bench: pip download %s left no wheel in %s" % (LIMITS, folder))
    with zipfile.ZipFile(wheels[0]) as wheel:
        return wheel.read(LIMITS_SCRIPT).decode()


def chart_python():
    """A Python with matplotlib (pinned): a venv in the cache, created and
    filled from PyPI the first time."""
    venv = os.path.join(CACHE, "venv")
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
        subprocess.run(
            sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "python3-venv"], env=env, check=True
        )
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", MATPLOTLIB], check=True)
    return python
