// XcloakStore under express-rate-limit 8's own middleware, over real HTTP:
// the server enforces the window (a rejected request is never recorded),
// decrement refunds exactly the request it belongs to (and nothing for a
// rejected one), express-rate-limit's runtime validations raise no warning,
// and the limit comes from rateLimit()'s options.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, beforeEach, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { Limiter } from 'xcloak';
import { XcloakStore } from 'xcloak/express-rate-limit';
import { Server, packageDir, stopAll, waitFor } from './harness.mjs';
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

/** A logger that records what express-rate-limit reports (its validations log through it). */
function recorder() {
  const seen = [];
  return { seen, logger: { error: (...a) => seen.push(['error', ...a]), warn: (...a) => seen.push(['warn', ...a]) } };
}

async function app(options) {
  const application = express();
  application.use(rateLimit(options));
  application.get('/ok', (req, res) => res.send('ok'));
  application.get('/fail', (req, res) => res.status(500).send('fail'));
  application.get('/slow', (req, res) => setTimeout(() => res.send('slow'), 100));
  application.get('/gate', (req, res) => gate.opened.then(() => res.send('through')));
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

async function get(base, path) {
  const response = await fetch(base + path);
  return { status: response.status, headers: Object.fromEntries(response.headers), body: await response.text() };
}

const KEY = 'rl:http:127.0.0.1';

describe('XcloakStore in express-rate-limit', () => {
  test('the server enforces the window: rejections are never recorded; every validation passes without a warning', async () => {
    const { seen, logger } = recorder();
    const site = await app({ windowMs: 60000, limit: 3, standardHeaders: 'draft-8', legacyHeaders: true, store: new XcloakStore({ limiter: new Limiter(client) }), logger });
    try {
      for (let i = 0; i < 3; i++) {
        const r = await get(site.url, '/ok');
        assert.equal(r.status, 200);
        assert.equal(r.headers['x-ratelimit-remaining'], String(2 - i));
        assert.equal(r.headers.ratelimit, `"3-in-1min";r=${2 - i};t=60`.replace(/;/g, "; "));
      }
      for (let i = 0; i < 10; i++) {
        const r = await get(site.url, '/ok');
        assert.equal(r.status, 429);
        assert.ok(Number(r.headers['retry-after']) <= 60 && Number(r.headers['retry-after']) >= 59);
      }
      assert.equal(await server.admin.zcard(KEY), 3, 'a counter store would hold 13');
      assert.deepEqual(seen, [], 'no validation warned or failed');
    } finally {
      await site.close();
    }
  });

  test("draft-7 headers need a resetTime: the store gives one (no ERR_ERL_HEADERS_NO_RESET)", async () => {
    const { seen, logger } = recorder();
    const site = await app({ windowMs: 2500, limit: 2, standardHeaders: 'draft-7', store: new XcloakStore({ limiter: new Limiter(client) }), logger });
    try {
      const r = await get(site.url, '/ok');
      assert.equal(r.headers.ratelimit, 'limit=2, remaining=1, reset=3');
      assert.deepEqual(seen, []);
    } finally {
      await site.close();
    }
  });

  test('skipFailedRequests: decrement refunds that request\'s own stamp; a rejected request refunds nothing', async () => {
    const { seen, logger } = recorder();
    const site = await app({ windowMs: 60000, limit: 3, skipFailedRequests: true, store: new XcloakStore({ limiter: new Limiter(client) }), logger });
    try {
      for (const path of ['/ok', '/fail', '/ok']) {
        await get(site.url, path);
        await sleep(5);
      }
      await waitFor('the refund', async () => (await server.admin.zcard(KEY)) === 2);
      const scores = (await server.admin.zrange(KEY, 0, -1, 'WITHSCORES')).filter((_, i) => i % 2).map(Number);
      assert.ok(scores[1] - scores[0] >= 10, `the first and third requests' entries stay: ${scores}`);
      await get(site.url, '/ok');
      // Full now: a rejection is a failure (429) too, and express-rate-limit decrements it.
      for (let i = 0; i < 5; i++) assert.equal((await get(site.url, '/ok')).status, 429);
      await sleep(100);
      assert.equal(await server.admin.zcard(KEY), 3, 'the rejected requests refunded nobody else\'s admission');
      assert.deepEqual(seen, []);
    } finally {
      await site.close();
    }
  });

  test('skipSuccessfulRequests under concurrency: exactly the limit in at once', async () => {
    const site = await app({ windowMs: 60000, limit: 5, skipSuccessfulRequests: true, store: new XcloakStore({ limiter: new Limiter(client) }) });
    try {
      const statuses = await burst(site.url);
      assert.equal(statuses.filter((s) => s === 200).length, 5);
      await waitFor('the refunds', async () => (await server.admin.exists(KEY)) === 0);
    } finally {
      await site.close();
    }
  });

  test('a function limit needs the store\'s own limit, which then decides', async () => {
    const own = await app({ windowMs: 60000, limit: () => 2, store: new XcloakStore({ limiter: new Limiter(client), limit: 2 }) });
    try {
      assert.deepEqual([(await get(own.url, '/ok')).status, (await get(own.url, '/ok')).status, (await get(own.url, '/ok')).status], [200, 200, 429]);
    } finally {
      await own.close();
    }
  });

  // express-rate-limit catches what a store's init throws and only logs it;
  // with passOnStoreError a store error per request would then serve every
  // request unlimited. The store throws the configuration error again outside
  // its catch (the app stops at startup) and rejects every request meanwhile.
  // Each app runs in a child process of its own (its startup is meant to
  // fail); `catch` installs an uncaughtException handler so that the requests
  // after it can be counted.
  function setUp(config, { catchIt = true } = {}) {
    const script = `
      import express from 'express';
      import { rateLimit } from 'express-rate-limit';
      import Redis from 'ioredis';
      import { Limiter } from 'xcloak';
      import { XcloakStore } from 'xcloak/express-rate-limit';
      const thrown = [];
      if (${catchIt}) process.on('uncaughtException', (e) => thrown.push(e.message));
      const config = ${JSON.stringify(config)};
      if (config.limit === 'function') config.limit = () => 2;
      const redis = new Redis({ port: ${server.port}, host: '127.0.0.1' });
      const app = express();
      app.use(rateLimit({ ...config, passOnStoreError: true, validate: false, logger: { error() {}, warn() {} }, store: new XcloakStore({ limiter: new Limiter(redis) }) }));
      app.get('/', (req, res) => res.send('ok'));
      const listener = app.listen(0, '127.0.0.1', async () => {
        const statuses = [];
        for (let i = 0; i < 3; i++) statuses.push((await fetch('http://127.0.0.1:' + listener.address().port + '/')).status);
        console.log(JSON.stringify({ thrown, statuses }));
        listener.close();
        redis.disconnect();
      });
    `;
    return spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: packageDir, encoding: 'utf8', timeout: 20000 });
  }

  test('passOnStoreError: a bad window or limit stops the app at startup and never fails open', async () => {
    const cases = [
      [{ windowMs: 60000, limit: -1 }, 'limit must be an integer from 0 to 1000000, got -1'],
      [{ windowMs: 60000, limit: 1e11 }, 'limit must be an integer from 0 to 1000000, got 100000000000'],
      [{ windowMs: -1000, limit: 5 }, 'windowMs must be an integer from 1 to 9007199254740991 (milliseconds), got -1000'],
      [{ windowMs: 1.5, limit: 5 }, 'windowMs must be an integer from 1 to 9007199254740991 (milliseconds), got 1.5'],
      [{ windowMs: 2 ** 53, limit: 5 }, 'windowMs must be an integer from 1 to 9007199254740991 (milliseconds), got 9007199254740992'],
      [{ windowMs: 60000, limit: 'function' }, "limit: express-rate-limit's limit is a function; give the store its own `limit` (the function must return it)"],
    ];
    for (const [config, message] of cases) {
      const child = setUp(config);
      assert.equal(child.status, 0, child.stderr);
      const { thrown, statuses } = JSON.parse(child.stdout);
      assert.deepEqual(thrown, [message], JSON.stringify(config));
      assert.deepEqual(statuses, [429, 429, 429], `${JSON.stringify(config)}: every request rejected, none served unlimited`);
    }
    assert.equal(await server.admin.dbsize(), 0, 'nothing recorded');
    // Without a handler, the process stops at startup with the message.
    const crashed = setUp({ windowMs: 1.5, limit: 5 }, { catchIt: false });
    assert.notEqual(crashed.status, 0);
    assert.match(crashed.stderr, /XcloakError: windowMs must be an integer from 1 to 9007199254740991 \(milliseconds\), got 1\.5/);
    assert.equal(crashed.stdout, '');
  });

  test('the store\'s own options are checked when it is built', () => {
    const limiter = new Limiter(client);
    assert.throws(() => new XcloakStore({ limiter, windowMs: '60000' }), /^XcloakError: windowMs must be an integer .* got the string "60000"$/);
    assert.throws(() => new XcloakStore({ limiter, limit: -1 }), /limit must be an integer from 0 to 1000000, got -1/);
    assert.throws(() => new XcloakStore({ limiter, windwMs: 60000 }), /XcloakStore options: unknown option "windwMs"/);
    assert.throws(() => new XcloakStore({}), /limiter must be an xcloak Limiter, got undefined/);
  });

  test('decrement outside the request that incremented: refunds nothing, warns once', async () => {
    const store = new XcloakStore({ limiter: new Limiter(client), windowMs: 60000, limit: 3 });
    await store.increment('other'); // in this test's own context
    const warnings = [];
    const onWarning = (w) => warnings.push(w.code);
    process.on('warning', onWarning);
    try {
      await new Promise((resolve) => setImmediate(() => store.decrement('nobody').then(resolve)));
      await store.decrement('nobody');
      await sleep(10);
      assert.deepEqual(warnings, ['XCLOAK_DECREMENT_WITHOUT_REQUEST']);
      assert.equal(await server.admin.zcard('rl:http:other'), 1);
      assert.equal((await store.get('other')).totalHits, 1);
      await store.resetKey('other');
      assert.equal(await store.get('other'), undefined);
    } finally {
      process.off('warning', onWarning);
    }
  });
});
