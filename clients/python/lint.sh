#!/usr/bin/env bash
# The Python package's lint: ruff check (pyproject.toml's [tool.ruff]) over the
# package, its tests and scripts, and mypy --strict over src/xcloak
# ([tool.mypy]). The tools are pinned in requirements-lint.txt and installed
# into .venv (venv.sh, as test.sh makes it) beside the test dependencies, with
# a stamp of the pins: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")"
here=$PWD
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
# shellcheck source=venv.sh
. "$here/venv.sh"

exec 9>"$here/.deps.lock"
flock 9
want=$(sha256sum <requirements-lint.txt | cut -d' ' -f1)
if [ "$(cat "$venv/.lint-installed" 2>/dev/null)" != "$want" ]; then
    echo "clients/python: installing requirements-lint.txt into $venv (from PyPI)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r requirements-lint.txt
    echo "$want" >"$venv/.lint-installed"
fi
flock -u 9

status=0
"$venv/bin/ruff" check . || status=1
"$venv/bin/mypy" || status=1
[ "$status" -eq 0 ] && echo "clients/python/lint.sh: ruff and mypy --strict pass"
exit $status
