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
# Built into a folder of its own, then moved: DIR also holds the module's
# tarball (xcloak-<version>-linux-x86_64.tar.gz), which a glob on the sdist's
# name (xcloak-*.tar.gz) would match.
rm -f "$out"/xcloak-*-py3-none-any.whl
build_out=$(mktemp -d)
trap 'rm -rf "$build_out"' EXIT
"$venv/bin/python" -m build --sdist --wheel --outdir "$build_out" . >/dev/null
for f in "$build_out"/*; do
    rm -f "$out/$(basename "$f")"
    mv "$f" "$out/"
    echo "dist (python): wrote $out/$(basename "$f")" >&2
done
