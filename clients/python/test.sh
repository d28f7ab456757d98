#!/usr/bin/env bash
# The xcloak Python package's whole suite (clients/README.md): installs what
# it needs when missing, then runs it against real servers it starts.
#   - python3 and venv (Debian's python3-venv when ensurepip is missing),
#     redis-server, redis-cli and redis-sentinel (Debian packages);
#   - the pinned test dependencies (requirements-test.txt) into .venv here,
#     git-ignored; a stamp of the pins makes a second run install nothing
#     (venv.sh, shared with lint.sh);
#   - then pytest tests/ (vectors, limiter, cluster, Sentinel, faults,
#     limits storages, ASGI over uvicorn, Flask-Limiter over werkzeug), and
#     limits 5.8.0's own moving-window suite on the xcloak storages
#     (limits_suite.py: the sdist from PyPI, cached in .limits/).
# Reads $XCLOAK_MODULE (default ../../target/release/libxcloak.so),
# $XCLOAK_SERVER (default redis-server), $XCLOAK_REPO (default ../..).
set -euo pipefail
cd "$(dirname "$0")"
here=$PWD
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
export XCLOAK_REPO=$repo
export XCLOAK_MODULE=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
if [ ! -f "$XCLOAK_MODULE" ]; then
    echo "clients/python/test.sh: no module at $XCLOAK_MODULE (run make build)" >&2
    exit 1
fi

# shellcheck source=venv.sh
. "$here/venv.sh"
"$repo/scripts/ensure-deps.sh" redis-sentinel >/dev/null

# The package from this folder (src/), as the tests and limits' suite import it.
export PYTHONPATH=$here/src${PYTHONPATH:+:$PYTHONPATH}
status=0
"$venv/bin/python" -m pytest -q -rfEs tests "$@" || status=1
"$venv/bin/python" limits_suite.py || status=1
exit $status
