#!/usr/bin/env bash
# The Node package's lint: the type check (tsc --noEmit, tsconfig.json: strict)
# then ESLint (eslint.config.mjs), both pinned in devDependencies. Exits non-zero
# on any finding. Runs scripts/prepare.sh first (npm ci when needed).
set -euo pipefail
cd "$(dirname "$0")"
scripts/prepare.sh
node node_modules/typescript/bin/tsc -p tsconfig.json --noEmit
node node_modules/eslint/bin/eslint.js --max-warnings 0 src test scripts eslint.config.mjs
echo "clients/node: lint clean (tsc --noEmit, eslint)"
