#!/usr/bin/env bash
# The Java packages' whole suite (clients/README.md): mvn test over the reactor
# (clients/java/pom.xml: the core io.xcloak:xcloak, and the Spring modules when
# present), JUnit 5 against real servers the tests start ($XCLOAK_SERVER,
# default redis-server; the module at $XCLOAK_MODULE): every conformance vector
# (pure, and live on Lettuce and Jedis through the command and the fallback),
# Redis Cluster (3+3, 0 MOVED), Sentinel, faults (paused, stopped, CLIENT PAUSE:
# each timed-out call run once), durable mode, the block cache, the options
# refused at build, and the README's example.
#
# Needs a JDK 17+ and Maven (Debian's openjdk-17-jdk-headless and maven,
# installed when missing), redis-sentinel (likewise). Maven's downloads go to
# ~/.m2 once per machine.
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
export XCLOAK_REPO=$repo
export XCLOAK_MODULE=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
command -v javac >/dev/null 2>&1 || "$repo/scripts/ensure-deps.sh" javac:openjdk-17-jdk-headless
command -v mvn >/dev/null 2>&1 || "$repo/scripts/ensure-deps.sh" mvn:maven
command -v redis-sentinel >/dev/null 2>&1 || "$repo/scripts/ensure-deps.sh" redis-sentinel
[ -f "$XCLOAK_MODULE" ] || { echo "clients/java: no module at $XCLOAK_MODULE (make build)" >&2; exit 1; }

# scripts/sync-lua.sh writes the copies; a stale one would test the wrong script.
lua=xcloak/src/main/resources/io/xcloak/lua
for script in "$repo"/src/lua/*.lua; do
    cmp -s "$script" "$lua/$(basename "$script")" || { echo "clients/java: $lua/$(basename "$script") differs from src/lua (scripts/sync-lua.sh)" >&2; exit 1; }
done

echo "== clients/java: mvn test ($(java -version 2>&1 | head -1), $(mvn -v 2>/dev/null | head -1 | sed 's/\x1b\[[0-9;]*m//g'))"
nice -n 5 mvn -B -ntp test
