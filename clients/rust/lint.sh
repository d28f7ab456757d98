#!/usr/bin/env bash
# The crate's lints, from the repository root (the workspace): clippy on every
# target (lib, tests, examples, benches) with every feature, warnings denied,
# and rustfmt's check of the crate's files (rustfmt.toml at the root).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo clippy --locked -p xcloak-client --all-targets --all-features -- -D warnings
cargo fmt --check -p xcloak-client
