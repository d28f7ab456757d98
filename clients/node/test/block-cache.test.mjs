// The block cache (docs/clients.md, Block cache): every case of
// clients/conformance/block_cache.json through the pure cache on a virtual
// monotonic clock, then the live rules against a real server on both client
// libraries, each call counted by the server (INFO commandstats): a hit sends
// nothing, counts down and expires; a larger cost is cached and a smaller one
// sent; other tiers are sent; refund and reset drop the entry; peek, an
// explicit now and a clock bypass it; allowAll stops at a blocked request;
// concurrent calls on one key admit exactly the limit; the Express middleware,
// rate-limiter-flexible and express-rate-limit answer a cached rejection as a
// server one.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import express from 'express';
import { rateLimit as erlRateLimit } from 'express-rate-limit';
import { Limiter, XcloakError, decisionFromReply, headers } from 'xcloak';
import { rateLimit } from 'xcloak/express';
import { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';
import { XcloakStore } from 'xcloak/express-rate-limit';
import { BlockCache } from '../dist/block-cache.js';
import { Server, repoDir, stopAll, waitFor } from './harness.mjs';
import { LIBRARIES, close, connect } from './clients.mjs';

const VECTORS = JSON.parse(readFileSync(path.join(repoDir, 'clients/conformance/block_cache.json'), 'utf8'));

/** A Decision in the vectors' shape (as vectors.test.mjs writes it). */
function wire(d) {
  return {
    allowed: d.allowed,
    limit: d.limit,
    remaining: d.remaining,
    retry_after_ms: d.retryAfter,
    reset_after_ms: d.resetAfter,
    cost_exceeds_limit: d.costExceedsLimit,
    window_ms: d.window,
    tier: d.tier,
    tiers: d.tiers.map((t) => ({ window_ms: t.window, limit: t.limit, remaining: t.remaining, retry_after_ms: t.retryAfter, reset_after_ms: t.resetAfter })),
    stamp: d.stamp,
  };
}

const specOf = (step) => ({ key: step.key, window: step.window, limit: step.limit, cost: step.cost, tiers: step.tiers });

describe('block_cache.json: every case through the pure cache', () => {
  test('the vectors hold every op, hits and misses', () => {
    const ops = VECTORS.cases.flatMap((c) => c.steps.map((s) => (s.op === 'allow' ? `allow sent=${s.sent}` : s.op)));
    for (const op of ['allow sent=true', 'allow sent=false', 'forget', 'size']) assert.ok(ops.includes(op), op);
  });

  for (const testCase of VECTORS.cases) {
    test(`${testCase.name}: ${testCase.description}`, () => {
      let clock = 0;
      const cache = new BlockCache(testCase.capacity, () => clock);
      let hits = 0;
      testCase.steps.forEach((step, index) => {
        const where = `${testCase.name} step ${index} (${step.op} at ${step.at})`;
        clock = step.at;
        if (step.op === 'allow') {
          const spec = specOf(step);
          const found = cache.lookup(spec);
          if (step.sent) {
            assert.equal(found, undefined, `${where}: must miss`);
            cache.record(spec, step.at, decisionFromReply(step.reply, spec, 'command'));
          } else {
            assert.ok(found, `${where}: must hit`);
            hits++;
            assert.deepEqual({ ...wire(found), via: found.via }, step.decision, where);
            assert.equal(found.oldest, null, where);
            assert.equal(found.error, null, where);
            assert.deepEqual(headers(found, { style: 'ietf' }), step.headers.ietf, `${where}: ietf headers`);
            assert.deepEqual(headers(found, { style: 'legacy' }), step.headers.legacy, `${where}: legacy headers`);
          }
        } else if (step.op === 'forget') {
          cache.forget(step.key);
        } else if (step.op === 'size') {
          assert.equal(cache.size, step.entries, where);
        } else {
          assert.fail(`${where}: unknown op`);
        }
      });
      assert.deepEqual(cache.stats, { cacheHits: hits, cacheEntries: cache.size });
    });
  }
});

// ---- Live

let server;
const clients = {};
before(async () => {
  server = await Server.start();
  for (const library of LIBRARIES) clients[library] = await connect(library, server.port);
});
after(async () => {
  for (const client of Object.values(clients)) await close(client);
  await stopAll();
});
beforeEach(async () => {
  await server.admin.flushall();
  await server.resetStats();
});

const allows = () => server.calls('xcloak.allow');

/** Spends `key`'s limit and has the server reject once: the entry is then held. */
async function block(limiter, key, window, limit, options = {}) {
  for (let i = 0; i < limit; i++) assert.equal((await limiter.allow(key, window, limit, options)).allowed, true);
  const rejected = await limiter.allow(key, window, limit, options);
  assert.equal(rejected.allowed, false);
  assert.equal(rejected.via, 'command');
  return rejected;
}

for (const library of LIBRARIES) {
  describe(`${library}: the block cache against a live server`, () => {
    test('a rejection is repeated with no call: via cache, remaining 0, retryAfter counting down; stats count it', async () => {
      const limiter = new Limiter(clients[library], { prefix: 'p:' });
      assert.deepEqual(limiter.stats, { cacheHits: 0, cacheEntries: 0 });
      const first = await block(limiter, 'k', 60000, 2);
      assert.equal(await allows(), 3);
      assert.deepEqual(limiter.stats, { cacheHits: 0, cacheEntries: 1 });
      const t0 = performance.now();
      const cached = await limiter.allow('k', 60000, 2);
      assert.equal(await allows(), 3, 'the hit sent nothing');
      assert.deepEqual(
        { ...cached, retryAfter: 0, resetAfter: 0 },
        { ...first, remaining: 0, retryAfter: 0, resetAfter: 0, via: 'cache', stamp: null },
      );
      assert.ok(cached.retryAfter <= first.retryAfter && cached.retryAfter > first.retryAfter - 1000, `${cached.retryAfter} vs ${first.retryAfter}`);
      await waitFor('25 ms of the monotonic clock', () => performance.now() - t0 >= 25);
      const later = await limiter.allow('k', 60000, 2);
      assert.equal(later.via, 'cache');
      assert.ok(later.retryAfter <= cached.retryAfter - 25, `counts down: ${later.retryAfter} after ${cached.retryAfter}`);
      assert.ok(later.resetAfter <= cached.resetAfter - 24, `reset_after ages: ${later.resetAfter} after ${cached.resetAfter}`);
      assert.equal(await allows(), 3);
      assert.deepEqual(limiter.stats, { cacheHits: 2, cacheEntries: 1 });
      assert.equal(await server.admin.zcard('p:k'), 2, 'nothing recorded by the hits');
    });

    test('expiry: at the deadline the request is sent again, and the admission that follows drops the entry', async () => {
      const limiter = new Limiter(clients[library]);
      const sentAt = performance.now();
      await block(limiter, 'k', 300, 1);
      const cached = await limiter.allow('k', 300, 1);
      assert.equal(cached.via, 'cache');
      await waitFor('the cached deadline', () => performance.now() >= sentAt + 300);
      // At the cached deadline the server may still be a millisecond short (the cache is early, never late).
      let d;
      await waitFor('an admission by the server', async () => {
        d = await limiter.allow('k', 300, 1);
        return d.allowed;
      });
      assert.equal(d.via, 'command');
      assert.equal(limiter.stats.cacheEntries, 0, 'the admission dropped the entry');
      assert.ok((await allows()) >= 3, 'sent after the deadline');
    });

    test('a larger cost is answered by the cache, a smaller one is sent; other tiers, window or limit are sent', async () => {
      const limiter = new Limiter(clients[library]);
      assert.equal((await limiter.allow('k', 60000, 5, { cost: 3 })).allowed, true);
      const rejected = await limiter.allow('k', 60000, 5, { cost: 3 });
      assert.equal(rejected.via, 'command');
      let calls = await allows();
      assert.equal((await limiter.allow('k', 60000, 5, { cost: 4 })).via, 'cache');
      assert.equal((await limiter.allow('k', 60000, 5, { cost: 3 })).via, 'cache');
      assert.equal(await allows(), calls, 'costs 3 and 4: no call');
      const smaller = await limiter.allow('k', 60000, 5, { cost: 2 });
      assert.equal(smaller.via, 'command');
      assert.equal(smaller.allowed, true, 'the server admits what fits');
      assert.equal(await allows(), calls + 1);
      // Another shape on a blocked key: sent each time.
      await limiter.allow('k', 60000, 5, { cost: 1 }); // rejected by the server: the entry is now cost 1
      calls = await allows();
      for (const [window, limit, tiers] of [[60000, 5, [[3_600_000, 100]]], [60000, 6, undefined], [30000, 5, undefined]]) {
        const d = await limiter.allow('k', window, limit, { tiers });
        assert.notEqual(d.via, 'cache', JSON.stringify([window, limit, tiers]));
      }
      assert.equal(await allows(), calls + 3, 'three other shapes, three calls');
    });

    test('on a blocked key, a cost above the limit gets the server never-fits, and a cost the server refuses its error', async () => {
      const limiter = new Limiter(clients[library]);
      await block(limiter, 'k', 60000, 3, { tiers: [[3_600_000, 5]] });
      const calls = await allows();
      const never = await limiter.allow('k', 60000, 3, { tiers: [[3_600_000, 5]], cost: 4 });
      assert.equal(never.via, 'command');
      assert.equal(never.costExceedsLimit, true);
      assert.equal(never.retryAfter, -1);
      await assert.rejects(limiter.allow('k', 60000, 3, { tiers: [[3_600_000, 5]], cost: 1.5 }), (e) => e instanceof XcloakError && e.message.startsWith('ERR'));
      assert.equal(await allows(), calls + 2, 'both sent');
      assert.equal((await limiter.allow('k', 60000, 3, { tiers: [[3_600_000, 5]], cost: 3 })).via, 'cache', 'the entry stays');
    });

    test('refund and reset through the same limiter drop the entry first: the next request is sent and admitted', async () => {
      const limiter = new Limiter(clients[library]);
      const admitted = await limiter.allow('k', 60000, 1, { stamp: true });
      assert.equal((await limiter.allow('k', 60000, 1)).via, 'command');
      assert.equal((await limiter.allow('k', 60000, 1)).via, 'cache');
      assert.equal(await limiter.refund('k', admitted.stamp), 1);
      assert.equal(limiter.stats.cacheEntries, 0);
      const again = await limiter.allow('k', 60000, 1);
      assert.equal(again.allowed, true);
      assert.equal(again.via, 'command');
      assert.equal((await limiter.allow('k', 60000, 1)).via, 'command');
      assert.equal((await limiter.allow('k', 60000, 1)).via, 'cache');
      assert.equal(await limiter.reset('k'), true);
      assert.equal(limiter.stats.cacheEntries, 0);
      assert.equal((await limiter.allow('k', 60000, 1)).allowed, true);
    });

    test('peek, an explicit now and a limiter with a clock bypass the cache (never answered, never recorded)', async () => {
      const limiter = new Limiter(clients[library]);
      await block(limiter, 'k', 60000, 1);
      const before = await allows();
      const peeked = await limiter.peek('k', 60000, 1);
      assert.equal(peeked.via, 'command');
      assert.equal(await server.calls('xcloak.peek'), 1);
      const explicit = await limiter.allow('k', 60000, 1, { now: Date.now() });
      assert.equal(explicit.via, 'command');
      assert.equal(await allows(), before + 1, 'the call with now was sent');
      assert.deepEqual(limiter.stats, { cacheHits: 0, cacheEntries: 1 });
      // A peek or a now-call of a blocked shape records nothing: a fresh key stays out.
      await limiter.allow('other', 60000, 1, { now: Date.now() });
      await limiter.allow('other', 60000, 1, { now: Date.now() });
      await limiter.peek('other', 60000, 1);
      assert.equal(limiter.stats.cacheEntries, 1);
      const clocked = new Limiter(clients[library], { clock: { now: () => Date.now(), sleep: (ms) => sleep(ms) } });
      for (let i = 0; i < 3; i++) assert.equal((await clocked.allow('k', 60000, 1)).via, 'command');
      assert.deepEqual(clocked.stats, { cacheHits: 0, cacheEntries: 0 });
      assert.equal(await allows(), before + 1 + 2 + 3);
    });

    test('blockCache: 0 turns it off: every call sent, stats zeros', async () => {
      const limiter = new Limiter(clients[library], { blockCache: 0 });
      await block(limiter, 'k', 60000, 1);
      for (let i = 0; i < 3; i++) assert.equal((await limiter.allow('k', 60000, 1)).via, 'command');
      assert.equal(await allows(), 5);
      assert.deepEqual(limiter.stats, { cacheHits: 0, cacheEntries: 0 });
    });

    test('allowAll: a blocked first request sends nothing; a blocked later one refunds the earlier admissions', async () => {
      const limiter = new Limiter(clients[library]);
      await block(limiter, 'b', 60000, 1);
      const calls = await allows();
      const blockedFirst = await limiter.allowAll([{ key: 'b', window: 60000, limit: 1 }, { key: 'a', window: 60000, limit: 5 }]);
      assert.equal(blockedFirst.allowed, false);
      assert.equal(blockedFirst.rejected, 0);
      assert.equal(blockedFirst.via, 'cache');
      assert.equal(blockedFirst.decisions.length, 1);
      assert.equal(await allows(), calls, 'no call');
      const blockedSecond = await limiter.allowAll([{ key: 'a', window: 60000, limit: 5 }, { key: 'b', window: 60000, limit: 1 }]);
      assert.equal(blockedSecond.rejected, 1);
      assert.deepEqual(blockedSecond.decisions.map((d) => d.via), ['command', 'cache']);
      assert.equal(await allows(), calls + 1, 'only request 0 sent');
      assert.equal(await server.calls('xcloak.refund'), 1);
      assert.equal(await server.admin.exists('a'), 0, 'request 0 refunded');
    });

    test('acquire on a blocked key: its first turn is answered by the cache, it sleeps to the deadline locally, then is admitted', async () => {
      const limiter = new Limiter(clients[library], { jitterFraction: 0 });
      const started = performance.now();
      await block(limiter, 'k', 300, 1);
      const calls = await allows();
      const d = await limiter.acquire('k', 300, 1, { maxWait: 2000 });
      assert.equal(d.allowed, true);
      assert.ok(performance.now() - started >= 290, 'it waited for the window');
      assert.equal(limiter.stats.cacheHits, 1, 'the first turn: no call');
      // The turns after: one call at the deadline (two if the server was still a millisecond short).
      const sent = (await allows()) - calls;
      assert.ok(sent >= 1 && sent <= 3, `${sent} calls`);
    });

    test('an outage does not reach a cached key: with the server paused, its rejection is answered at once', async () => {
      const limiter = new Limiter(clients[library], { timeout: 300, onError: 'allow' });
      await block(limiter, 'k', 60000, 1);
      server.pause();
      try {
        const started = performance.now();
        const d = await limiter.allow('k', 60000, 1);
        assert.equal(d.via, 'cache');
        assert.equal(d.allowed, false, 'not the error policy (allow)');
        assert.ok(performance.now() - started < 100, 'no wait for the timeout');
      } finally {
        server.resume();
      }
    });

    test('durable mode: a rejection (no WAIT) is recorded and repeated without a call', async () => {
      const plain = new Limiter(clients[library]);
      assert.equal((await plain.allow('k', 60000, 1)).allowed, true);
      const durable = new Limiter(clients[library], { durable: { replicas: 1, timeout: 10 } });
      assert.equal((await durable.allow('k', 60000, 1)).via, 'command');
      const calls = await allows();
      const cached = await durable.allow('k', 60000, 1);
      assert.equal(cached.via, 'cache');
      assert.equal(await allows(), calls);
      assert.equal(await server.calls('wait'), 0, 'a rejection sends no WAIT');
    });

    test('many concurrent calls on one key: exactly the limit admitted (counted on the server), then all answered locally', async () => {
      const limiter = new Limiter(clients[library]);
      const wave = () => Promise.all(Array.from({ length: 200 }, () => limiter.allow('hot', 60000, 10)));
      const first = await wave();
      assert.equal(first.filter((d) => d.allowed).length, 10);
      assert.equal(await server.admin.zcard('hot'), 10, "the server's own count");
      const calls = await allows();
      const second = await wave();
      assert.equal(second.filter((d) => d.allowed).length, 0);
      assert.ok(second.every((d) => d.via === 'cache'));
      assert.equal(await allows(), calls, 'the second wave sent nothing');
      assert.equal(await server.admin.zcard('hot'), 10);
    });
  });
}

describe('construction and the integrations', () => {
  test('blockCache is refused at construction unless an integer from 0 to 1000000, naming it', () => {
    const client = clients.ioredis;
    for (const bad of [-1, 1.5, '100', 1_000_001, true, Number.NaN, null]) {
      assert.throws(
        () => new Limiter(client, { blockCache: bad }),
        (e) => e instanceof XcloakError && e.code === 'ARGUMENT' && /^blockCache must be an integer from 0 to 1000000 \(entries\), got /.test(e.message),
        String(bad),
      );
    }
    for (const good of [0, 1, 10_000, 1_000_000]) assert.ok(new Limiter(client, { blockCache: good }));
  });

  test('the Express middleware answers a cached rejection with the same 429 and headers, Retry-After counting down', async () => {
    const limiter = new Limiter(clients.ioredis);
    const application = express();
    application.use(rateLimit({ limiter, limits: { window: 60000, limit: 2 }, headers: 'both' }));
    application.get('/', (req, res) => res.send('ok'));
    const listener = await new Promise((resolve) => {
      const l = application.listen(0, '127.0.0.1', () => resolve(l));
    });
    const url = `http://127.0.0.1:${listener.address().port}/`;
    const get = async () => {
      const r = await fetch(url);
      return { status: r.status, headers: Object.fromEntries(r.headers), body: await r.text() };
    };
    try {
      assert.equal((await get()).status, 200);
      assert.equal((await get()).status, 200);
      const byServer = await get();
      assert.equal(byServer.status, 429);
      const calls = await allows();
      const byCache = await get();
      assert.equal(await allows(), calls, 'answered without a call');
      assert.equal(byCache.status, 429);
      const fields = ['ratelimit-policy', 'ratelimit-limit', 'ratelimit-remaining', 'content-type'];
      for (const f of fields) assert.equal(byCache.headers[f], byServer.headers[f], f);
      assert.match(byCache.headers.ratelimit, /^"2-in-60s";r=0;t=(59|60)$/);
      assert.ok(Number(byCache.headers['retry-after']) >= 59 && Number(byCache.headers['retry-after']) <= Number(byServer.headers['retry-after']));
      assert.match(byCache.body, /^Too Many Requests: retry after \d+ s/);
      assert.equal(limiter.stats.cacheHits, 1);
    } finally {
      await new Promise((resolve) => listener.close(resolve));
    }
  });

  test('rate-limiter-flexible: a cached rejection rejects consume with a RateLimiterRes, msBeforeNext counting down', async () => {
    const limiter = new Limiter(clients.ioredis);
    const rl = new RateLimiterXcloak({ limiter, points: 1, duration: 60 });
    await rl.consume('u');
    const byServer = await rl.consume('u').then(() => assert.fail('admitted'), (r) => r);
    const calls = await allows();
    await sleep(5);
    const byCache = await rl.consume('u').then(() => assert.fail('admitted'), (r) => r);
    assert.equal(await allows(), calls);
    assert.equal(byCache.constructor, byServer.constructor);
    assert.equal(byCache.decision.via, 'cache');
    assert.ok(byCache.msBeforeNext > 0 && byCache.msBeforeNext < byServer.msBeforeNext, `${byCache.msBeforeNext} < ${byServer.msBeforeNext}`);
    assert.equal(byCache.consumedPoints, 1);
    assert.equal(byCache.remainingPoints, 0);
    // delete (a reset through the same limiter) drops the entry: the next consume is sent and admitted.
    await rl.delete('u');
    assert.equal((await rl.consume('u')).decision.via, 'command');
  });

  test('express-rate-limit: a cached rejection is a 429 as a server one, with no call', async () => {
    const limiter = new Limiter(clients.ioredis);
    const application = express();
    application.use(erlRateLimit({ windowMs: 60000, limit: 1, standardHeaders: 'draft-8', legacyHeaders: false, store: new XcloakStore({ limiter }) }));
    application.get('/', (req, res) => res.send('ok'));
    const listener = await new Promise((resolve) => {
      const l = application.listen(0, '127.0.0.1', () => resolve(l));
    });
    const url = `http://127.0.0.1:${listener.address().port}/`;
    try {
      assert.equal((await fetch(url)).status, 200);
      const byServer = await fetch(url);
      assert.equal(byServer.status, 429);
      const calls = await allows();
      const byCache = await fetch(url);
      assert.equal(byCache.status, 429);
      assert.equal(await allows(), calls);
      assert.equal(byCache.headers.get('ratelimit'), byServer.headers.get('ratelimit').replace(/t=\d+/, byCache.headers.get('ratelimit').match(/t=\d+/)[0]));
      assert.equal(limiter.stats.cacheHits, 1);
    } finally {
      await new Promise((resolve) => listener.close(resolve));
    }
  });
});
