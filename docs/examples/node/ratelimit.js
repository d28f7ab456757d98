// Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Node.js (node-redis),
// through the xcloak package (clients/node): a Limiter over a node-redis
// client or cluster asks `XCLOAK.ALLOW key window limit DETAILS` and reads the
// reply into a Decision; `headers()` writes its HTTP fields. Where the server
// does not have the module (a managed service), it answers "ERR unknown
// command": the Limiter then runs the bundled Lua script on that node instead
// (EVALSHA, EVAL of its text on NOSCRIPT). Both keep the same sorted set.
//
// In cluster mode the Limiter routes each call by its key
// (`sendCommand(key, isReadonly, args)`); --peek asks XCLOAK.PEEK, which
// `useReplicas` may send to a replica (the Limiter's `replicaReads`). --keys K spreads the requests over
// KEY:0 .. KEY:K-1 (see cli.js).
//
//   node ratelimit.js redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
//   200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//   ...
//   429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
'use strict';

const { createClient, createCluster } = require('redis');
const { Limiter } = require('xcloak');
const { parseArgs, printDecision } = require('./cli');

function connect({ url, cluster, peek }) {
  if (!cluster) return createClient({ url });
  // The URL's user and password apply to every node the cluster discovers.
  const { username, password } = new URL(url);
  return createCluster({
    rootNodes: [{ url }],
    defaults: { username: decodeURIComponent(username) || undefined, password: decodeURIComponent(password) || undefined },
    // Read-only commands (PEEK) go to the key's primary and its replicas in
    // turn; replica connections send READONLY first.
    useReplicas: peek,
  });
}

async function main(argv) {
  const { windowMs, limit, tiers, calls, peek, keyOf, ...options } = parseArgs(argv, 'ratelimit.js');
  const client = connect({ ...options, peek });
  client.on('error', (error) => console.error('redis:', error.message));
  await client.connect();
  try {
    const limiter = new Limiter(client, { replicaReads: peek });
    for (let i = 0; i < calls; i++) {
      const decision = peek ? await limiter.peek(keyOf(i), windowMs, limit, { tiers }) : await limiter.allow(keyOf(i), windowMs, limit, { tiers });
      printDecision(decision);
    }
  } finally {
    await client.close();
  }
}

main(process.argv.slice(2)).catch((error) => {
  console.error(error);
  process.exit(1);
});
