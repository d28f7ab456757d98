// The Express (5 and 4) and Fastify middleware, driven over real HTTP on
// loopback against a real server: the key (address; forwarded only through
// trusted proxies), several limits and tiers per route, 429 and the
// contract's headers (also on allowed responses), skip*Requests by the exact
// refund of the request's own stamp, never-fits, the error policy with a
// timeout, and a bad argument raised whatever the policy.
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import express5 from 'express';
import express4 from 'express4';
import Fastify from 'fastify';
import { XcloakError, Limiter } from 'xcloak';
import { rateLimit as expressRateLimit, clientAddress } from 'xcloak/express';
import { rateLimit as fastifyRateLimit } from 'xcloak/fastify';
import { Server, stopAll, waitFor } from './harness.mjs';
import { close, connect } from './clients.mjs';

let server;
let client;
before(async () => {
  server = await Server.start();
  client = await connect('ioredis', server.port);
});
after(async () => {
  await close(client);
  await stopAll();
});
beforeEach(async () => server.admin.flushall());

/** An app of `framework` with GET /ok (200), /fail (500), /slow (200 after 100 ms), the middleware on all. */
async function app(framework, options) {
  if (framework === 'fastify') {
    const fastify = Fastify();
    fastify.addHook('onRequest', fastifyRateLimit(options));
    fastify.get('/ok', async () => 'ok');
    fastify.get('/info', async (request) => request.rateLimit);
    fastify.get('/fail', async (request, reply) => reply.code(500).send('fail'));
    fastify.get('/gate', async () => {
      await gate.opened;
      return 'through';
    });
    fastify.get('/slow', async () => {
      await sleep(100);
      return 'slow';
    });
    await fastify.listen({ port: 0, host: '127.0.0.1' });
    return { url: `http://127.0.0.1:${fastify.server.address().port}`, close: () => fastify.close() };
  }
  const express = framework === 'express4' ? express4 : express5;
  const application = express();
  application.use(expressRateLimit(options));
  application.get('/ok', (req, res) => res.send('ok'));
  application.get('/info', (req, res) => res.json(req.rateLimit));
  application.get('/fail', (req, res) => res.status(500).send('fail'));
  application.get('/slow', (req, res) => setTimeout(() => res.send('slow'), 100));
  application.get('/gate', (req, res) => gate.opened.then(() => res.send('through')));
  application.use((error, req, res, _next) => res.status(500).send(error.name)); // quiet: the default handler logs
  const listener = await new Promise((resolve) => {
    const l = application.listen(0, '127.0.0.1', () => resolve(l));
  });
  return { url: `http://127.0.0.1:${listener.address().port}`, close: () => new Promise((resolve) => listener.close(resolve)) };
}

/** Holds /gate's responses until open() (so every request is decided while the admitted ones are still in flight). */
const gate = {};
function closeGate() {
  gate.opened = new Promise((resolve) => (gate.open = resolve));
}
closeGate();

/** 20 requests to /gate at once: the admitted ones wait at the gate until the other 15 were answered (or 5 s). */
async function burst(base) {
  closeGate();
  let rejected = 0;
  const all = Array.from({ length: 20 }, () =>
    get(base, '/gate').then((r) => {
      if (r.status === 429) rejected++;
      return r.status;
    }),
  );
  const until = Date.now() + 5000;
  while (rejected < 15 && Date.now() < until) await sleep(10);
  gate.open();
  return Promise.all(all);
}

async function get(base, path, headers = {}) {
  const response = await fetch(base + path, { headers });
  return { status: response.status, headers: Object.fromEntries(response.headers), body: await response.text() };
}

