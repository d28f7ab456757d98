// Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Node.js (ioredis),
// through the xcloak package (clients/node).
//
// ioredis does not know where the key of a module command is: a plain
// `Cluster` sends XCLOAK calls to a random primary and gets MOVED. The
// package sends each call as its own ioredis `Command` that names the key (a
// Limiter does it by itself; `xcloakCommand` from `xcloak/ioredis` builds one
// for your own calls and pipelines), so they go straight to the key's node,
// `keyPrefix` applies, and `scaleReads` sends XCLOAK.PEEK to replicas (for a
// Limiter, with `replicaReads: true`). Where the server does not have
// the module, "ERR unknown command" moves that node to the bundled Lua script.
//
//   node ratelimit-ioredis.js redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K]
//        [--peek] [--tier WINDOW_MS:LIMIT]... [--mode call|pipeline|auto] [--key-prefix PREFIX]
//   200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//   ...
//   429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//
// --mode call: a Limiter, one call at a time (default); auto: a Limiter, every
// request at once with `enableAutoPipelining`; pipeline: your own ioredis
// pipeline, one per key with all of that key's requests, read by the package's
// pure functions (allowCommand, decisionFromReply) and run again through the
// script (SCRIPTS.allow) when the server lacks the module. --peek asks
// XCLOAK.PEEK instead (writes nothing; with --cluster, `scaleReads: 'slave'`
// sends it to a replica). --key-prefix sets ioredis's `keyPrefix`. Each --tier
// adds `TIER window limit` (see cli.js).
'use strict';

const Redis = require('ioredis');
const { Limiter, SCRIPTS, allowCommand, decisionFromReply, peekCommand } = require('xcloak');
const { xcloakCommand } = require('xcloak/ioredis');
const { parseArgs, printDecision } = require('./cli');

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

const isUnknownCommand = (error) => /^ERR unknown command/i.test(error && error.message);

// All of `keys`'s requests in one pipeline of your own (one key's requests are
// on one node; ioredis refuses a pipeline whose keys live on different
// primaries). An entry answered "unknown command" ran nothing: the whole
// pipeline is sent again through the script (EVAL, which also caches it).
async function pipelined(client, keys, windowMs, limit, tiers, peek) {
  const specs = keys.map((key) => ({ key, window: windowMs, limit, tiers }));
  const commands = specs.map((spec) => (peek ? peekCommand(spec) : allowCommand(spec)));
  const send = (add) => {
    const pipeline = client.pipeline();
    for (const command of commands) add(pipeline, command);
    return pipeline.exec();
  };
  let via = 'command';
  let results = await send((pipeline, command) => pipeline.sendCommand(xcloakCommand(client, command)));
  if (!peek && results.some(([error]) => isUnknownCommand(error))) {
    via = 'script';
    results = await send((pipeline, [, key, ...args]) => pipeline.call('eval', SCRIPTS.allow.text, 1, key, ...args));
  }
  return results.map(([error, reply], i) => {
    if (error) throw error;
    return decisionFromReply(reply, specs[i], via);
  });
}

async function main(argv) {
  const options = parseArgs(argv, 'ratelimit-ioredis.js', { '--mode': 'call', '--key-prefix': '' });
  const { windowMs, limit, tiers, calls, peek, keyOf } = options;
  const client = connect(options);
  client.on('error', (error) => console.error('redis:', error.message));
  try {
    // --mode auto sends every request at once: each call's deadline then also
    // covers its wait behind the others (and the cluster's first connections),
    // so this batch allows 10 s instead of the 1 s default for one request.
    const limiter = new Limiter(client, { replicaReads: peek, ...(options['--mode'] === 'auto' ? { timeout: 10000 } : {}) });
    const check = (key) => (peek ? limiter.peek(key, windowMs, limit, { tiers }) : limiter.allow(key, windowMs, limit, { tiers }));
    const requests = Array.from({ length: calls }, (_, i) => keyOf(i));
    let decisions;
    switch (options['--mode']) {
      case 'call':
        decisions = [];
        for (const key of requests) decisions.push(await check(key));
        break;
      case 'auto':
        decisions = await Promise.all(requests.map(check));
        break;
      case 'pipeline': {
        // Request indexes per key, then one pipeline per key.
        const byKey = new Map();
        requests.forEach((key, i) => byKey.set(key, [...(byKey.get(key) || []), i]));
        decisions = new Array(calls);
        for (const [key, indexes] of byKey) {
          const replies = await pipelined(client, indexes.map(() => key), windowMs, limit, tiers, peek);
          indexes.forEach((i, n) => (decisions[i] = replies[n]));
        }
        break;
      }
      default:
        console.error(`--mode must be call, pipeline or auto, not ${options['--mode']}`);
        process.exit(2);
    }
    for (const decision of decisions) printDecision(decision);
  } finally {
    await client.quit();
  }
}

main(process.argv.slice(2)).catch((error) => {
  console.error(error);
  process.exit(1);
});
