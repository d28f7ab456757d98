// The Limiter's calls beyond the vectors, on a real clock: acquire's real
// sleeps and its AbortSignal, allowAll's refunds when a later request is
// refused, options checked at construction, and the ioredis helper's version
// pin.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import { Limiter, XcloakError, XcloakUnavailableError } from 'xcloak';
import { install, TESTED } from 'xcloak/ioredis';
import { Server, stopAll } from './harness.mjs';
import { LIBRARIES, close, connect } from './clients.mjs';

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

for (const library of LIBRARIES) {
  describe(`${library}: the Limiter on a real clock`, () => {
    test('acquire sleeps the server retry-after and is admitted; a deadline shorter than it returns at once', async () => {
      const limiter = new Limiter(clients[library], { jitterFraction: 0 });
      await limiter.allow('k', 300, 1);
      const started = Date.now();
      const short = await limiter.acquire('k', 300, 1, { maxWait: 50 });
      assert.equal(short.allowed, false);
      assert.ok(Date.now() - started < 40, 'it does not sleep when the request cannot fit before the deadline');
      const d = await limiter.acquire('k', 300, 1, { maxWait: 2000 });
      const waited = Date.now() - started;
      assert.equal(d.allowed, true);
      assert.ok(waited >= 250 && waited < 1500, `waited ${waited} ms`);
      assert.equal(await server.calls('xcloak.allow'), 4, 'one call per turn, no polling');
    });

    test('acquire honours an AbortSignal: it rejects with its reason, and the cancelled wait recorded nothing', async () => {
      const limiter = new Limiter(clients[library]);
      await limiter.allow('k', 60000, 1);
      const controller = new AbortController();
      const started = Date.now();
      setTimeout(() => controller.abort(new Error('client went away')), 100);
      await assert.rejects(limiter.acquire('k', 60000, 1, { maxWait: 120000, signal: controller.signal }), /client went away/);
      assert.ok(Date.now() - started < 1000);
      assert.equal(await server.admin.zcard('k'), 1);
      await assert.rejects(limiter.acquire('k', 60000, 1, { maxWait: 1000, signal: AbortSignal.abort() }), { name: 'AbortError' });
      await assert.rejects(limiter.acquire('k', 60000, 1), (e) => e instanceof XcloakError && /needs maxWait/.test(e.message));
    });

    test('allowAll: a refusal by the server at request 1 refunds request 0 and is raised', async () => {
      const limiter = new Limiter(clients[library], { errorPolicy: 'allow' });
      await server.admin.set('b', 'a string');
      await assert.rejects(
        limiter.allowAll([{ key: 'a', window: 60000, limit: 5 }, { key: 'b', window: 60000, limit: 5 }]),
        (e) => e instanceof XcloakError && !(e instanceof XcloakUnavailableError) && e.message.startsWith('WRONGTYPE'),
      );
      assert.equal(await server.admin.exists('a'), 0, 'request 0 refunded (its window left empty)');
      await assert.rejects(limiter.allowAll([{ key: 'a', window: 1.5, limit: 5 }]), /whole number of milliseconds/);
      assert.equal(await server.calls('xcloak.allow'), 2, 'a bad window is refused before anything is sent');
    });

    test('prefix goes before every key', async () => {
      const limiter = new Limiter(clients[library], { prefix: 'app:' });
      const d = await limiter.allow('k', 60000, 2, { stamp: true });
      assert.equal(await server.admin.zcard('app:k'), 1);
      assert.equal(await limiter.refund('k', d.stamp), 1);
      assert.equal(await limiter.reset('k'), false);
    });
  });
}

describe('construction', () => {
  test('bad options are refused, naming them', () => {
    const client = clients.ioredis;
    assert.throws(() => new Limiter(client, { errorPolicy: 'open' }), /errorPolicy must be one of raise, allow, deny/);
    assert.throws(() => new Limiter(client, { fallback: 'sometimes' }), /fallback must be one of/);
    assert.throws(() => new Limiter(client, { timeout: 0 }), /timeout must be a number of milliseconds of at least 1/);
    assert.throws(() => new Limiter(client, { durable: { replicas: 0, timeout: 10 } }), /durable.replicas/);
    assert.throws(() => new Limiter({}), /needs an ioredis Redis or Cluster, or a node-redis client or cluster/);
  });

  test('the ioredis helper installs only into a tested ioredis, and says which', () => {
    assert.deepEqual(TESTED.ioredis, ['6.0.0']);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'xcloak-ioredis-pin-'));
    try {
      for (const [name, version] of [['ioredis', '5.9.9'], ['@ioredis/commands', '2.0.0']]) {
        const folder = path.join(dir, 'node_modules', name);
        mkdirSync(folder, { recursive: true });
        writeFileSync(path.join(folder, 'package.json'), JSON.stringify({ name, version, main: 'index.js' }));
        writeFileSync(path.join(folder, 'index.js'), 'module.exports = {};');
      }
      assert.throws(() => install({ from: dir }), /ioredis 5\.9\.9 is not a tested version \(tested: 6\.0\.0\)/);
      // With allowUntested it warns, then its self-check refuses this stand-in (no Command class).
      const warnings = [];
      const onWarning = (w) => warnings.push(w.code);
      process.on('warning', onWarning);
      try {
        assert.throws(() => install({ from: dir, allowUntested: true }));
      } finally {
        process.off('warning', onWarning);
      }
      assert.ok(install().version === '6.0.0', 'the real one installs, idempotently');
      assert.equal(install(), install());
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
