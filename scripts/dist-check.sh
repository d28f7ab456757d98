#!/usr/bin/env bash
# `make dist-check`: checks the release tarball as a user would receive it.
#
#   1. the .sha256 beside it, one top folder, every expected file, SHA256SUMS
#      covering every file and matching;
#   2. `objdump -T libxcloak.so`: no symbol needs a glibc newer than 2.17
#      (the offenders are printed otherwise);
#   3. that libxcloak.so loads on the four servers of the matrix (Debian's Redis
#      7.0.15 and the three of scripts/fetch-servers.sh), each on a free loopback
#      port, with STORAGE compact: three XCLOAK.ALLOW calls (limit 2) answer 1 1 0,
#      the window is of the compact type (xcloaklog), MODULE LIST reports
#      the version from Cargo.toml encoded (major*10000 + minor*100 + patch),
#      INFO xcloak and the load log line name it as text. Then each is shut down.
#
# Usage: scripts/dist-check.sh [TARBALL]   (default: the one `make dist` writes)
set -euo pipefail
cd "$(dirname "$0")/.."

GLIBC_FLOOR=2.17
say() { echo "dist-check: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
name="xcloak-$version-linux-x86_64"
tarball="${1:-target/dist/$name.tar.gz}"
[ -f "$tarball" ] || fail "$tarball not found (make dist)"
IFS=. read -r major minor patch <<< "${version%%[-+]*}"
encoded=$(( major * 10000 + minor * 100 + patch ))

command -v objdump >/dev/null 2>&1 || scripts/ensure-deps.sh binutils

work=$(mktemp -d "${TMPDIR:-/tmp}/xcloak-dist-check.XXXXXX")
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# --- 1. contents --------------------------------------------------------------
if [ -f "$tarball.sha256" ]; then
    (cd "$(dirname "$tarball")" && sha256sum --quiet -c "$(basename "$tarball").sha256") \
        || fail "$tarball does not match $tarball.sha256"
else
    fail "no $tarball.sha256 beside the tarball"
fi
tar -xzf "$tarball" -C "$work"
tops=$(ls -A "$work")
[ "$tops" = "$name" ] || fail "expected one top folder $name, found: $tops"
root="$work/$name"
for file in libxcloak.so redis.conf.example INSTALL.md README.md CHANGELOG.md LICENSE \
    THIRD-PARTY.md BUILD-INFO SHA256SUMS; do
    [ -f "$root/$file" ] || fail "$file missing from the tarball"
done
ls "$root"/lua/*.lua >/dev/null 2>&1 || fail "no lua/*.lua in the tarball"
(cd "$root" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match"
[ "$(head -n1 "$root/BUILD-INFO")" = "xcloak $version" ] || fail "BUILD-INFO does not start with 'xcloak $version'"
unlisted=$(cd "$root" && comm -23 <(find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort) \
    <(awk '{print $2}' SHA256SUMS | LC_ALL=C sort))
[ -z "$unlisted" ] || fail "files not in SHA256SUMS: $unlisted"
grep -q '^loadmodule \./libxcloak\.so' "$root/redis.conf.example" \
    || fail "redis.conf.example does not load ./libxcloak.so"
say "contents and checksums ok ($(wc -l < "$root/SHA256SUMS") files)"

# --- 2. glibc floor -------------------------------------------------------------
module="$root/libxcloak.so"
symbols=$(objdump -T "$module")
newest=$(grep -o 'GLIBC_[0-9][0-9.]*' <<< "$symbols" | sed 's/GLIBC_//' | sort -uV | tail -n1)
offenders=$(grep 'GLIBC_[0-9]' <<< "$symbols" | while read -r line; do
    v=$(grep -o 'GLIBC_[0-9][0-9.]*' <<< "$line" | sed 's/GLIBC_//')
    if [ "$(printf '%s\n%s\n' "$v" "$GLIBC_FLOOR" | sort -V | tail -n1)" != "$GLIBC_FLOOR" ]; then
        echo "$line"
    fi
done)
if [ -n "$offenders" ]; then
    say "symbols needing a glibc newer than $GLIBC_FLOOR:"
    echo "$offenders" >&2
    fail "libxcloak.so needs GLIBC_$newest"
fi
say "glibc: newest symbol version GLIBC_$newest (floor $GLIBC_FLOOR); needs: $(objdump -p "$module" | awk '/NEEDED/{printf "%s ", $2}')"

# --- 3. load it on every server -------------------------------------------------
servers=$(scripts/fetch-servers.sh)
command -v redis-cli >/dev/null 2>&1 || scripts/ensure-deps.sh

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Ports above the test harness's range (10000-22767) and below the ephemeral one.
next_port=$(( 23000 + RANDOM % 6000 ))
start_server() {
    local name=$1 binary=$2 dir=$3 tries
    for tries in 1 2 3 4 5; do
        next_port=$(( next_port + 1 ))
        port_taken "$next_port" && continue
        rm -f "$dir/server.log"
        "$binary" --port "$next_port" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$dir" --logfile server.log --loadmodule "$module" STORAGE compact </dev/null >/dev/null 2>&1 &
        server_pid=$!
        pids+=("$server_pid")
        local waited
        for waited in $(seq 1 100); do
            if [ "$(redis-cli -p "$next_port" PING 2>/dev/null)" = PONG ]; then
                port=$next_port
                return 0
            fi
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        # Lost the port to someone else: try another. Anything else: report it.
        grep -q 'Address already in use' "$dir/server.log" 2>/dev/null && continue
        say "$name did not start; its log:"
        cat "$dir/server.log" >&2 || true
        return 1
    done
    say "$name: no free port after 5 tries"
    return 1
}

# SHUTDOWN NOSAVE, then up to 10 s for the process to end, then SIGKILL.
stop_server() {
    local pid=$1 waited
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    for waited in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

summary=""
failed=0
while read -r server binary; do
    dir="$work/$server"
    mkdir -p "$dir"
    result=ok
    if ! start_server "$server" "$binary" "$dir"; then
        summary+="$(printf '%-13s FAILED  did not start' "$server")"$'\n'
        failed=1
        continue
    fi
    cli=(redis-cli -p "$port")
    replies=$(for _ in 1 2 3; do "${cli[@]}" XCLOAK.ALLOW dist-check:smoke 60000 2 || true; done | tr '\n' ' ')
    # Redis 8 lists its built-in modules too (vectorset, ver 1).
    ver=$("${cli[@]}" MODULE LIST | awk 'prev == "name" { module = $0 } prev == "ver" && module == "xcloak" { print; exit } { prev = $0 }' || true)
    info_version=$("${cli[@]}" INFO xcloak | tr -d '\r' | sed -n 's/^xcloak_version://p' || true)
    log_line=$(grep -c "<xcloak> version $version loaded" "$dir/server.log" || true)
    key_type=$("${cli[@]}" TYPE dist-check:smoke | tr -d '\r' || true)
    [ "$replies" = "1 1 0 " ] || { result=FAILED; say "$server: XCLOAK.ALLOW x3 replied '$replies', expected 1 1 0"; }
    [ "$key_type" = xcloaklog ] || { result=FAILED; say "$server: the window is a '$key_type', expected the compact type xcloaklog (STORAGE compact)"; }
    [ "$ver" = "$encoded" ] || { result=FAILED; say "$server: MODULE LIST ver '$ver', expected $encoded"; }
    [ "$info_version" = "$version" ] || { result=FAILED; say "$server: INFO xcloak_version '$info_version', expected $version"; }
    [ "$log_line" -ge 1 ] || { result=FAILED; say "$server: no '<xcloak> version $version loaded' in the log"; }
    stop_server "$server_pid"
    [ "$result" = ok ] || failed=1
    summary+="$(printf '%-13s %-7s ALLOW x3: %s TYPE %s ver %s, INFO %s (port %s)' "$server" "$result" "$replies" "$key_type" "$ver" "$info_version" "$port")"$'\n'
done <<< "$servers"

echo "== dist-check: $tarball"
printf '%s' "$summary"
[ "$failed" -eq 0 ] || fail "see above"
say "ok"
