#!/usr/bin/env bash
# ./bench.sh [overhead|attack]
# overhead (the default): the crate's overhead, as ratios against a baseline
# in the same run (benches/overhead.rs): Limiter::allow against a raw
# redis::cmd of the same XCLOAK.ALLOW (1 and 16 in flight), and an axum app
# with RateLimitLayer against the same app without it (per request).
# attack: issue 32's attack bench (benches/attack.rs): a credential-stuffing
# wave through the layer in an axum server, the block cache on and off in
# one run; scale by ATTACK_IDENTITIES, ATTACK_ROUNDS, LEGIT_IDENTITIES,
# CONNECTIONS, SLICES; XCLOAK_ATTACK_JSON=PATH also writes the figures there
# as JSON (the shape scripts/bench gathers). Each starts its own server with
# the module ($XCLOAK_MODULE, default the workspace's release build).
# The bench profile inherits the workspace's release profile (fat LTO, one
# codegen unit, for the module); both are lifted here to keep the build short:
# both sides of every ratio are in the same binary.
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
export XCLOAK_MODULE=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
[ -f "$XCLOAK_MODULE" ] || (cd "$repo" && cargo build --release)
CARGO_PROFILE_BENCH_LTO=false CARGO_PROFILE_BENCH_CODEGEN_UNITS=16 \
    cargo bench --locked -p xcloak-client --all-features --bench "${1:-overhead}"
