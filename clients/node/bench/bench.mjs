// The Node package's benchmark: ratios against a baseline in the same run
// (docs/clients.md; these machines are noisy, so rounds alternate and the
// median ratio is reported).
//
//   node bench/bench.mjs [--rounds N] [--calls N] [--seconds S]
//
// 1. Limiter.allow against a raw call of the same command on the same client
//    (ioredis `call`, node-redis `sendCommand`): time per call, one at a time
//    and 64 in flight. The target: at most 1.15x.
// 2. An Express app limited by xcloak's middleware against the same app with
//    express-rate-limit + rate-limit-redis (a fixed-window INCR script), both
//    on ioredis, driven by autocannon for S seconds: requests per second, and
//    CPU per request of the app's process and of redis-server (INFO cpu). Two
//    workloads: every request admitted, and most rejected.
import { fork } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import Redis from 'ioredis';
import { createClient } from 'redis';
import { Limiter } from 'xcloak';
import { Server, stopAll } from '../test/harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
};
const ROUNDS = arg('--rounds', 5);
const CALLS = arg('--calls', 20000);
const SECONDS = arg('--seconds', 8);
const KEYS = 10000;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** [wall us per call, this process's CPU us per call] for `calls` calls, `inFlight` at a time. */
async function timed(calls, inFlight, call) {
  let next = 0;
  const cpu = process.cpuUsage();
  const start = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next < calls) await call(next++);
    }),
  );
  const wall = Number(process.hrtime.bigint() - start) / 1e3 / calls;
  const used = process.cpuUsage(cpu);
  return [wall, (used.user + used.system) / calls];
}

async function perCall(server) {
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
    const limiter = new Limiter(client);
    const key = (i) => `bench:${library}:${i % KEYS}`;
    const args = ['1000', '1000000', 'DETAILS'];
    const raw =
      library === 'ioredis' ? (i) => client.call('XCLOAK.ALLOW', key(i), ...args) : (i) => client.sendCommand(['XCLOAK.ALLOW', key(i), ...args]);
    const viaLimiter = (i) => limiter.allow(key(i), 1000, 1000000);
    for (const inFlight of [1, 64]) {
      await timed(2000, inFlight, raw); // warm up both paths
      await timed(2000, inFlight, viaLimiter);
      const wall = [];
      const cpu = [];
      const raws = [];
      const ours = [];
      for (let r = 0; r < ROUNDS; r++) {
        const a = await timed(CALLS, inFlight, raw);
        const b = await timed(CALLS, inFlight, viaLimiter);
        raws.push(a);
        ours.push(b);
        wall.push(b[0] / a[0]);
        cpu.push(b[1] / a[1]);
      }
      rows.push({
        library,
        inFlight,
        raw: [median(raws.map((x) => x[0])), median(raws.map((x) => x[1]))],
        limiter: [median(ours.map((x) => x[0])), median(ours.map((x) => x[1]))],
        wall: median(wall),
        cpu: median(cpu),
        walls: wall,
      });
    }
    if (library === 'ioredis') client.disconnect();
    else await client.close();
  }
  return rows;
}

async function redisCpu(server) {
  const info = await server.info('cpu');
  return (Number(info.used_cpu_user) + Number(info.used_cpu_sys)) * 1e6; // us
}

async function http(server, kind, windowMs, limit) {
  const app = fork(path.join(here, 'app.mjs'), [kind, String(server.port), String(windowMs), String(limit)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const ask = (m) => new Promise((resolve) => { app.once('message', resolve); if (m) app.send(m); });
  const { port } = await ask();
  await new Promise((resolve, reject) => autocannon({ url: `http://127.0.0.1:${port}/`, connections: 16, duration: 1 }, (e, r) => (e ? reject(e) : resolve(r))));
  await server.admin.flushall();
  const cpu0 = (await ask('cpu')).cpu;
  const redis0 = await redisCpu(server);
  const result = await new Promise((resolve, reject) =>
    autocannon({ url: `http://127.0.0.1:${port}/`, connections: 32, duration: SECONDS }, (e, r) => (e ? reject(e) : resolve(r))),
  );
  const cpu1 = (await ask('cpu')).cpu;
  const redis1 = await redisCpu(server);
  app.kill();
  const requests = result.requests.total;
  const status = Object.fromEntries(Object.entries(result.statusCodeStats ?? {}).map(([code, s]) => [code, s.count]));
  return { kind, rps: result.requests.average, requests, appCpu: (cpu1 - cpu0) / requests, redisCpu: (redis1 - redis0) / requests, status, errors: result.errors + result.non2xx - (status['429'] ?? 0) };
}

const server = await Server.start();
try {
  console.log(`xcloak Node benchmark: Node ${process.versions.node}, ${ROUNDS} rounds of ${CALLS} calls, HTTP ${SECONDS} s per run`);
  console.log('\n1. Limiter.allow against a raw call of the same XCLOAK.ALLOW: time per call and this process\'s CPU per call (us, medians of the rounds)');
  console.log('library     in flight | raw wall  allow wall  ratio | raw CPU  allow CPU  ratio | wall ratio of each round');
  for (const r of await perCall(server)) {
    const f = (x) => x.toFixed(1).padStart(8);
    console.log(`${r.library.padEnd(11)} ${String(r.inFlight).padStart(9)} | ${f(r.raw[0])} ${f(r.limiter[0])}  ${r.wall.toFixed(2)}x | ${f(r.raw[1])} ${f(r.limiter[1])}  ${r.cpu.toFixed(2)}x | ${r.walls.map((x) => x.toFixed(2)).join(' ')}`);
  }
  console.log('\n2. Express: xcloak middleware against express-rate-limit + rate-limit-redis (ioredis, autocannon -c 32)');
  console.log('workload        limiter   req/s    app us/req  redis us/req  statuses');
  for (const [workload, windowMs, limit] of [['all admitted', 1000, 1000000], ['mostly 429', 1000, 100]]) {
    const runs = [];
    for (const kind of ['erl', 'xcloak', 'erl', 'xcloak']) runs.push(await http(server, kind, windowMs, limit));
    for (const kind of ['erl', 'xcloak']) {
      const mine = runs.filter((r) => r.kind === kind);
      const rps = median(mine.map((r) => r.rps));
      const app = median(mine.map((r) => r.appCpu));
      const redis = median(mine.map((r) => r.redisCpu));
      console.log(`${workload.padEnd(15)} ${kind.padEnd(8)} ${rps.toFixed(0).padStart(6)}   ${app.toFixed(1).padStart(9)}   ${redis.toFixed(2).padStart(10)}   ${JSON.stringify(mine[0].status)}`);
    }
    const erl = runs.filter((r) => r.kind === 'erl');
    const ours = runs.filter((r) => r.kind === 'xcloak');
    const ratio = (f) => (median(ours.map(f)) / median(erl.map(f))).toFixed(2);
    console.log(`${''.padEnd(15)} xcloak/erl: req/s ${ratio((r) => r.rps)}x, app CPU/req ${ratio((r) => r.appCpu)}x, redis CPU/req ${ratio((r) => r.redisCpu)}x`);
  }
} finally {
  await stopAll();
}