describe('clientAddress: forwarded addresses only through trusted proxies', () => {
  test('the rightmost address not in the trusted list', async () => {
    const { BlockList } = await import('node:net');
    const proxies = new BlockList();
    proxies.addSubnet('10.0.0.0', 8, 'ipv4');
    proxies.addAddress('127.0.0.1', 'ipv4');
    assert.equal(clientAddress('127.0.0.1', { 'x-forwarded-for': '203.0.113.7' }, undefined), '127.0.0.1', 'no trusted list: the header is ignored');
    assert.equal(clientAddress('127.0.0.1', { 'x-forwarded-for': '203.0.113.7' }, proxies), '203.0.113.7');
    assert.equal(clientAddress('127.0.0.1', { 'x-forwarded-for': '6.6.6.6, 203.0.113.7, 10.1.2.3' }, proxies), '203.0.113.7', 'a spoofed left part is not believed');
    assert.equal(clientAddress('192.0.2.1', { 'x-forwarded-for': '203.0.113.7' }, proxies), '192.0.2.1', 'a peer that is no trusted proxy is the client');
    assert.equal(clientAddress('::ffff:127.0.0.1', { 'x-forwarded-for': '10.0.0.9' }, proxies), '10.0.0.9', 'all trusted: the leftmost');
    assert.equal(clientAddress('127.0.0.1', { forwarded: 'for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"' }, proxies, 'forwarded'), '2001:db8:cafe::17');
  });
});

