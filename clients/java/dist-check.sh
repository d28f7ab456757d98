#!/usr/bin/env bash
# Installs the Java artifacts written by dist.sh into the local Maven
# repository (mvn install:install-file: the parent pom, then each jar with its
# pom), then builds a fresh Maven project in a temporary folder that depends on
# io.xcloak:xcloak (and Lettuce) at that version, and runs one XCLOAK.ALLOW
# through it on a server it starts with the module (make dist-check).
#   clients/java/dist-check.sh DIR
set -euo pipefail
dist=$(cd "${1:?usage: dist-check.sh DIR}" && pwd)
cd "$(dirname "$0")"
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
module=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
server=${XCLOAK_SERVER:-redis-server}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
lettuce=$(sed -n 's:.*<lettuce.version>\(.*\)</lettuce.version>.*:\1:p' pom.xml)
for f in "xcloak-parent-$version.pom" "xcloak-$version.jar" "xcloak-$version.pom"; do
    [ -f "$dist/$f" ] || { echo "clients/java: no $dist/$f (make dist)" >&2; exit 1; }
done

work=$(mktemp -d)
pid=""
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

mvn -B -q -ntp install:install-file -Dfile="$dist/xcloak-parent-$version.pom" -DpomFile="$dist/xcloak-parent-$version.pom" -Dpackaging=pom
for pom in "$dist"/*-"$version".pom; do
    artifact=$(basename "$pom" "-$version.pom")
    [ "$artifact" = xcloak-parent ] && continue
    mvn -B -q -ntp install:install-file -Dfile="$dist/$artifact-$version.jar" -DpomFile="$pom"
done

# A server with the module, on a free port of the Java slice.
port=""
for p in $(seq 19900 19999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "clients/java: no free port in 19900-19999" >&2; exit 1; }
"$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --loadmodule "$module" >"$work/server.log" 2>&1 &
pid=$!

mkdir -p "$work/app/src/main/java/check" && cd "$work/app"
cat >pom.xml <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>check</groupId>
  <artifactId>check</artifactId>
  <version>1</version>
  <properties><project.build.sourceEncoding>UTF-8</project.build.sourceEncoding></properties>
  <dependencies>
    <dependency><groupId>io.xcloak</groupId><artifactId>xcloak</artifactId><version>$version</version></dependency>
    <dependency><groupId>io.lettuce</groupId><artifactId>lettuce-core</artifactId><version>$lettuce</version></dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.14.0</version>
        <configuration><release>17</release></configuration>
      </plugin>
    </plugins>
  </build>
</project>
POM
cat >src/main/java/check/Main.java <<'JAVA'
package check;

import io.lettuce.core.RedisClient;
import io.xcloak.Decision;
import io.xcloak.Fallback;
import io.xcloak.Headers;
import io.xcloak.Limiter;
import io.xcloak.Request;
import io.xcloak.Via;
import io.xcloak.lettuce.LettuceTransport;
import java.time.Duration;

public class Main {
    public static void main(String[] args) throws Exception {
        RedisClient client = RedisClient.create(args[0]);
        Decision d = null;
        Exception last = null;
        for (int attempt = 0; attempt < 50 && d == null; attempt++) { // the server may still be starting
            try (Limiter limiter = Limiter.builder(LettuceTransport.of(client)).fallback(Fallback.NEVER).build()) {
                d = limiter.allow(Request.of("dist-check", Duration.ofMinutes(1), 5));
            } catch (Exception e) {
                last = e;
                Thread.sleep(100);
            }
        }
        client.shutdown();
        if (d == null || !d.allowed() || d.remaining() != 4 || d.via() != Via.COMMAND) {
            throw new IllegalStateException("dist-check: " + d, last);
        }
        System.out.println("allowed=" + d.allowed() + " remaining=" + d.remaining() + " via=" + d.via() + " "
                + d.headers(Headers.Style.IETF).get("RateLimit"));
    }
}
JAVA
mvn -B -q -ntp compile dependency:build-classpath -Dmdep.outputFile=cp.txt
java -cp "target/classes:$(cat cp.txt)" check.Main "redis://127.0.0.1:$port"
echo "clients/java: io.xcloak:xcloak:$version installed from $dist into the local Maven repository, one call made"
