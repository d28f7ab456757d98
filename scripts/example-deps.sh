#!/usr/bin/env bash
# Installs what the client examples under docs/examples/ need, when missing:
#   python: python3 + venv (Debian packages), then redis-py from PyPI into
#           docs/examples/python/.venv (pinned in requirements.txt)
#   node:   nodejs + npm (Debian packages), the xcloak package built in
#           clients/node (its scripts/prepare.sh: npm ci + build, when stale),
#           then node-redis, ioredis and that package (a link) into
#           docs/examples/node/node_modules (package-lock.json)
#   go:     checks for Go 1.24+ (on PATH or in /usr/local/go; never Debian's
#           golang-go, which is older); the example builds in module mode, with
#           go-redis from the Go module proxy (docs/examples/go/go.sum) and the
#           package of this checkout (clients/go, a replace directive)
# Both folders are git-ignored. A stamp records what was installed, so a second
# run does nothing; a changed requirements.txt / package-lock.json reinstalls.
# Safe to run concurrently (flock). Usage: scripts/example-deps.sh [python] [node] [go]
set -euo pipefail
cd "$(dirname "$0")/.."
examples=docs/examples
want=("$@")
[ ${#want[@]} -gt 0 ] || want=(python node go)

exec 9>"$examples/.deps.lock"
flock 9

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "example-deps: installing $* (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

stamp_of() { sha256sum "$1" | cut -d' ' -f1; }

python_deps() {
    local dir=$examples/python venv=$examples/python/.venv
    command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
    local want_stamp
    want_stamp=$(stamp_of "$dir/requirements.txt")
    if [ "$(cat "$venv/.installed" 2>/dev/null)" = "$want_stamp" ]; then
        return
    fi
    echo "example-deps: creating $venv (redis-py from PyPI)" >&2
    rm -rf "$venv"
    # Debian ships venv's pip bootstrap (ensurepip) separately, in python3-venv.
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        rm -rf "$venv"
        apt_install python3-venv
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r "$dir/requirements.txt"
    echo "$want_stamp" >"$venv/.installed"
}

node_deps() {
    local dir=$examples/node
    command -v node >/dev/null 2>&1 || apt_install nodejs
    command -v npm >/dev/null 2>&1 || apt_install npm
    # The examples use the package from its folder (a file: link): build it.
    clients/node/scripts/prepare.sh
    local want_stamp
    want_stamp=$(stamp_of "$dir/package-lock.json")
    if [ "$(cat "$dir/node_modules/.installed" 2>/dev/null)" = "$want_stamp" ]; then
        return
    fi
    echo "example-deps: npm ci in $dir (node-redis and ioredis from the npm registry, xcloak from clients/node)" >&2
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
    echo "$want_stamp" >"$dir/node_modules/.installed"
}

go_deps() {
    local go=go
    command -v go >/dev/null 2>&1 || go=/usr/local/go/bin/go
    local version
    version=$("$go" env GOVERSION 2>/dev/null) || {
        echo "example-deps: Go 1.24 or later is needed (not on PATH, nor in /usr/local/go)" >&2
        exit 1
    }
    case "$version" in
        go1.2[4-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
        *) echo "example-deps: Go 1.24 or later is needed, found $version" >&2; exit 1 ;;
    esac
    (cd "$examples/go" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$go" mod download)
}

for what in "${want[@]}"; do
    case "$what" in
        python) python_deps ;;
        node) node_deps ;;
        go) go_deps ;;
        *) echo "example-deps: unknown '$what' (python, node, go)" >&2; exit 2 ;;
    esac
done
