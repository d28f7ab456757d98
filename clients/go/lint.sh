#!/usr/bin/env bash
# Lint for the Go package: go vet and staticcheck over every package of the
# module (the root, nethttp, ulule, internal/...), and of the nested modules
# bench/, compat/ and ratelimit/ (xcloak-ratelimit) when present. staticcheck is run from the Go module
# proxy at a pinned version (go run ...@version: no install, cached in the
# module cache after the first run). Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local
go=$(command -v go || echo /usr/local/go/bin/go)
staticcheck=honnef.co/go/tools/cmd/staticcheck@v0.8.2 # staticcheck 2026.2.2

for dir in . bench compat ratelimit; do
    [ -f "$dir/go.mod" ] || continue
    echo "== clients/go lint: $dir: go vet ./..."
    (cd "$dir" && "$go" vet ./...)
    echo "== clients/go lint: $dir: staticcheck ./..."
    (cd "$dir" && "$go" run "$staticcheck" ./...)
done
echo "clients/go lint: clean"
