#!/usr/bin/env bash
# Installs, from Debian's packages, what building and testing xcloak needs and
# this machine lacks: libclang (bindgen, at build time), redis-server and
# redis-tools (the server the tests start, redis-cli, redis-benchmark).
# Arguments name more commands to have: `redis-sentinel` (its package has the
# same name), or `command:package` (`ip:iproute2`). The argument `rust-lint`
# (make lint) has rustup add clippy and rustfmt to the stable toolchain and a
# minimal nightly with miri and rust-src, then runs `cargo +nightly miri setup`.
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
rust_lint=0
for extra in "$@"; do
    [ "$extra" = rust-lint ] && { rust_lint=1; continue; }
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

if [ "$rust_lint" = 1 ]; then
    command -v rustup >/dev/null 2>&1 || { echo "ensure-deps: make lint needs rustup (clippy, rustfmt, nightly miri)" >&2; exit 1; }
    installed=$(rustup component list --toolchain stable --installed 2>/dev/null || true)
    for component in clippy rustfmt; do
        if ! grep -q "^$component" <<< "$installed"; then
            echo "ensure-deps: rustup component add $component (stable)" >&2
            rustup component add --toolchain stable "$component"
        fi
    done
    if ! cargo +nightly miri --version >/dev/null 2>&1; then
        echo "ensure-deps: rustup toolchain install nightly (miri, rust-src)" >&2
        rustup toolchain install nightly --profile minimal --component miri,rust-src
    fi
    # Builds Miri's sysroot once (cached under ~/.cache/miri); quiet when it is there.
    cargo +nightly miri setup >/dev/null
fi
