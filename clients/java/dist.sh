#!/usr/bin/env bash
# Writes the Java packages into DIR (make dist: target/dist) as Maven
# Central lays them out: for each module of the reactor, <artifact>-<version>.jar
# and its <artifact>-<version>.pom, and the parent's xcloak-parent-<version>.pom
# (the modules' poms name it). The version is the parent pom's, which must be
# Cargo.toml's (one version for the release). The jars are reproducible
# (project.build.outputTimestamp).
#   clients/java/dist.sh DIR
set -euo pipefail
out=$(mkdir -p "${1:?usage: dist.sh DIR}" && cd "$1" && pwd)
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
pom_version=$(sed -n '0,/<version>/s:.*<version>\(.*\)</version>.*:\1:p' pom.xml)
[ "$pom_version" = "$version" ] || { echo "clients/java: pom.xml is $pom_version, Cargo.toml $version" >&2; exit 1; }
mvn -B -q -ntp package -DskipTests
cp pom.xml "$out/xcloak-parent-$version.pom"
for module in */pom.xml; do
    dir=$(dirname "$module")
    artifact=$(sed -n '/<\/parent>/,$p' "$module" | sed -n '0,/<artifactId>/s:.*<artifactId>\(.*\)</artifactId>.*:\1:p')
    jar="$dir/target/$artifact-$version.jar"
    [ -f "$jar" ] || { echo "clients/java: $jar was not built" >&2; exit 1; }
    cp "$jar" "$out/"
    cp "$module" "$out/$artifact-$version.pom"
    echo "dist (java): wrote $out/$artifact-$version.jar and .pom" >&2
done
