#!/usr/bin/env bash
# The xcloak-client crate's whole suite (docs/clients.md, clients/README.md),
# run by `make test-clients` and `make test` (scripts/clients.sh):
#   - every conformance vector through the pure core (no server), through the
#     async Limiter on a server with the module and on one without it (the
#     commands sent recorded and compared byte for byte), and through the
#     blocking Limiter;
#   - the fallback (per node, re-probe, NOSCRIPT, EVALSHA_RO), faults (paused,
#     stopped, lost replies, OOM, durable WAIT; each timed-out call counted
#     once by the server), Redis Cluster 3+3 and a cluster with a primary
#     without the module, and the tower layer in a real axum server over HTTP;
#   - the README's two examples, as written, built and run against servers
#     (tests/readme.rs); the public surface against names.tsv (tests/names.rs);
#     bad arguments and configuration refused before anything is sent
#     (tests/arguments.rs);
#   - the crate's unit and doc tests.
# Servers are real redis-server processes on 127.0.0.1, ports 22500-22767
# (bus ports +10000), shut down by the tests. Reads $XCLOAK_MODULE (default
# the workspace's target/release/libxcloak.so, built when missing),
# $XCLOAK_SERVER (default redis-server) and $XCLOAK_REPO (default ../..).
# Installs what it needs when missing: redis-server and redis-cli from Debian
# (scripts/ensure-deps.sh); the crate's dependencies from crates.io, at the
# versions of the workspace's Cargo.lock (--locked).
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
export XCLOAK_MODULE=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
"$repo/scripts/ensure-deps.sh"
if [ ! -f "$XCLOAK_MODULE" ]; then
    (cd "$repo" && cargo build --release)
fi
# This crate's copies of src/lua (scripts/sync-lua.sh writes them): a stale
# copy would test the wrong script. tests/conformance.rs checks every package's.
for script in "$repo"/src/lua/*.lua; do
    cmp -s "$script" "lua/$(basename "$script")" || { echo "clients/rust: lua/$(basename "$script") differs from src/lua (scripts/sync-lua.sh)" >&2; exit 1; }
done
# --all-features: the feature set tests/examples.rs builds the example with,
# so the two share every compiled artifact.
cargo test --locked -p xcloak-client --all-features -- --test-threads=2
