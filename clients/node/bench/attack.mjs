// The attack bench of the block cache (docs/clients.md, Block cache; issue 32):
// a credential-stuffing wave through xcloak's Express middleware on a real
// HTTP server (node:http on loopback, its own process), the block cache ON
// and OFF in the same run, on one redis-server with the module, against the
// same route without the middleware (the latency baseline).
//
//   node bench/attack.mjs [--identities 50] [--rounds 1000] [--legit 1000] [--connections 16] [--calls 20000] [--repeat 3] [--json PATH]
//
// --json PATH (or $XCLOAK_ATTACK_JSON) also writes the figures in the shape
// every package's attack bench writes (scripts/bench's block-cache section).
//
// The attack: each of --identities identities sends --rounds requests (100x
// its limit of 10 per 60 s at the default), interleaved round-robin; beside
// it, --legit other identities send 5 requests each, spread over the rounds
// (below their limit). Reported per mode: Redis calls per request (INFO
// commandstats of xcloak.allow / requests), redis-server CPU per request
// (commandstats usec, and INFO cpu), the app's CPU per request, requests per
// second, p50 / p99 latency and what the middleware adds to the baseline's,
// the share of attack rejections answered without a call (limiter.stats),
// over-admission (admitted per identity above 10, from the responses, and
// checked against the server's own count: ZCARD of each key), legitimate
// requests rejected. The three modes alternate, --repeat times (the machine is
// shared and noisy): medians are reported, and the over-admission and
// legitimate rejections of every run. Then, in this process, a cached rejection's cost against
// a server round trip (N sequential allow() on a blocked key, cache on vs
// off), on ioredis and node-redis.
import { execFileSync, fork } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import os from 'node:os';
import Redis from 'ioredis';
import { createClient } from 'redis';
import { Limiter } from 'xcloak';
import { Server, stopAll } from '../test/harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
};
const IDENTITIES = arg('--identities', 50);
const ROUNDS = arg('--rounds', 1000);
const LEGIT = arg('--legit', 1000);
const CONNECTIONS = arg('--connections', 16);
const CALLS = arg('--calls', 20000);
const REPEAT = arg('--repeat', 3);
const JSON_PATH = process.argv.includes('--json') ? process.argv[process.argv.indexOf('--json') + 1] : process.env.XCLOAK_ATTACK_JSON;
const WINDOW = 60000;
const LIMIT = 10;
const LEGIT_EACH = 5;

/** The requests, in order: `[identity, attack?]`. */
function schedule() {
  const out = [];
  const spread = Math.max(1, Math.floor(ROUNDS / LEGIT_EACH));
  for (let r = 0; r < ROUNDS; r++) {
    for (let i = 0; i < IDENTITIES; i++) out.push([`a${i}`, true]);
    // Legitimate identity j sends in the rounds where r % spread == j % spread: LEGIT_EACH of them.
    if (r < spread * LEGIT_EACH) for (let j = r % spread; j < LEGIT; j += spread) out.push([`l${j}`, false]);
  }
  return out;
}

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];

async function drive(port, requests) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const latency = new Float64Array(requests.length);
  const status = new Uint16Array(requests.length);
  let next = 0;
  const one = (i) =>
    new Promise((resolve, reject) => {
      const started = performance.now();
      const req = http.request({ host: '127.0.0.1', port, path: '/', agent, headers: { 'x-id': requests[i][0] } }, (res) => {
        res.resume();
        res.on('end', () => {
          latency[i] = performance.now() - started;
          status[i] = res.statusCode;
          resolve();
        });
      });
      req.on('error', reject);
      req.end();
    });
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (next < requests.length) await one(next++);
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  agent.destroy();
  return { latency, status, seconds };
}

async function commandstats(server) {
  const stats = await server.info('commandstats');
  const out = { calls: 0, usec: 0 };
  for (const name of ['xcloak.allow', 'evalsha', 'eval']) {
    const line = stats[`cmdstat_${name}`];
    if (!line) continue;
    out.calls += Number(/calls=(\d+)/.exec(line)[1]);
    out.usec += Number(/usec=(\d+)/.exec(line)[1]);
  }
  return out;
}

