#!/usr/bin/env bash
# xcloak-ratelimit beside envoyproxy/ratelimit on one Redis (with the module),
# the same configuration files and environment (clients/go/ratelimit/compare):
# decisions inside a window, over-admission at a window boundary, RLS calls per
# second, p50/p99 and Redis CPU per call. The reference is built from the Go
# module proxy at a pinned pseudo-version into ~/.cache/xcloak-ratelimit/ref,
# outside the repository, once per machine. Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
REFERENCE_VERSION=${REFERENCE_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
cache=${XCLOAK_RLS_CACHE:-$HOME/.cache/xcloak-ratelimit}/ref-$REFERENCE_VERSION
if [ ! -x "$cache/service_cmd" ]; then
    echo "== ratelimit-compare: building envoyproxy/ratelimit $REFERENCE_VERSION into $cache"
    mkdir -p "$cache"
    (cd /tmp && GOBIN=$cache GOFLAGS=-mod=mod go install "github.com/envoyproxy/ratelimit/src/service_cmd@$REFERENCE_VERSION")
fi
scripts/ensure-deps.sh
cd clients/go/ratelimit
go run ./compare -xcloak "$OLDPWD/target/xcloak-ratelimit" -reference "$cache/service_cmd" \
    -module "${XCLOAK_MODULE:-$OLDPWD/target/release/libxcloak.so}" "$@"
