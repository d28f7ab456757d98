// Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Node.js (ioredis).
//
// Asks `XCLOAK.ALLOW key window limit DETAILS` and turns the five fields into
// the status and headers of an HTTP response. Where the server does not have
// the module (a managed service), it answers "ERR unknown command": the limiter
// then runs the portable Lua script instead (a `defineCommand` script: EVALSHA,
// resent with EVAL when the server answers NOSCRIPT). Both keep the same
// sorted set.
//
// ioredis does not know where the key of a module command is: without
// xcloak-ioredis.js a `Cluster` sends XCLOAK calls to a random primary and gets
// MOVED. `install()` teaches it, so calls, pipelines and auto-pipelines go
// straight to the key's node, `keyPrefix` applies, and `scaleReads` sends
// XCLOAK.PEEK to replicas.
//
//   node ratelimit-ioredis.js redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K]
//        [--peek] [--tier WINDOW_MS:LIMIT]... [--mode call|pipeline|auto] [--key-prefix PREFIX]
//   200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//   ...
//   429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//
// --mode call: one call at a time (default); pipeline: one pipeline per key
// with all of that key's requests; auto: every request at once with
// `enableAutoPipelining`. --peek asks XCLOAK.PEEK instead (writes nothing;
// with --cluster, `scaleReads: 'slave'` sends it to a replica). --key-prefix
// sets ioredis's `keyPrefix`. Each --tier adds `TIER window limit` (see cli.js).
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const Redis = require('ioredis');
const { install } = require('./xcloak-ioredis');
const { parseArgs, tierArgs, printDecision, isUnknownCommand } = require('./cli');

install();

const FALLBACK_LUA = fs.readFileSync(
  process.env.XCLOAK_LUA || path.join(__dirname, '../../../src/lua/xcloak_allow.lua'),
  'utf8',
);

class Limiter {
  constructor(client) {
    this.client = client;
    this.via = 'command';
    // Routed by its key (numberOfKeys) and prefixed like any ioredis command.
    client.defineCommand('xcloakAllowScript', { numberOfKeys: 1, lua: FALLBACK_LUA });
  }

  // Queues one request against `key` on `target` (the client, or a pipeline):
  // at most `limit` per `windowMs`, and the limit of each [windowMs, limit]
  // of `tiers` per its window.
  send(target, key, windowMs, limit, tiers, peek) {
    if (peek) return target.call('xcloak.peek', key, windowMs, limit, ...tierArgs(tiers));
    if (this.via === 'command') return target.call('xcloak.allow', key, windowMs, limit, ...tierArgs(tiers), 'DETAILS');
    return target.xcloakAllowScript(key, windowMs, limit, ...tierArgs(tiers), 'DETAILS');
  }

  // Resolves to [[allowed, limit, remaining, retryAfterMs, resetAfterMs], via];
  // with tiers, a sixth field: one such array (window first) per tier.
  async check(key, windowMs, limit, tiers = [], peek = false) {
    const via = this.via;
    try {
      return [await this.send(this.client, key, windowMs, limit, tiers, peek), peek ? 'command' : via];
    } catch (error) {
      if (peek || via === 'script' || !isUnknownCommand(error)) throw error;
      this.via = 'script'; // no module on this server: use the script from now on
      return this.check(key, windowMs, limit, tiers);
    }
  }

  // All of `requests` ([key, ...]) in one pipeline, in order. A pipeline of
  // one key's requests is always on one node; ioredis refuses a pipeline whose
  // keys live on different primaries.
  async checkPipeline(keys, windowMs, limit, tiers = [], peek = false) {
    const via = this.via;
    const pipeline = this.client.pipeline();
    for (const key of keys) this.send(pipeline, key, windowMs, limit, tiers, peek);
    const results = await pipeline.exec();
    if (!peek && via === 'command' && results.some(([error]) => isUnknownCommand(error))) {
      this.via = 'script'; // nothing was written: run them all again through the script
      return this.checkPipeline(keys, windowMs, limit, tiers);
    }
    return results.map(([error, reply]) => {
      if (error) throw error;
      return [reply, peek ? 'command' : via];
    });
  }
}

function connect(options) {
  const url = new URL(options.url);
  const auth = {
    username: decodeURIComponent(url.username) || undefined,
    password: decodeURIComponent(url.password) || undefined,
  };
  const common = { keyPrefix: options['--key-prefix'] || undefined, enableAutoPipelining: options['--mode'] === 'auto' };
  if (!options.cluster) return new Redis(options.url, common);
  return new Redis.Cluster([{ host: url.hostname, port: Number(url.port || 6379) }], {
    ...common,
    redisOptions: auth,
    scaleReads: options.peek ? 'slave' : 'master',
  });
}

async function main(argv) {
  const options = parseArgs(argv, 'ratelimit-ioredis.js', { '--mode': 'call', '--key-prefix': '' });
  const { windowMs, limit, tiers, calls, peek, keyOf } = options;
  const client = connect(options);
  client.on('error', (error) => console.error('redis:', error.message));
  try {
    const limiter = new Limiter(client);
    const requests = Array.from({ length: calls }, (_, i) => keyOf(i));
    let decisions;
    switch (options['--mode']) {
      case 'call':
        decisions = [];
        for (const key of requests) decisions.push(await limiter.check(key, windowMs, limit, tiers, peek));
        break;
      case 'auto':
        decisions = await Promise.all(requests.map((key) => limiter.check(key, windowMs, limit, tiers, peek)));
        break;
      case 'pipeline': {
        // Request indexes per key, then one pipeline per key.
        const byKey = new Map();
        requests.forEach((key, i) => byKey.set(key, [...(byKey.get(key) || []), i]));
        decisions = new Array(calls);
        for (const [key, indexes] of byKey) {
          const replies = await limiter.checkPipeline(indexes.map(() => key), windowMs, limit, tiers, peek);
          indexes.forEach((i, n) => (decisions[i] = replies[n]));
        }
        break;
      }
      default:
        console.error(`--mode must be call, pipeline or auto, not ${options['--mode']}`);
        process.exit(2);
    }
    for (const [details, via] of decisions) printDecision(details, via);
  } finally {
    await client.quit();
  }
}

main(process.argv.slice(2)).catch((error) => {
  console.error(error);
  process.exit(1);
});
