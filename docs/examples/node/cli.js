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
// With --tier, the reply's sixth field (one [window, limit, remaining,
// retryAfterMs, resetAfterMs] per tier) as the IETF RateLimit-Policy and
// RateLimit fields, one policy per tier named by its window (docs/commands.md,
// "Several tiers"):
//
//   200 RateLimit-Policy: "60000ms";q=3;w=60, "3600000ms";q=5;w=3600 | RateLimit: "60000ms";r=2;t=60, "3600000ms";r=4;t=3600 | via command
'use strict';

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

// `TIER window limit` for each [windowMs, limit].
function tierArgs(tiers) {
  return tiers.flatMap(([windowMs, limit]) => ['TIER', String(windowMs), String(limit)]);
}

const seconds = (ms) => Math.ceil(ms / 1000); // round up: never send a client back too early

// Status and headers of the HTTP response (delta-seconds, rounded up so a
// client never comes back too early).
function httpDecision(details) {
  if (details.length === 6) return policyDecision(details);
  const [allowed, limit, remaining, retryAfterMs, resetAfterMs] = details;
  const headers = {
    'RateLimit-Limit': String(limit),
    'RateLimit-Remaining': String(remaining),
    'RateLimit-Reset': String(Math.ceil(resetAfterMs / 1000)),
  };
  if (allowed === 1) return [200, headers];
  if (retryAfterMs >= 0) headers['Retry-After'] = String(Math.ceil(retryAfterMs / 1000)); // -1: never fits
  return [429, headers];
}

// With tiers, draft-ietf-httpapi-ratelimit-headers-09: one policy per tier in
// RateLimit-Policy (quota, window) and in RateLimit (remaining, seconds until
// it is back), named by its window; Retry-After is the binding tier's.
function policyDecision([allowed, , , retryAfterMs, , tiers]) {
  const name = ([windowMs]) => `"${windowMs}ms"`;
  const headers = {
    'RateLimit-Policy': tiers.map((t) => `${name(t)};q=${t[1]};w=${seconds(t[0])}`).join(', '),
    RateLimit: tiers.map((t) => `${name(t)};r=${t[2]};t=${seconds(t[4])}`).join(', '),
  };
  if (allowed === 1) return [200, headers];
  if (retryAfterMs > 0) headers['Retry-After'] = String(seconds(retryAfterMs)); // -1: never fits
  return [429, headers];
}

function printDecision(details, via) {
  const [status, headers] = httpDecision(details);
  const fields = Object.entries(headers).map(([name, value]) => `${name}: ${value}`).join(' | ');
  console.log(`${status} ${fields} | via ${via}`);
}

function isUnknownCommand(error) {
  return /unknown command/i.test(error && error.message);
}

module.exports = { parseArgs, tierArgs, httpDecision, printDecision, isUnknownCommand };
