#!/usr/bin/env bash
# Copies the bundled Lua scripts (src/lua/*.lua, their one source) into every
# client package that carries them, byte for byte. The copies are committed,
# so each package builds and installs from its own folder (go get, pip install,
# npm pack, cargo package); tests/conformance.rs fails when a copy differs.
#   scripts/sync-lua.sh          copy
#   scripts/sync-lua.sh --check  only compare; exit 1 naming each stale copy
set -euo pipefail
cd "$(dirname "$0")/.."
# Where each package keeps its copies (docs/clients.md, Fallback).
destinations=(
    clients/python/src/xcloak/lua
    clients/go/lua
    clients/node/lua
    clients/rust/lua
    clients/java/xcloak/src/main/resources/io/xcloak/lua
)
check=false
[ "${1:-}" = "--check" ] && check=true
stale=0
for dest in "${destinations[@]}"; do
    package=$(echo "$dest" | cut -d/ -f1-2)
    [ -d "$package" ] || continue
    for script in src/lua/*.lua; do
        copy=$dest/$(basename "$script")
        if $check; then
            if ! cmp -s "$script" "$copy"; then
                echo "stale or missing: $copy (run scripts/sync-lua.sh)" >&2
                stale=1
            fi
        else
            mkdir -p "$dest"
            cp "$script" "$copy"
        fi
    done
done
exit $stale
