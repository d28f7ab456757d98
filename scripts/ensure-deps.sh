#!/usr/bin/env bash
# Installs, from Debian's packages, what building and testing xcloak needs and
# this machine lacks: libclang (bindgen, at build time), redis-server and
# redis-tools (the server the tests start, redis-cli, redis-benchmark).
# Arguments name more commands to have: `redis-sentinel` (its package has the
# same name), or `command:package` (`ip:iproute2`).
# Does nothing when everything is present.
set -euo pipefail

need=()
# bindgen needs libclang itself (libclang-dev); a fresh Debian image may hold
# only libclang-cpp, whose files look alike, so ask dpkg. LIBCLANG_PATH (read
# by bindgen) points at another libclang instead.
if [ -z "${LIBCLANG_PATH:-}" ] && command -v dpkg >/dev/null 2>&1 \
    && ! dpkg -s libclang-dev 2>/dev/null | grep -q '^Status: install ok installed'; then
    need+=(libclang-dev)
fi
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
for extra in "$@"; do
    command -v "${extra%%:*}" >/dev/null 2>&1 || need+=("${extra#*:}")
done

if [ ${#need[@]} -gt 0 ]; then
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    echo "ensure-deps: installing ${need[*]}" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "ensure-deps: cargo (Rust stable) is required and not on PATH" >&2
    exit 1
fi
