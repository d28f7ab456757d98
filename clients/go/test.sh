#!/usr/bin/env bash
# The Go package's whole suite (clients/README.md): go test ./... in
# clients/go: the conformance vectors (pure, and live through the command
# and through the Lua fallback), ulule/limiter's store suite, net/http
# middleware over loopback, Redis Cluster, Sentinel, Ring, faults (paused,
# stopped, lost replies) and durable mode, against real servers it starts
# ($XCLOAK_SERVER, default redis-server; the module at $XCLOAK_MODULE).
# Then compat/ (its own module: go-redis/redis_rate v10 beside xcloak, the
# README's field-by-field mapping), and the fault, vector and cluster tests again on the newest go-redis
# served (testdata/go-redis-latest.mod): go.mod holds the oldest the package
# supports (9.19.0, the first with Cmder.NoRetry), which is what it needs.
#
# Needs Go 1.24+ (on PATH, or /usr/local/go; Debian's golang-go is too old)
# and redis-sentinel (Debian's package, installed when missing). Modules come
# from the Go module proxy, pinned by go.sum, into the usual module cache.
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
export XCLOAK_REPO=$repo
export XCLOAK_MODULE=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
export GOTOOLCHAIN=local

go=$(command -v go || echo /usr/local/go/bin/go)
version=$("$go" env GOVERSION 2>/dev/null) || { echo "clients/go: Go 1.24 or later is needed (not on PATH, nor in /usr/local/go)" >&2; exit 1; }
case "$version" in
    go1.2[4-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
    *) echo "clients/go: Go 1.24 or later is needed, found $version" >&2; exit 1 ;;
esac
[ -f "$XCLOAK_MODULE" ] || { echo "clients/go: no module at $XCLOAK_MODULE (make build)" >&2; exit 1; }
command -v redis-sentinel >/dev/null 2>&1 || "$repo/scripts/ensure-deps.sh" redis-sentinel

# scripts/sync-lua.sh writes lua/; a stale copy would test the wrong script.
for script in "$repo"/src/lua/*.lua; do
    cmp -s "$script" "lua/$(basename "$script")" || { echo "clients/go: lua/$(basename "$script") differs from src/lua (scripts/sync-lua.sh)" >&2; exit 1; }
done

echo "== clients/go: go test ./... ($version, go-redis $(grep -m1 'redis/go-redis/v9 ' go.mod | awk '{print $2}'))"
"$go" test -count=1 -timeout 15m ./...
echo "== clients/go: compat (redis_rate side by side, a module of its own)"
(cd compat && "$go" test -count=1 -timeout 5m ./...)
latest=$(grep -m1 'redis/go-redis/v9 ' testdata/go-redis-latest.mod | awk '{print $2}')
echo "== clients/go: faults, vectors and cluster on go-redis $latest"
"$go" test -count=1 -timeout 10m -modfile=testdata/go-redis-latest.mod \
    -run 'TestPaused|TestLost|TestOutages|TestServerReplies|TestVectors|TestCluster' .
# xcloak-ratelimit, the service for Envoy: a module of its own (ratelimit/test.sh).
bash ratelimit/test.sh
