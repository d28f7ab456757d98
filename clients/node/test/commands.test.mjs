// What each integration sends per request (issue 30), counted by the server
// (INFO commandstats, reset before each workload): one XCLOAK.ALLOW per limit
// is the floor, and each integration sends exactly that, admitted or
// rejected; skip* adds one XCLOAK.REFUND per refunded request, blocks (a
// rate-limiter-flexible option) one PTTL. With the block cache on (the
// default), a key's rejections after the first are answered without a call:
// each workload runs with `blockCache: 0` (the floor) and with the default.
// The server CPU per request
// (commandstats usec) is printed beside XCLOAK.ALLOW's own per-call figure
// (node --test reports the diagnostics).
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, test } from 'node:test';
import express from 'express';
import Fastify from 'fastify';
import { rateLimit as erlRateLimit } from 'express-rate-limit';
import { Limiter } from 'xcloak';
import { rateLimit as expressRateLimit } from 'xcloak/express';
import { rateLimit as fastifyRateLimit } from 'xcloak/fastify';
import { XcloakStore } from 'xcloak/express-rate-limit';
import { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';
import { Server, stopAll } from './harness.mjs';
import { close, connect } from './clients.mjs';

const REQUESTS = 40;
const LIMIT = 25; // 25 admitted, 15 rejected
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

/** Every command the server ran since the reset, but the test's own INFO: `{ name: [calls, usec] }`. */
async function ran() {
  const stats = await server.info('commandstats');
  const out = {};
  for (const [field, value] of Object.entries(stats)) {
    const name = field.replace(/^cmdstat_/, '');
    if (name === 'info' || name.startsWith('config')) continue;
    out[name] = [Number(/calls=(\d+)/.exec(value)[1]), Number(/usec=(\d+)/.exec(value)[1])];
  }
  return out;
}

async function listen(app) {
  const listener = await new Promise((resolve) => {
    const l = app.listen(0, '127.0.0.1', () => resolve(l));
  });
  return { url: `http://127.0.0.1:${listener.address().port}`, close: () => new Promise((resolve) => listener.close(resolve)) };
}

/** A Limiter with the block cache off (0) or at its default (undefined). */
const limiterOf = (blockCache) => new Limiter(client, blockCache === undefined ? {} : { blockCache });
const CACHES = [
  ['cache off', 0],
  ['cache on', undefined],
];

const SITES = {
  express: async (limits, extra, blockCache) => {
    const app = express();
    app.use(expressRateLimit({ limiter: limiterOf(blockCache), limits, ...extra }));
    app.get('/', (req, res) => res.send('ok'));
    return listen(app);
  },
  fastify: async (limits, extra, blockCache) => {
    const app = Fastify();
    app.addHook('onRequest', fastifyRateLimit({ limiter: limiterOf(blockCache), limits, ...extra }));
    app.get('/', async () => 'ok');
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
  },
  'express-rate-limit': async (limits, extra, blockCache) => {
    const app = express();
    app.use(erlRateLimit({ windowMs: limits.window, limit: limits.limit, store: new XcloakStore({ limiter: limiterOf(blockCache) }), ...extra }));
    app.get('/', (req, res) => res.send('ok'));
    return listen(app);
  },
};

async function measure(send) {
  await server.resetStats();
  const statuses = [];
  for (let i = 0; i < REQUESTS; i++) statuses.push(await send());
  const counts = await ran();
  return { statuses, counts };
}

function report(t, what, counts) {
  const calls = Object.values(counts).reduce((a, [c]) => a + c, 0);
  const usec = Object.values(counts).reduce((a, [, u]) => a + u, 0);
  const allow = counts['xcloak.allow'];
  t.diagnostic(
    `${what}: ${(calls / REQUESTS).toFixed(2)} commands/request (${Object.entries(counts).map(([n, [c]]) => `${n} ${c}`).join(', ')}); ` +
      `server ${(usec / REQUESTS).toFixed(2)} usec/request; XCLOAK.ALLOW ${(allow[1] / allow[0]).toFixed(2)} usec/call`,
  );
}

describe('commands per request, counted by the server', () => {
  for (const name of Object.keys(SITES)) {
    test(`${name}: one XCLOAK.ALLOW per request, admitted or rejected, nothing else; with the cache, none after the first rejection`, async (t) => {
      for (const [cache, blockCache] of CACHES) {
        await server.admin.flushall();
        const site = await SITES[name]({ window: 60000, limit: LIMIT }, {}, blockCache);
        try {
          const { statuses, counts } = await measure(async () => (await fetch(`${site.url}/`)).status);
          assert.equal(statuses.filter((s) => s === 200).length, LIMIT);
          assert.equal(statuses.filter((s) => s === 429).length, REQUESTS - LIMIT);
          assert.deepEqual(Object.keys(counts), ['xcloak.allow']);
          assert.equal(counts['xcloak.allow'][0], blockCache === 0 ? REQUESTS : LIMIT + 1, cache);
          report(t, `${name}, ${cache}`, counts);
        } finally {
          await site.close();
        }
      }
    });
  }

  test('express with two limits: two XCLOAK.ALLOW per admitted request (allowAll), plus the refund of a rejected one\'s first', async (t) => {
    for (const [cache, blockCache] of CACHES) {
      await server.admin.flushall();
      const site = await SITES.express(
        [
          { name: 'wide', window: 60000, limit: 1000 },
          { name: 'ip', window: 60000, limit: LIMIT },
        ],
        {},
        blockCache,
      );
      try {
        const { counts } = await measure(async () => (await fetch(`${site.url}/`)).status);
        assert.deepEqual(Object.keys(counts).sort(), ['xcloak.allow', 'xcloak.refund']);
        // With the cache, the second limit of a blocked client is answered locally: one ALLOW per rejected request, after the first.
        assert.equal(counts['xcloak.allow'][0], blockCache === 0 ? 2 * REQUESTS : 2 * LIMIT + 2 + (REQUESTS - LIMIT - 1), cache);
        assert.equal(counts['xcloak.refund'][0], REQUESTS - LIMIT, 'the first limit refunded when the second rejects');
        report(t, `express, two limits, ${cache}`, counts);
      } finally {
        await site.close();
      }
    }
  });

  test('rate-limiter-flexible consume: one XCLOAK.ALLOW; with blockDuration one PTTL more (and one SET at the first rejection)', async (t) => {
    for (const blockDuration of [0, 5]) {
      await server.admin.flushall();
      const rl = new RateLimiterXcloak({ limiter: limiterOf(0), points: LIMIT, duration: 60, blockDuration });
      const { statuses, counts } = await measure(() => rl.consume('u').then(() => 200, () => 429));
      assert.equal(statuses.filter((s) => s === 200).length, LIMIT);
      if (blockDuration === 0) {
        assert.deepEqual(Object.keys(counts), ['xcloak.allow']);
        assert.equal(counts['xcloak.allow'][0], REQUESTS);
      } else {
        assert.deepEqual(Object.keys(counts).sort(), ['pttl', 'set', 'xcloak.allow']);
        assert.equal(counts.pttl[0], REQUESTS);
        assert.equal(counts.set[0], 1);
        assert.equal(counts['xcloak.allow'][0], LIMIT + 1, 'a blocked consume sends no ALLOW');
      }
      report(t, `rate-limiter-flexible, blockDuration ${blockDuration}`, counts);
    }
  });
});
