// Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Node.js (node-redis).
//
// Asks `XCLOAK.ALLOW key window limit DETAILS` and turns the five fields into
// the status and headers of an HTTP response. Where the server does not have
// the module (a managed service), it answers "ERR unknown command": the limiter
// then runs the portable Lua script instead (EVALSHA; node-redis resends it
// with EVAL, which caches it again, when the server answers NOSCRIPT). Both
// keep the same sorted set.
//
// In cluster mode node-redis cannot know where a module command's key is:
// `sendCommand(key, isReadonly, args)` names it. --keys K spreads the requests
// over KEY:0 .. KEY:K-1; --peek asks XCLOAK.PEEK instead (see cli.js).
//
//   node ratelimit.js redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
//   200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//   ...
//   429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { createClient, createCluster, defineScript } = require('redis');
const { parseArgs, tierArgs, printDecision, isUnknownCommand } = require('./cli');

const FALLBACK_LUA = fs.readFileSync(
  process.env.XCLOAK_LUA || path.join(__dirname, '../../../src/lua/xcloak_allow.lua'),
  'utf8',
);

const xcloakAllow = defineScript({
  NUMBER_OF_KEYS: 1,
  FIRST_KEY_INDEX: 0, // routes the script by its key in cluster mode
  SCRIPT: FALLBACK_LUA,
  transformArguments: (key, windowMs, limit, tiers) => [key, String(windowMs), String(limit), ...tierArgs(tiers), 'DETAILS'],
  transformReply: (reply) => reply,
});

class Limiter {
  constructor(client, cluster) {
    this.client = client;
    this.cluster = cluster;
    this.via = 'command';
  }

  // One request against `key`: at most `limit` per `windowMs`, and at most
  // the limit of each [windowMs, limit] of `tiers` per its window. Resolves to
  // [[allowed, limit, remaining, retryAfterMs, resetAfterMs], via], with tiers
  // a sixth field: one such array (window first) per tier. With `peek`,
  // XCLOAK.PEEK (writes nothing; a replica may answer, see main).
  async check(key, windowMs, limit, tiers = [], peek = false) {
    if (peek || this.via === 'command') {
      const args = peek
        ? ['XCLOAK.PEEK', key, String(windowMs), String(limit), ...tierArgs(tiers)]
        : ['XCLOAK.ALLOW', key, String(windowMs), String(limit), ...tierArgs(tiers), 'DETAILS'];
      try {
        const reply = this.cluster
          ? await this.client.sendCommand(key, peek, args) // routed by the key; read-only for PEEK
          : await this.client.sendCommand(args);
        return [reply, 'command'];
      } catch (error) {
        if (peek || !isUnknownCommand(error)) throw error;
        this.via = 'script'; // no module on this server: use the script from now on
      }
    }
    return [await this.client.xcloakAllow(key, windowMs, limit, tiers), 'script'];
  }
}

function connect({ url, cluster, peek }) {
  const scripts = { xcloakAllow };
  if (!cluster) return createClient({ url, scripts });
  // The URL's user and password apply to every node the cluster discovers.
  const { username, password } = new URL(url);
  return createCluster({
    rootNodes: [{ url }],
    defaults: { username: decodeURIComponent(username) || undefined, password: decodeURIComponent(password) || undefined },
    // Read-only commands (PEEK, sent with isReadonly) go to the key's primary
    // and its replicas in turn; replica connections send READONLY first.
    useReplicas: peek,
    scripts,
  });
}

async function main(argv) {
  const { windowMs, limit, tiers, calls, peek, cluster, keyOf, ...options } = parseArgs(argv, 'ratelimit.js');
  const client = connect({ ...options, cluster, peek });
  client.on('error', (error) => console.error('redis:', error.message));
  await client.connect();
  try {
    const limiter = new Limiter(client, cluster);
    for (let i = 0; i < calls; i++) {
      const [details, via] = await limiter.check(keyOf(i), windowMs, limit, tiers, peek);
      printDecision(details, via);
    }
  } finally {
    await client.quit();
  }
}

main(process.argv.slice(2)).catch((error) => {
  console.error(error);
  process.exit(1);
});
