#!/usr/bin/env bash
# Writes the npm tarball (npm pack) into DIR: xcloak-<version>.tgz, built from
# this folder (scripts/build.mjs) with the dev dependencies of package-lock.json.
set -euo pipefail
dir=${1:?usage: clients/node/dist.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cd "$(dirname "$0")"
scripts/prepare.sh
npm pack --pack-destination "$dir" --loglevel=error
