#!/usr/bin/env bash
# xcloak-ratelimit's suite (clients/go/ratelimit, a Go module of its own so the
# package's users don't pull in gRPC): the configuration loader, and the service
# over gRPC and HTTP against real servers it starts: the module and the Lua
# fallback, standalone, a 3+3 cluster and Sentinel ($XCLOAK_SERVER, default
# redis-server; the module at $XCLOAK_MODULE). clients/go/test.sh calls it.
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../../.. && pwd)}
export XCLOAK_REPO=$repo
export XCLOAK_MODULE=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
export GOTOOLCHAIN=local
go=$(command -v go || echo /usr/local/go/bin/go)
echo "== clients/go/ratelimit: go vet and go test ./... ($("$go" env GOVERSION))"
"$go" vet ./...
"$go" test -count=1 -timeout 10m ./...
