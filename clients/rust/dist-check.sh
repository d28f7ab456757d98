#!/usr/bin/env bash
# `make dist-check`: the .crate that dist.sh wrote, as a user gets it:
# unpacked into a temporary folder, a throwaway project that depends on it
# (a path dependency) and on `redis`, built, and run against two servers this
# script starts on free loopback ports: one with the module (answered by
# XCLOAK.ALLOW) and one without it (the bundled script from the .crate).
# Then, as a new user following the README: a fresh project for each of its
# two examples, made of the README's [dependencies] lines (the path pointed at
# the unpacked .crate) and the README's program, built and run (the first
# example's four calls; the axum app's first request).
# Builds in target/dist-check (kept, so a second run is fast).
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
dist=${1:?usage: dist-check.sh DIR}
module=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
server=${XCLOAK_SERVER:-redis-server}
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
crate="$dist/xcloak-client-$version.crate"
say() { echo "dist-check (rust): $*" >&2; }
[ -f "$crate" ] || { say "FAILED: $crate not found (make dist)"; exit 1; }
[ -f "$module" ] || { say "FAILED: no module at $module (make build)"; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/xcloak-client-check.XXXXXX")
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

tar -xzf "$crate" -C "$work"
[ -f "$work/xcloak-client-$version/lua/xcloak_allow.lua" ] || { say "FAILED: no lua/ in the .crate"; exit 1; }

free_port() {
    local port
    for port in $(seq 22700 22767); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
    done
    return 1
}
start() { # start PORT [module args...]
    local port=$1
    shift
    "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
        --logfile "$work/server-$port.log" "$@" &
    pids+=($!)
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return
        sleep 0.05
    done
    say "FAILED: server on $port did not start"; cat "$work/server-$port.log" >&2; exit 1
}
with=$(free_port); start "$with" --loadmodule "$module"
without=$(free_port); start "$without"

mkdir -p "$work/check/src"
cat > "$work/check/Cargo.toml" <<TOML
[package]
name = "xcloak-client-check"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
xcloak-client = { path = "../xcloak-client-$version" }
redis = { version = "1.8", default-features = false, features = ["tokio-comp", "connection-manager"] }
tokio = { version = "1", default-features = false, features = ["rt", "macros"] }
TOML
cat > "$work/check/src/main.rs" <<'RUST'
use std::time::Duration;
use xcloak_client::{Limiter, Request, Via};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    for (url, via) in [(args.next().unwrap(), Via::Command), (args.next().unwrap(), Via::Script)] {
        let limiter = Limiter::new(redis::Client::open(url.as_str())?.get_connection_manager().await?);
        let request = Request::new("dist-check", Duration::from_secs(60), 1);
        let (first, second) = (limiter.allow(&request).await?, limiter.allow(&request).await?);
        println!("{url}: {} then {} via {:?}", first.allowed, second.allowed, first.via);
        if !(first.allowed && !second.allowed && first.via == via && second.retry_after.is_some()) {
            return Err(format!("{url}: unexpected {first:?} {second:?}").into());
        }
    }
    Ok(())
}
RUST
# The versions the workspace tested (cargo keeps what still applies).
cp "$repo/Cargo.lock" "$work/check/Cargo.lock"
say "building a project that depends on $(basename "$crate")"
(cd "$work/check" && CARGO_TARGET_DIR="$repo/target/dist-check" cargo run --quiet -- \
    "redis://127.0.0.1:$with/" "redis://127.0.0.1:$without/") \
    || { say "FAILED"; exit 1; }
say "ok: $(basename "$crate") builds from its own files and answers through the command and the script"

# The README's block after the line <!-- MARKER -->, as a file.
readme_block() { # readme_block MARKER OUT
    python3 - "$work/xcloak-client-$version/README.md" "$1" "$2" <<'PY'
import sys
text, marker, out = open(sys.argv[1]).read(), "<!-- %s -->\n" % sys.argv[2], sys.argv[3]
rest = text[text.index(marker) + len(marker):]
body = rest[rest.index("\n") + 1:]
open(out, "w").write(body[:body.index("```\n")])
PY
}
for example in first axum; do
    project="$work/readme-$example"
    mkdir -p "$project/src"
    {
        printf '[package]\nname = "readme-%s"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n[workspace]\n\n' "$example"
        readme_block "cargo: $example" /dev/stdout | sed "s|path = \"[^\"]*\"|path = \"$work/xcloak-client-$version\"|"
    } > "$project/Cargo.toml"
    readme_block "example: examples/$example.rs" "$project/src/main.rs"
    cp "$repo/Cargo.lock" "$project/Cargo.lock"
    say "building the README's $example example in a fresh project"
    (cd "$project" && CARGO_TARGET_DIR="$repo/target/dist-check" cargo build --quiet) || { say "FAILED: the README's $example example"; exit 1; }
done
target="$repo/target/dist-check/debug"
out=$(REDIS_URL="redis://127.0.0.1:$with/" "$target/readme-first")
echo "$out" >&2
[ "$(echo "$out" | grep -c '^allowed=true')" = 3 ] && echo "$out" | tail -n1 | grep -q '^allowed=false' \
    || { say "FAILED: the README's first example printed the above"; exit 1; }
port=$(free_port)
REDIS_URL="redis://127.0.0.1:$with/" ADDR="127.0.0.1:$port" "$target/readme-axum" > "$work/axum.out" &
pids+=($!)
for _ in $(seq 200); do
    grep -q "listening" "$work/axum.out" 2>/dev/null && break
    sleep 0.05
done
status=$(python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).status)' "http://127.0.0.1:$port/") \
    || { say "FAILED: the README's axum example did not answer"; exit 1; }
[ "$status" = 200 ] || { say "FAILED: the README's axum example answered $status"; exit 1; }
say "ok: the README's two examples build in fresh projects from its [dependencies] lines and run"
