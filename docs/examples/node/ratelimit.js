// Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Node.js (node-redis).
//
// Asks `XCLOAK.ALLOW key window limit DETAILS` and turns the five fields into
// the status and headers of an HTTP response. Where the server does not have
// the module (a managed service), it answers "ERR unknown command": the limiter
// then runs the portable Lua script instead (EVALSHA; node-redis resends it
// with EVAL, which caches it again, when the server answers NOSCRIPT). Both
// keep the same sorted set.
//
//   node ratelimit.js redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster]
//   200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//   ...
//   429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { createClient, createCluster, defineScript } = require('redis');

const FALLBACK_LUA = fs.readFileSync(
  process.env.XCLOAK_LUA || path.join(__dirname, '../../../src/lua/xcloak_allow.lua'),
  'utf8',
);

const xcloakAllow = defineScript({
  NUMBER_OF_KEYS: 1,
  FIRST_KEY_INDEX: 0, // routes the script by its key in cluster mode
  SCRIPT: FALLBACK_LUA,
  transformArguments: (key, windowMs, limit) => [key, String(windowMs), String(limit), 'DETAILS'],
  transformReply: (reply) => reply,
});

class Limiter {
  constructor(client, cluster) {
    this.client = client;
    this.cluster = cluster;
    this.via = 'command';
  }

  // One request against `key`: at most `limit` per `windowMs`. Resolves to
  // [[allowed, limit, remaining, retryAfterMs, resetAfterMs], via].
  async check(key, windowMs, limit) {
    if (this.via === 'command') {
      const args = ['XCLOAK.ALLOW', key, String(windowMs), String(limit), 'DETAILS'];
      try {
        const reply = this.cluster
          ? await this.client.sendCommand(key, false, args) // routed by the key
          : await this.client.sendCommand(args);
        return [reply, 'command'];
      } catch (error) {
        if (!/unknown command/i.test(error.message)) throw error;
        this.via = 'script'; // no module on this server: use the script from now on
      }
    }
    return [await this.client.xcloakAllow(key, windowMs, limit), 'script'];
  }
}

// Status and headers of the HTTP response (delta-seconds, rounded up so a
// client never comes back too early).
function httpDecision([allowed, limit, remaining, retryAfterMs, resetAfterMs]) {
  const headers = {
    'RateLimit-Limit': String(limit),
    'RateLimit-Remaining': String(remaining),
    'RateLimit-Reset': String(Math.ceil(resetAfterMs / 1000)),
  };
  if (allowed === 1) return [200, headers];
  if (retryAfterMs >= 0) headers['Retry-After'] = String(Math.ceil(retryAfterMs / 1000)); // -1: never fits
  return [429, headers];
}

async function main(argv) {
  const cluster = argv.includes('--cluster');
  const args = argv.filter((a) => a !== '--cluster');
  if (args.length !== 5) {
    console.error('usage: node ratelimit.js REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster]');
    process.exit(2);
  }
  const [url, key, windowMs, limit, calls] = args;
  const scripts = { xcloakAllow };
  const client = cluster ? createCluster({ rootNodes: [{ url }], scripts }) : createClient({ url, scripts });
  client.on('error', (error) => console.error('redis:', error.message));
  await client.connect();
  try {
    const limiter = new Limiter(client, cluster);
    for (let i = 0; i < Number(calls); i++) {
      const [details, via] = await limiter.check(key, Number(windowMs), Number(limit));
      const [status, headers] = httpDecision(details);
      const fields = Object.entries(headers).map(([name, value]) => `${name}: ${value}`).join(' | ');
      console.log(`${status} ${fields} | via ${via}`);
    }
  } finally {
    await client.quit();
  }
}

main(process.argv.slice(2)).catch((error) => {
  console.error(error);
  process.exit(1);
});
