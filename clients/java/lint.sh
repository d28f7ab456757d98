#!/usr/bin/env bash
# Lint for the Java packages: the whole reactor compiled (main and tests) by
# maven-compiler-plugin with -Xlint:all -Werror (clients/java/pom.xml), so any
# javac warning fails; then the jars are packaged (mvn verify, tests skipped:
# test.sh runs them). Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
command -v javac >/dev/null 2>&1 || "$repo/scripts/ensure-deps.sh" javac:openjdk-17-jdk-headless
command -v mvn >/dev/null 2>&1 || "$repo/scripts/ensure-deps.sh" mvn:maven
echo "== clients/java lint: mvn verify -DskipTests (javac -Xlint:all -Werror)"
mvn -B -q -ntp verify -DskipTests
echo "clients/java lint: clean"