async function redisCpu(server) {
  const info = await server.info('cpu');
  return (Number(info.used_cpu_user) + Number(info.used_cpu_sys)) * 1e6;
}

async function run(server, mode, requests) {
  await server.admin.flushall();
  const app = fork(path.join(here, 'attack-app.mjs'), [mode, String(server.port), String(WINDOW), String(LIMIT)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const ask = (m) =>
    new Promise((resolve) => {
      app.once('message', resolve);
      if (m) app.send(m);
    });
  const { port } = await ask();
  // Warm up on identities of their own (not counted), then reset the counters.
  await drive(port, Array.from({ length: 2000 }, (_, i) => [`warm${i % 500}`, false]));
  await server.admin.flushall();
  await server.resetStats();
  const app0 = await ask('cpu');
  const redis0 = await redisCpu(server);
  const result = await drive(port, requests);
  const app1 = await ask('cpu');
  const redis1 = await redisCpu(server);
  const stats = await commandstats(server);
  // The server's own count of each attack identity's admissions (the window outlasts the run).
  const serverCount = new Map();
  const pipeline = server.admin.pipeline();
  for (let i = 0; i < IDENTITIES; i++) pipeline.zcard(`rl:http:a${i}`);
  (await pipeline.exec()).forEach(([, n], i) => serverCount.set(`a${i}`, n));
  app.kill();
  return { mode, ...result, stats, appCpu: app1.cpu - app0.cpu, redisCpu: redis1 - redis0, cache: app1.stats, serverCount };
}

function summarize(r, requests, baseline) {
  const n = requests.length;
  const admitted = new Map();
  let attack = 0;
  let attackRejected = 0;
  let legit = 0;
  let legitRejected = 0;
  for (let i = 0; i < n; i++) {
    const [id, isAttack] = requests[i];
    const ok = r.status[i] === 200;
    if (r.status[i] !== 200 && r.status[i] !== 429) throw new Error(`${r.mode}: status ${r.status[i]}`);
    if (isAttack) {
      attack++;
      if (ok) admitted.set(id, (admitted.get(id) ?? 0) + 1);
      else attackRejected++;
    } else {
      legit++;
      if (!ok) legitRejected++;
    }
  }
  let over = 0;
  let serverOver = 0;
  let mismatch = 0;
  for (let i = 0; i < IDENTITIES; i++) {
    const id = `a${i}`;
    const seen = admitted.get(id) ?? 0;
    const counted = r.serverCount.get(id) ?? 0;
    over += Math.max(0, seen - LIMIT);
    serverOver += Math.max(0, counted - LIMIT);
    if (seen !== counted) mismatch++;
  }
  const sorted = Float64Array.from(r.latency).sort();
  const p50 = quantile(sorted, 0.5);
  const p99 = quantile(sorted, 0.99);
  return {
    mode: r.mode,
    requests: n,
    seconds: r.seconds,
    rps: n / r.seconds,
    callsPerRequest: r.stats.calls / n,
    // A legitimate request is never rejected, so never cached: one call each.
    callsPerAttack: (r.stats.calls - (r.mode === 'none' ? 0 : legit)) / attack,
    usecPerRequest: r.stats.usec / n,
    redisCpuPerRequest: r.redisCpu / n,
    appCpuPerRequest: r.appCpu / n,
    p50,
    p99,
    p50Added: baseline ? p50 - baseline.p50 : 0,
    p99Added: baseline ? p99 - baseline.p99 : 0,
    attackRejected,
    cachedShare: attackRejected ? r.cache.cacheHits / attackRejected : 0,
    cacheHits: r.cache.cacheHits,
    over,
    serverOver,
    mismatch,
    legit,
    legitRejected,
  };
}

/** Per call, sequential: [wall us, CPU us] of `n` allow() on a blocked key. */
async function perCall(limiter, key, n) {
  const cpu = process.cpuUsage();
  const started = performance.now();
  for (let i = 0; i < n; i++) {
    const d = await limiter.allow(key, WINDOW, 1);
    if (d.allowed) throw new Error('admitted');
  }
  const wall = ((performance.now() - started) * 1000) / n;
  const used = process.cpuUsage(cpu);
  return [wall, (used.user + used.system) / n];
}

async function cachedVsServer(server) {
  const rows = [];
  for (const library of ['ioredis', 'node-redis']) {
    let client;
    if (library === 'ioredis') {
      client = new Redis({ port: server.port, host: '127.0.0.1' });
      await new Promise((resolve) => client.once('ready', resolve));
    } else {
      client = createClient({ url: server.url });
      await client.connect();
    }
    const cached = new Limiter(client);
    const sent = new Limiter(client, { blockCache: 0 });
    const key = `blocked:${library}`;
    await cached.allow(key, WINDOW, 1);
    await cached.allow(key, WINDOW, 1); // the server's rejection: the entry is held
    await perCall(cached, key, 2000); // warm up both paths
    await perCall(sent, key, 500);
    // Rounds alternate (the machine is shared and noisy): the medians of 5.
    const hits = [];
    const trips = [];
    let sentByHits = 0;
    for (let round = 0; round < 5; round++) {
      const calls0 = (await commandstats(server)).calls;
      hits.push(await perCall(cached, key, CALLS));
      sentByHits += (await commandstats(server)).calls - calls0;
      trips.push(await perCall(sent, key, Math.max(1000, Math.floor(CALLS / 10))));
    }
    const mid = (xs, k) => xs.map((x) => x[k]).sort((a, b) => a - b)[2];
    rows.push({ library, hit: [mid(hits, 0), mid(hits, 1)], trip: [mid(trips, 0), mid(trips, 1)], sentByHits });
    if (library === 'ioredis') client.disconnect();
    else await client.close();
  }
  return rows;
}

const server = await Server.start();
try {
  const requests = schedule();
  const attack = requests.filter(([, a]) => a).length;
  console.log(`xcloak Node attack bench: Node ${process.versions.node}, ${new Date().toISOString()}, load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}, ${os.cpus().length} CPUs`);
  console.log(
    `${IDENTITIES} attacking identities x ${ROUNDS} rounds (${ROUNDS / LIMIT}x the limit of ${LIMIT} per ${WINDOW / 1000} s each) = ${attack} attack requests, ` +
      `interleaved, + ${requests.length - attack} legitimate (${LEGIT} identities x ${LEGIT_EACH}); ${CONNECTIONS} keep-alive connections; Express middleware, ioredis`,
  );
  const runs = { none: [], off: [], on: [] };
  for (let k = 0; k < REPEAT; k++) for (const mode of ['none', 'off', 'on']) runs[mode].push(await run(server, mode, requests));
  const middle = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  /** The median of each figure over the runs of a mode; the counts that must be 0 summed over all of them. */
  const combine = (summaries) => {
    const out = { ...summaries[0] };
    for (const k of Object.keys(out)) if (typeof out[k] === 'number') out[k] = middle(summaries.map((x) => x[k]));
    for (const k of ['over', 'serverOver', 'mismatch', 'legitRejected', 'legit']) out[k] = summaries.reduce((a, x) => a + x[k], 0);
    out.seconds = Math.max(...summaries.map((x) => x.seconds));
    return out;
  };
  const base = combine(runs.none.map((r) => summarize(r, requests)));
  const rows = ['off', 'on'].map((mode) => combine(runs[mode].map((r) => summarize(r, requests, base))));
  console.log(`(${REPEAT} runs of each mode, alternating: medians; over-admission and legitimate rejections summed over the runs; seconds: the longest run)`);
  const f = (x, d = 2) => x.toFixed(d);
  console.log(`\nbaseline (no middleware): ${f(base.rps, 0)} req/s, p50 ${f(base.p50)} ms, p99 ${f(base.p99)} ms, app CPU ${f(base.appCpuPerRequest, 1)} us/request`);
  console.log('\ncache | req/s | Redis calls/request | calls/attack request | attack rejections without a call | XCLOAK.ALLOW usec/request | redis-server CPU us/request | app CPU us/request | p50 (added) ms | p99 (added) ms | over-admitted (server) | legit rejected | seconds');
  for (const r of rows) {
    console.log(
      `${r.mode.padEnd(5)} | ${f(r.rps, 0)} | ${f(r.callsPerRequest, 3)} | ${f(r.callsPerAttack, 3)} | ${f(100 * r.cachedShare, 1)}% (${r.cacheHits} of ${r.attackRejected}) | ${f(r.usecPerRequest)} | ${f(r.redisCpuPerRequest)} | ${f(r.appCpuPerRequest, 1)} | ` +
        `${f(r.p50)} (${f(r.p50Added)}) | ${f(r.p99)} (${f(r.p99Added)}) | ${r.over} (${r.serverOver}; ${r.mismatch} identities where responses and ZCARD differ) | ${r.legitRejected} of ${r.legit} | ${f(r.seconds, 1)}`,
    );
  }
  const [off, on] = rows;
  console.log(`\non/off: req/s ${f(on.rps / off.rps)}x, Redis calls/request ${f(on.callsPerRequest / off.callsPerRequest, 3)}x, redis-server CPU/request ${f(on.redisCpuPerRequest / off.redisCpuPerRequest)}x, app CPU/request ${f(on.appCpuPerRequest / off.appCpuPerRequest)}x`);
  for (const r of rows) if (r.seconds * 1000 >= WINDOW) console.log(`warning: the ${r.mode} run took longer than the window: admissions may have left it`);

  console.log(`\nA cached rejection against a server round trip, in this process (sequential allow() on a blocked key; 5 alternating rounds of ${CALLS} hits and ${Math.max(1000, Math.floor(CALLS / 10))} sent calls, medians):`);
  console.log('library    | cached: wall us, CPU us | server: wall us, CPU us | wall ratio | CPU ratio | calls sent by the hits');
  const perCallRows = await cachedVsServer(server);
  for (const r of perCallRows) {
    console.log(`${r.library.padEnd(10)} | ${f(r.hit[0])}, ${f(r.hit[1])} | ${f(r.trip[0], 1)}, ${f(r.trip[1], 1)} | ${f(r.hit[0] / r.trip[0], 4)} | ${f(r.hit[1] / r.trip[1], 4)} | ${r.sentByHits}`);
  }
  if (JSON_PATH) {
    const memory = JSON.parse(execFileSync(process.execPath, ['--expose-gc', path.join(here, 'memory.mjs'), '--entries', '10000', '--json'], { encoding: 'utf8' }));
    const mode = (r) => ({
      calls_per_request: r.callsPerRequest,
      calls_per_attack_request: r.callsPerAttack,
      cache_answered_share: r.cachedShare,
      server_usec_per_request: r.usecPerRequest,
      rps: r.rps,
      p50_ms: r.p50Added,
      p99_ms: r.p99Added,
      overadmitted: Math.max(r.over, r.serverOver),
      legit_rejected: r.legitRejected,
    });
    const ioredisRow = perCallRows.find((r) => r.library === 'ioredis');
    const out = {
      package: 'node',
      middleware: 'xcloak/express rateLimit (Express 5 on node:http, ioredis)',
      when: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
      load: os.loadavg()[0],
      scale: { identities: IDENTITIES, attack_per_identity: ROUNDS, legit_identities: LEGIT, legit_per_identity: LEGIT_EACH, requests: requests.length, rounds: REPEAT },
      on: mode(rows[1]),
      off: mode(rows[0]),
      cached_ns: ioredisRow.hit[0] * 1000,
      roundtrip_ns: ioredisRow.trip[0] * 1000,
      cached_vs_roundtrip: ioredisRow.hit[0] / ioredisRow.trip[0],
      bytes_per_entry: memory.no_tiers,
    };
    writeFileSync(JSON_PATH, JSON.stringify(out, null, 1));
    console.log(`\nwrote ${JSON_PATH}`);
  }
} finally {
  await stopAll();
}