for (const framework of ['express', 'express4', 'fastify']) {
  describe(`${framework} middleware`, () => {
    test('the client address is the key; 429 with the headers after the limit; headers on allowed responses', async () => {
      const limiter = new Limiter(client);
      const site = await app(framework, { limiter, limits: { window: 60000, limit: 3 } });
      try {
        for (let i = 0; i < 3; i++) {
          const r = await get(site.url, '/ok');
          assert.equal(r.status, 200);
          assert.equal(r.headers['ratelimit-policy'], '"3-in-60s";q=3;w=60');
          assert.equal(r.headers.ratelimit, `"3-in-60s";r=${2 - i};t=60`);
          assert.equal(r.headers['retry-after'], undefined);
        }
        const rejected = await get(site.url, '/ok');
        assert.equal(rejected.status, 429);
        assert.equal(rejected.headers.ratelimit, '"3-in-60s";r=0;t=60');
        assert.ok(Number(rejected.headers['retry-after']) >= 59 && Number(rejected.headers['retry-after']) <= 60);
        assert.match(rejected.body, /^Too Many Requests: retry after \d+ s/);
        assert.equal(await server.admin.zcard('rl:http:127.0.0.1'), 3, 'the rejection recorded nothing');
      } finally {
        await site.close();
      }
    });

    test('X-Forwarded-For is ignored unless the proxy is trusted; then the rightmost untrusted address', async () => {
      const limiter = new Limiter(client);
      const open = await app(framework, { limiter, limits: { name: 'open', window: 60000, limit: 5 } });
      const behind = await app(framework, { limiter, limits: { name: 'behind', window: 60000, limit: 5 }, trustedProxies: ['127.0.0.1', '10.0.0.0/8'] });
      try {
        await get(open.url, '/ok', { 'x-forwarded-for': '203.0.113.1' });
        await get(open.url, '/ok', { 'x-forwarded-for': '203.0.113.2' });
        assert.equal(await server.admin.zcard('rl:open:127.0.0.1'), 2);
        await get(behind.url, '/ok', { 'x-forwarded-for': '198.51.100.9, 203.0.113.1, 10.0.0.4' });
        await get(behind.url, '/ok', { 'x-forwarded-for': '203.0.113.2' });
        assert.deepEqual((await server.admin.keys('rl:behind:*')).sort(), ['rl:behind:203.0.113.1', 'rl:behind:203.0.113.2']);
      } finally {
        await open.close();
        await behind.close();
      }
    });

    test('several limits with tiers: all or nothing, every policy in the headers', async () => {
      const limiter = new Limiter(client);
      const site = await app(framework, {
        limiter,
        limits: [
          { name: 'ip', window: 60000, limit: 100, names: ['ip-per-minute'] },
          { name: 'account', key: (req) => (req.raw ?? req).headers['x-account'], window: 60000, limit: 5, tiers: [[3600000, 2]], names: ['per-minute', 'per-hour'] },
        ],
      });
      try {
        const ok = await get(site.url, '/ok', { 'x-account': 'alice' });
        assert.equal(ok.status, 200);
        assert.equal(ok.headers['ratelimit-policy'], '"ip-per-minute";q=100;w=60, "per-minute";q=5;w=60, "per-hour";q=2;w=3600');
        assert.equal(ok.headers.ratelimit, '"ip-per-minute";r=99;t=60, "per-minute";r=4;t=60, "per-hour";r=1;t=3600');
        assert.equal((await get(site.url, '/ok', { 'x-account': 'alice' })).status, 200);
        const rejected = await get(site.url, '/ok', { 'x-account': 'alice' });
        assert.equal(rejected.status, 429, 'the hour tier of the account binds');
        assert.ok(Number(rejected.headers['retry-after']) > 3500);
        assert.equal(await server.admin.zcard('rl:ip:127.0.0.1'), 2, 'the address was refunded when the account rejected');
        assert.equal((await get(site.url, '/ok', { 'x-account': 'bob' })).status, 200);
      } finally {
        await site.close();
      }
    });

    test('skipFailedRequests refunds exactly the failed request\'s own admission, by its stamp', async () => {
      const limiter = new Limiter(client);
      const site = await app(framework, { limiter, limits: { window: 60000, limit: 10 }, skipFailedRequests: true });
      try {
        // ok, fail, ok, a millisecond apart at least: the refund removes the middle stamp,
        // not the oldest or the newest entry.
        for (const path of ['/ok', '/fail', '/ok']) {
          await get(site.url, path);
          await sleep(5);
        }
        await waitFor('the refund', async () => (await server.admin.zcard('rl:http:127.0.0.1')) === 2);
        const scores = (await server.admin.zrange('rl:http:127.0.0.1', 0, -1, 'WITHSCORES')).filter((_, i) => i % 2).map(Number);
        assert.equal(scores.length, 2);
        assert.ok(scores[1] - scores[0] >= 10, `the first and the third admissions stay: ${scores}`);
        // Failures don't count: many more than the limit are served.
        for (let i = 0; i < 15; i++) assert.equal((await get(site.url, '/fail')).status, 500);
      } finally {
        await site.close();
      }
    });

    test('skipSuccessfulRequests under concurrency: never more admitted at once than the limit', async () => {
      const limiter = new Limiter(client);
      const site = await app(framework, { limiter, limits: { window: 60000, limit: 5 }, skipSuccessfulRequests: true });
      try {
        // 20 slow requests at once: an admission is only refunded after its
        // response, so exactly 5 are in at a time (PEEK-then-ALLOW would let a burst through).
        const statuses = await burst(site.url);
        assert.equal(statuses.filter((s) => s === 200).length, 5);
        assert.equal(statuses.filter((s) => s === 429).length, 15);
        await waitFor('the refunds', async () => (await server.admin.exists('rl:http:127.0.0.1')) === 0);
        for (let i = 0; i < 12; i++) assert.equal((await get(site.url, '/ok')).status, 200, 'successes are not counted');
        for (let i = 0; i < 5; i++) assert.equal((await get(site.url, '/fail')).status, 500);
        assert.equal((await get(site.url, '/fail')).status, 429, 'failures are');
      } finally {
        await site.close();
      }
    });

    test('a request larger than the limit: 429 without Retry-After, and a body that says so', async () => {
      const limiter = new Limiter(client);
      const site = await app(framework, { limiter, limits: { window: 60000, limit: 3, cost: () => 5 }, headers: 'both' });
      try {
        const r = await get(site.url, '/ok');
        assert.equal(r.status, 429);
        assert.equal(r.headers['retry-after'], undefined);
        assert.equal(r.headers['ratelimit-limit'], '3');
        assert.match(r.body, /larger than the limit/);
      } finally {
        await site.close();
      }
    });

    test('the error policy on a paused server, with the limiter timeout: raise 500, allow served without headers, deny 503', async () => {
      const paused = await Server.start();
      const onPaused = await connect('ioredis', paused.port);
      const sites = {};
      try {
        for (const policy of ['raise', 'allow', 'deny']) {
          const limiter = new Limiter(onPaused, { onError: policy, timeout: 100 });
          sites[policy] = await app(framework, { limiter, limits: { window: 60000, limit: 3 } });
        }
        paused.pause();
        const started = Date.now();
        const raised = await get(sites.raise.url, '/ok');
        assert.equal(raised.status, 500);
        const served = await get(sites.allow.url, '/ok');
        assert.equal(served.status, 200);
        assert.equal(served.headers.ratelimit, undefined, 'no headers without a decision');
        const denied = await get(sites.deny.url, '/ok');
        assert.equal(denied.status, 503);
        assert.ok(Date.now() - started < 2000, 'each waited the limiter timeout, not longer');
      } finally {
        paused.resume();
        for (const site of Object.values(sites)) await site.close();
        await close(onPaused);
        await paused.destroy();
      }
    });

    test('a bad configuration is refused when the middleware is built, naming the argument, under every policy', () => {
      const build = framework === 'fastify' ? fastifyRateLimit : expressRateLimit;
      const refused = (re) => (e) => e instanceof XcloakError && e.code === 'ARGUMENT' && !e.message.startsWith('ERR') && re.test(e.message);
      for (const onError of ['raise', 'allow', 'deny']) {
        const limiter = new Limiter(client, { onError });
        const cases = [
          [{ window: 60000, limit: -1 }, /^limits\[0\]\.limit must be an integer from 0 to 1000000, got -1$/],
          [{ window: 60000, limit: 1e11 }, /^limits\[0\]\.limit must be an integer from 0 to 1000000, got 100000000000$/],
          [{ window: -1000, limit: 5 }, /^limits\[0\]\.window must be an integer from 1 to 9007199254740991 \(milliseconds\), got -1000$/],
          [{ window: 1.5, limit: 5 }, /^limits\[0\]\.window must be an integer .* got 1\.5$/],
          [{ window: 2 ** 53, limit: 5 }, /^limits\[0\]\.window must be an integer .* got 9007199254740992$/],
          [{ window: '60000', limit: 5 }, /^limits\[0\]\.window must be an integer .* got the string "60000"$/],
          [{ window: 60000, limit: 5, cost: 0 }, /^limits\[0\]\.cost must be an integer from 1 to 1000000, got 0$/],
          [{ window: 60000, limit: 5, tiers: [[3_600_000, -2]] }, /^limits\[0\]\.tiers\[0\] limit must be an integer from 0 to 1000000, got -2$/],
          [{ window: 60000, limit: 5, teirs: [[3_600_000, 20]] }, /^limits\[0\]: unknown option "teirs" \(known: name, window, limit, tiers, cost, key, names\)$/],
          [{ window: 60000, limit: 5, cots: 2 }, /^limits\[0\]: unknown option "cots"/],
        ];
        for (const [limits, message] of cases) assert.throws(() => build({ limiter, limits }), refused(message), JSON.stringify(limits));
        assert.throws(() => build({ limiter, limits: { window: 60000, limit: 5 }, skipSuccessfulRequest: true }), refused(/^rateLimit options: unknown option "skipSuccessfulRequest"/));
        assert.throws(() => build({ limiter, limits: [] }), refused(/^limits must hold at least one limit$/));
        assert.throws(() => build({ limits: { window: 60000, limit: 5 } }), refused(/^limiter must be an xcloak Limiter, got undefined$/));
        assert.throws(() => build({ limiter, limits: { window: 60000, limit: 5 }, headers: 'draft-8' }), refused(/^headers must be one of ietf, legacy, both/));
      }
    });

    test('req.rateLimit: express-rate-limit\'s fields of the binding limit, and the decision', async () => {
      const limiter = new Limiter(client);
      const site = await app(framework, { limiter, limits: [{ name: 'ip', window: 60000, limit: 3 }, { name: 'wide', window: 120000, limit: 10 }] });
      try {
        await get(site.url, '/ok');
        const before = Date.now();
        const info = JSON.parse((await get(site.url, '/info')).body);
        const { decision, resetTime, ...fields } = info;
        assert.deepEqual(fields, { limit: 3, used: 2, remaining: 1, key: 'rl:ip:127.0.0.1' });
        const resetIn = Date.parse(resetTime) - before;
        assert.ok(resetIn > 59000 && resetIn <= 60100, `resetTime in ${resetIn} ms`);
        assert.equal(decision.bindingIndex, 0);
        assert.deepEqual(decision.decisions.map((d) => [d.limit, d.remaining, d.via]), [[3, 1, 'command'], [10, 8, 'command']]);
      } finally {
        await site.close();
      }
    });
  });
}
