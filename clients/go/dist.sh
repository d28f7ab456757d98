#!/usr/bin/env bash
# Writes the Go module as the Go module proxy serves it, into DIR
# (make dist: target/dist): xcloak-go-vX.Y.Z.zip (golang.org/x/mod/zip, the
# file go mod download fetches), .mod and .info, and the go.sum line of the
# zip in xcloak-go-vX.Y.Z.sum. As the proxy does, the zip holds the files of
# the commit (git archive HEAD), not of the work tree, without the nested
# modules (bench/, internal/modzip/), and the repository's LICENSE. The
# version is Cargo.toml's; the .info's time the commit's. Needs Go 1.24+
# (see test.sh) and golang.org/x/mod from the module proxy (pinned in
# internal/modzip/go.sum).
#   clients/go/dist.sh DIR
set -euo pipefail
out=$(mkdir -p "${1:?usage: dist.sh DIR}" && cd "$1" && pwd)
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
export GOTOOLCHAIN=local
go=$(command -v go || echo /usr/local/go/bin/go)
version=v$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
path=$(sed -n 's/^module //p' go.mod)
when=$(git -C "$repo" log -1 --format=%cI 2>/dev/null || echo 1970-01-01T00:00:00Z)
when=$(date -u -d "$when" +%Y-%m-%dT%H:%M:%SZ)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    [ -z "$(git -C "$repo" status --porcelain -- clients/go)" ] || echo "clients/go: uncommitted changes are not in the zip (it is made from HEAD)" >&2
    git -C "$repo" archive HEAD clients/go | tar -x -C "$tree"
else
    mkdir -p "$tree/clients" && cp -R . "$tree/clients/go"
fi
[ -f "$tree/clients/go/LICENSE" ] || cp "$repo/LICENSE" "$tree/clients/go/LICENSE"
(cd internal/modzip && "$go" run . -dir "$tree/clients/go" -path "$path" -version "$version" -time "$when" -out "$out") >"$out/xcloak-go-$version.sum"
echo "clients/go: $out/xcloak-go-$version.zip ($(cut -d' ' -f3 "$out/xcloak-go-$version.sum"))"
