#!/usr/bin/env bash
# Fetches redis-cell 0.2.2 from crates.io and builds it (CL.THROTTLE, the peer
# in `make bench`) into a cache outside the repository; prints the path of the
# built module. Nothing of redis-cell is committed here.
#
#   1. a throwaway crate that depends on `redis-cell = "=0.2.2"`; `cargo fetch`
#      puts the crate's source into the cargo registry;
#   2. that source is copied out of the registry into the cache and built there
#      as it is (`cargo build --release`; its own build.rs compiles its C shim
#      with the gcc crate: no libclang/bindgen needed).
#
# Cache: ${XCLOAK_BENCH_CACHE:-$HOME/.cache/xcloak-bench}/redis-cell. A module
# already built there is reused.
# Usage: scripts/fetch-redis-cell.sh   (prints e.g. ~/.cache/xcloak-bench/redis-cell/target/release/libredis_cell.so)
set -euo pipefail

version=0.2.2
cache="${XCLOAK_BENCH_CACHE:-$HOME/.cache/xcloak-bench}"
src="$cache/redis-cell"
module="$src/target/release/libredis_cell.so"

if [ -f "$module" ]; then
    echo "$module"
    exit 0
fi

fetcher="$cache/fetch-redis-cell"
mkdir -p "$fetcher/src"
cat > "$fetcher/Cargo.toml" <<EOF
[package]
name = "fetch-redis-cell"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
redis-cell = "=$version"
EOF
: > "$fetcher/src/lib.rs"
(cd "$fetcher" && cargo fetch --quiet) >&2

registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
origin=$(ls -d "$registry"/*/"redis-cell-$version" 2>/dev/null | head -n 1)
if [ -z "$origin" ]; then
    echo "fetch-redis-cell: redis-cell-$version not found under $registry after cargo fetch" >&2
    exit 1
fi
rm -rf "$src"
cp -r "$origin" "$src"
echo "fetch-redis-cell: building redis-cell $version in $src" >&2
log="$cache/redis-cell-build.log"
if ! (cd "$src" && nice cargo build --release) >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fetch-redis-cell: the build failed (log: $log)" >&2
    exit 1
fi
if [ ! -f "$module" ]; then
    echo "fetch-redis-cell: the build left no $module" >&2
    exit 1
fi
echo "$module"
