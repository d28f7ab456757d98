#!/usr/bin/env bash
# Writes the xcloak wheel and sdist into DIR (make dist): python -m build
# (build, pinned, in .venv-build here, git-ignored) with the pinned backend
# of pyproject.toml (hatchling) in an isolated environment.
set -euo pipefail
out=${1:?usage: dist.sh DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")"
venv=$PWD/.venv-build
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import build" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check build==1.6.1
fi
rm -f "$out"/xcloak-*.whl "$out"/xcloak-*.tar.gz
"$venv/bin/python" -m build --sdist --wheel --outdir "$out" . >/dev/null
ls "$out"/xcloak-*.whl "$out"/xcloak-*.tar.gz
