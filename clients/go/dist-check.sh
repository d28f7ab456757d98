#!/usr/bin/env bash
# Installs the Go module written by dist.sh into a clean environment and
# makes one call (make dist-check): a GOPROXY=file:// folder laid out as the
# module proxy's (<path>/@v/list, .info, .mod, .zip), an empty GOPATH,
# GOMODCACHE and GOCACHE, and a new module that requires the version,
# resolves it through that proxy (go-redis through the public one), checks
# its go.sum line against dist.sh's, and runs XCLOAK.ALLOW on a server it
# starts with the module.
#   clients/go/dist-check.sh DIR
set -euo pipefail
dist=$(cd "${1:?usage: dist-check.sh DIR}" && pwd)
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
module=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
server=${XCLOAK_SERVER:-redis-server}
export GOTOOLCHAIN=local
go=$(command -v go || echo /usr/local/go/bin/go)
version=v$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
path=$(sed -n 's/^module //p' go.mod)
for ext in zip mod info sum; do
    [ -f "$dist/xcloak-go-$version.$ext" ] || { echo "clients/go: no $dist/xcloak-go-$version.$ext (make dist)" >&2; exit 1; }
done

work=$(mktemp -d)
pid=""
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
at="$work/proxy/$path/@v"
mkdir -p "$at"
for ext in zip mod info; do cp "$dist/xcloak-go-$version.$ext" "$at/$version.$ext"; done
echo "$version" >"$at/list"
export GOPATH="$work/gopath" GOMODCACHE="$work/gopath/pkg/mod" GOCACHE="$work/cache"
export GOPROXY="file://$work/proxy,https://proxy.golang.org" GONOSUMDB="$path" GOFLAGS=-mod=mod

# A server with the module, on a free port of the Go slice.
port=""
for p in $(seq 21900 21999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "clients/go: no free port in 21900-21999" >&2; exit 1; }
"$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --loadmodule "$module" >"$work/server.log" 2>&1 &
pid=$!

mkdir "$work/app" && cd "$work/app"
cat >go.mod <<MOD
module check

go 1.24

require $path $version
MOD
cat >main.go <<'GO'
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
)

func main() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Args[1]})
	limiter, err := xcloak.NewLimiter(rdb, xcloak.Options{Fallback: xcloak.FallbackNever})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dist-check:", err)
		os.Exit(1)
	}
	var r xcloak.Decision
	for try := 0; try < 50; try++ { // the server may still be starting
		if r, err = limiter.Allow(context.Background(), "dist-check", time.Minute, 5); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || !r.Allowed || r.Remaining != 4 || r.Via != xcloak.ViaCommand {
		fmt.Fprintln(os.Stderr, "dist-check:", r, err)
		os.Exit(1)
	}
	fmt.Printf("allowed=%v remaining=%d via=%s %s\n", r.Allowed, r.Remaining, r.Via, r.Headers(xcloak.StyleIETF).Get("RateLimit"))
}
GO
"$go" mod tidy
want=$(cat "$dist/xcloak-go-$version.sum")
grep -qxF "$want" go.sum || { echo "clients/go: go.sum has $(grep "^$path $version " go.sum), dist.sh wrote $want" >&2; exit 1; }
"$go" run . "127.0.0.1:$port"
echo "clients/go: $path@$version installed from $dist through a file:// proxy, one call made"
