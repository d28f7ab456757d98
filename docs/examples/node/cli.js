// The command line and the output shared by the Node examples:
//
//   URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]... [extra options]
//
// Request i uses KEY, or with --keys K the key `KEY:<i mod K>`. --peek asks
// XCLOAK.PEEK (read-only, from a replica in cluster mode) instead of
// XCLOAK.ALLOW. Each --tier adds `TIER window limit` to the call. One line per
// request, in request order:
//
//   200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//
// With --tier, every tier's state as the IETF RateLimit-Policy and RateLimit
// fields, one policy per tier named by its window (docs/commands.md, "Several
// tiers"):
//
//   200 RateLimit-Policy: "60000ms";q=3;w=60, "3600000ms";q=5;w=3600 | RateLimit: "60000ms";r=2;t=60, "3600000ms";r=4;t=3600 | via command
'use strict';

const { headers } = require('xcloak');

// Parses argv; `extra` maps an option taking a value (e.g. '--mode') to its
// default. Exits with the usage on a bad command line.
function parseArgs(argv, script, extra = {}) {
  const usage = () => {
    const extras = Object.keys(extra).map((o) => ` [${o} ${o.slice(2).toUpperCase()}]`).join('');
    console.error(
      `usage: node ${script} REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...${extras}`,
    );
    process.exit(2);
  };
  const options = { cluster: false, peek: false, keys: 0, tiers: [], ...extra };
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--cluster') options.cluster = true;
    else if (arg === '--peek') options.peek = true;
    else if (arg === '--tier') {
      const tier = /^(\d+):(\d+)$/.exec(argv[++i] || '');
      if (!tier) usage();
      options.tiers.push([Number(tier[1]), Number(tier[2])]);
    }
    else if (arg === '--keys' || arg in extra) {
      if (i + 1 >= argv.length) usage();
      options[arg === '--keys' ? 'keys' : arg] = argv[++i];
    } else if (arg.startsWith('--')) usage();
    else positional.push(arg);
  }
  if (positional.length !== 5) usage();
  const [url, key, windowMs, limit, calls] = positional;
  const number = (text, min) => {
    const n = Number(text);
    if (!Number.isSafeInteger(n) || n < min) usage();
    return n;
  };
  options.keys = options.keys === 0 ? 0 : number(options.keys, 1);
  return {
    ...options,
    url,
    key,
    windowMs: number(windowMs, 1),
    limit: number(limit, 0),
    calls: number(calls, 0),
    keyOf: (i) => (options.keys ? `${key}:${i % options.keys}` : key),
  };
}

// The status and the header fields of a decision, as the xcloak package
// writes them: without tiers the draft-06 fields (RateLimit-Limit, -Remaining,
// -Reset, Retry-After when rejected); with tiers the IETF RateLimit-Policy and
// RateLimit, one policy per tier, named by its window. Seconds round up, so a
// client never comes back too early.
function printDecision(decision) {
  const fields =
    decision.tiers.length > 0
      ? headers(decision, { style: 'ietf', names: decision.tiers.map((t) => `${t.window}ms`) })
      : headers(decision, { style: 'legacy' });
  const text = Object.entries(fields).map(([name, value]) => `${name}: ${value}`).join(' | ');
  console.log(`${decision.allowed ? 200 : 429} ${text} | via ${decision.via}`);
}

module.exports = { parseArgs, printDecision };
