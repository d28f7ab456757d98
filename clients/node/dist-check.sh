#!/usr/bin/env bash
# Installs the tarball of dist.sh (DIR/xcloak-<version>.tgz) into a clean
# project with express and ioredis from the npm registry (pinned), starts a
# redis-server with the module on a free loopback port, serves an Express app
# limited by xcloak's middleware and sends one request through it: 200 with
# the RateLimit headers, decided by the module.
set -euo pipefail
dir=${1:?usage: clients/node/dist-check.sh DIR}
dir=$(cd "$dir" && pwd)
cd "$(dirname "$0")"
version=$(node -p 'require("./package.json").version')
tarball=$dir/xcloak-$version.tgz
[ -f "$tarball" ] || { echo "dist-check: $tarball missing (clients/node/dist.sh $dir)" >&2; exit 1; }
module=${XCLOAK_MODULE:-$(cd ../.. && pwd)/target/release/libxcloak.so}
server_bin=${XCLOAK_SERVER:-redis-server}

project=$(mktemp -d)
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
    rm -rf "$project"
}
trap cleanup EXIT

port=""
for _ in $(seq 1 200); do
    candidate=$((22000 + RANDOM % 500))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
done
[ -n "$port" ] || { echo "dist-check: no free port" >&2; exit 1; }
"$server_bin" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$project" --loadmodule "$module" >"$project/server.log" 2>&1 &
server_pid=$!

cd "$project"
echo '{"name":"xcloak-dist-check","private":true}' >package.json
npm install --no-audit --no-fund --loglevel=error "$tarball" express@5.2.1 ioredis@6.0.0 >/dev/null
cat >check.mjs <<'JS'
import express from 'express';
import Redis from 'ioredis';
import { Limiter } from 'xcloak';
import { rateLimit } from 'xcloak/express';

const redis = new Redis({ port: Number(process.env.PORT), host: '127.0.0.1' });
const limiter = new Limiter(redis);
const app = express();
app.get('/', rateLimit({ limiter, limits: { window: 60_000, limit: 5 } }), (req, res) => res.send('through'));
const listener = app.listen(0, '127.0.0.1', async () => {
  try {
    const response = await fetch(`http://127.0.0.1:${listener.address().port}/`);
    const body = await response.text();
    const decided = await limiter.peek('rl:http:127.0.0.1', 60_000, 5);
    console.log(response.status, body, response.headers.get('ratelimit-policy'), '|', response.headers.get('ratelimit'), '| via', decided.via);
    if (response.status !== 200 || body !== 'through' || response.headers.get('ratelimit') !== '"5-in-60s";r=4;t=60' || decided.via !== 'command') process.exitCode = 1;
  } finally {
    listener.close();
    redis.disconnect();
  }
});
JS
for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
PORT=$port node check.mjs
echo "dist-check: the tarball serves an Express app (xcloak-$version.tgz)"
