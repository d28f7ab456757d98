#!/usr/bin/env bash
# The Java core's bench (clients/java/README.md, Benchmarks): Limiter.allow per call against a
# raw Lettuce dispatch of the same XCLOAK.ALLOW ... DETAILS on the same connection, in
# alternating blocks on one redis-server with the module ($XCLOAK_MODULE); then a block-cache hit
# against a server rejection, and the cache's memory per entry. ROUNDS (default 20) blocks of 2000.
# `bench.sh attack [IDENTITIES ROUNDS]`: the block cache against an attack (default 1000 x 100),
# the cache on and off.
#   clients/java/bench/bench.sh [attack [IDENTITIES ROUNDS]]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
module=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
server=${XCLOAK_SERVER:-redis-server}
[ -f "$module" ] || { echo "clients/java bench: no module at $module (make build)" >&2; exit 1; }
mvn -B -q -ntp -pl xcloak test-compile dependency:build-classpath -Dmdep.outputFile=target/bench-classpath.txt -Dmdep.includeScope=test
work=$(mktemp -d)
pid=""
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port=""
for p in $(seq 19900 19999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
"$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --loadmodule "$module" >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
echo "== clients/java bench: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, $(java -version 2>&1 | head -1)"
java -cp "xcloak/target/classes:xcloak/target/test-classes:$(cat xcloak/target/bench-classpath.txt)" io.xcloak.Bench "$port" "${@:-${ROUNDS:-20}}"
