#!/usr/bin/env bash
# The Spring Cloud Gateway bench (clients/java/README.md, "Spring Cloud Gateway"):
# xcloakRateLimiter against the gateway's own RedisRateLimiter and Bucket4jRateLimiter
# (Bucket4j's Lettuce backend), one gateway, one run, one redis-server with the
# module at $XCLOAK_MODULE. Arguments (all optional): requests per round (3000),
# rounds (3), concurrency (32), clients (1000). Prints a Markdown table.
#   XCLOAK_MODULE=target/release/libxcloak.so clients/java/bench/gateway/run.sh
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../../../.. && pwd)}
export XCLOAK_MODULE=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
[ -f "$XCLOAK_MODULE" ] || { echo "bench/gateway: no module at $XCLOAK_MODULE (make build)" >&2; exit 1; }
# The packages into the local repository (the starter's test jar carries RedisServer).
(cd ../.. && mvn -B -q -ntp install -DskipTests -pl xcloak,xcloak-spring-boot-starter,xcloak-spring-cloud-gateway -am)
mvn -B -q -ntp compile dependency:build-classpath -Dmdep.outputFile=target/classpath.txt
exec java -Xms256m -Xmx1g -cp "target/classes:$(cat target/classpath.txt)" io.xcloak.bench.GatewayBench "$@"
