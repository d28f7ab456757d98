#!/usr/bin/env bash
# `make dist`: the crate as crates.io would receive it, `cargo package`
# (which builds the packaged sources once to verify them), into DIR:
#   DIR/xcloak-client-<version>.crate
# It holds src/, lua/ (the bundled scripts, compiled in by include_str!),
# README.md and Cargo.toml; the tests and the example stay in the repository.
# Needs the crates.io index (reachable from CI).
set -euo pipefail
cd "$(dirname "$0")"
out=${1:?usage: dist.sh DIR}
mkdir -p "$out"
dirty=()
if [ -n "$(git status --porcelain -- . 2>/dev/null)" ]; then
    echo "dist (rust): warning: uncommitted changes in clients/rust: packaging them" >&2
    dirty=(--allow-dirty)
fi
cargo package --locked -p xcloak-client "${dirty[@]}" 2>&1 | grep -v "^warning: ignoring test\|^warning: ignoring example" >&2
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
install -m 644 "$target/package/xcloak-client-$version.crate" "$out/"
echo "dist (rust): wrote $out/xcloak-client-$version.crate" >&2
