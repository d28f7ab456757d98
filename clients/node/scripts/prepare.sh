#!/usr/bin/env bash
# Makes clients/node ready to run: `npm ci` into node_modules when it is missing
# or package-lock.json changed, then the build (scripts/build.mjs) when any of
# its inputs changed since the last one. Stamps in node_modules/ and dist/
# record what was done, so a second run does nothing. Used by test.sh, dist.sh,
# `npm pack` (the prepack script: a plain `npm pack` builds dist/ first) and
# scripts/example-deps.sh (the examples use this package from its folder).
# Needs node >= 20 and npm on PATH (test.sh sees to it).
set -euo pipefail
cd "$(dirname "$0")/.."
installed="$(sha256sum package-lock.json | cut -d' ' -f1) node-$(node -p 'process.versions.node.split(".")[0]')"
if [ "$(cat node_modules/.xcloak-installed 2>/dev/null)" != "$installed" ]; then
    echo "clients/node: npm ci (package-lock.json)" >&2
    npm ci --no-audit --no-fund --loglevel=error >/dev/null
    echo "$installed" >node_modules/.xcloak-installed
fi
built=$(cat package.json tsconfig.json scripts/build.mjs src/*.ts lua/*.lua 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat node_modules/.xcloak-built 2>/dev/null)" != "$built" ] || [ ! -f dist/index.mjs ]; then
    node scripts/build.mjs
    echo "$built" >node_modules/.xcloak-built
fi
