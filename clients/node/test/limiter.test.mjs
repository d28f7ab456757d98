// The Limiter's calls beyond the vectors, on a real clock: acquire's real
// sleeps and its AbortSignal, allowAll's refunds when a later request is
// refused, options checked at construction (named, never sent), and the
// ioredis versions: 5 and 6 taken, any other refused when the Limiter is built.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import { Limiter, XcloakError, XcloakUnavailableError } from 'xcloak';
import { SUPPORTED_IOREDIS } from 'xcloak/ioredis';
import { Server, stopAll } from './harness.mjs';
import { IOREDIS_VERSION, LIBRARIES, close, connect } from './clients.mjs';

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
      // The server's answer each turn (test/block-cache.test.mjs runs acquire through the block cache).
      const limiter = new Limiter(clients[library], { jitterFraction: 0, blockCache: 0 });
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
      const limiter = new Limiter(clients[library], { onError: 'allow' });
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
  test('bad options are refused, naming them, with no ERR prefix (that is the server\'s)', () => {
    const client = clients.ioredis;
    const refused = (re) => (e) => e instanceof XcloakError && e.code === 'ARGUMENT' && !e.message.startsWith('ERR') && re.test(e.message);
    assert.throws(() => new Limiter(client, { onError: 'open' }), refused(/^onError must be one of raise, allow, deny, got the string "open"$/));
    assert.throws(() => new Limiter(client, { fallback: 'sometimes' }), refused(/^fallback must be one of/));
    assert.throws(() => new Limiter(client, { timeout: 0 }), refused(/^timeout must be a number of milliseconds of at least 1/));
    assert.throws(() => new Limiter(client, { durable: { replicas: 0, timeout: 10 } }), refused(/^durable.replicas/));
    assert.throws(() => new Limiter(client, { durable: { replicas: 1 } }), refused(/^durable.timeout/));
    assert.throws(() => new Limiter(client, { replicaReads: 'yes' }), refused(/^replicaReads must be true or false/));
    // The old name, and a misspelling: refused, not ignored.
    assert.throws(() => new Limiter(client, { errorPolicy: 'deny' }), refused(/unknown option "errorPolicy" \(known: .*onError/));
    assert.throws(() => new Limiter(client, { timout: 10 }), refused(/unknown option "timout"/));
    for (const bad of [{}, 42, 'redis://127.0.0.1', null, undefined]) {
      assert.throws(() => new Limiter(bad), refused(/^client must be an ioredis Redis or Cluster, or a node-redis client or cluster, got /));
    }
  });

  for (const library of LIBRARIES) {
    test(`${library}: plain-JS mistakes in a call are refused by name and send nothing`, async () => {
      const limiter = new Limiter(clients[library]);
      const refused = (re) => (e) => e instanceof XcloakError && e.code === 'ARGUMENT' && !e.message.startsWith('ERR') && re.test(e.message);
      await assert.rejects(limiter.allow('k', '60000', 10), refused(/^window must be a number, got the string "60000"$/));
      await assert.rejects(limiter.allow('k', 60000, '10'), refused(/^limit must be a number, got the string "10"$/));
      await assert.rejects(limiter.allow('k', 60000, 10, { teirs: [[3_600_000, 100]] }), refused(/^allow options: unknown option "teirs" \(known: cost, tiers, stamp, now\)$/));
      await assert.rejects(limiter.allow('k', 60000, 10, { cots: 2 }), refused(/unknown option "cots"/));
      await assert.rejects(limiter.peek('k', 60000, 10, { stamp: true }), refused(/^peek options: unknown option "stamp"/));
      await assert.rejects(limiter.allow('k', 60000, 10, { tiers: [[3_600_000, '100']] }), refused(/^limit of TIER 1 must be a number/));
      await assert.rejects(limiter.allow(42, 60000, 10), refused(/^key must be a string, got 42$/));
      await assert.rejects(limiter.refund('k', 1, { cots: 2 }), refused(/^refund options: unknown option "cots"/));
      await assert.rejects(limiter.acquire('k', 60000, 10, { maxWait: 10, teirs: [] }), refused(/^acquire options: unknown option "teirs"/));
      await assert.rejects(limiter.allowAll([{ key: 'k', window: 60000, limit: 10, cots: 2 }]), refused(/^allowAll requests\[0\]: unknown option "cots"/));
      // A range error is the server's, verbatim.
      await assert.rejects(limiter.allow('k', 60000, -1), (e) => e instanceof XcloakError && e.code === 'ERR' && e.message === 'ERR limit must be an integer from 0 to 1000000');
      assert.equal(await server.calls('xcloak.allow'), 1, 'only the range error reached the server');
      assert.equal(await server.admin.exists('k'), 0, 'nothing recorded');
    });
  }

  test(`the ioredis under test (${IOREDIS_VERSION}) is supported; majors other than ${SUPPORTED_IOREDIS.join(' and ')} are refused when the Limiter is built`, () => {
    assert.deepEqual(SUPPORTED_IOREDIS, [5, 6]);
    assert.ok(new Limiter(clients.ioredis).transport.module.version === IOREDIS_VERSION);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'xcloak-ioredis-version-'));
    try {
      for (const version of ['4.31.0', '7.0.0']) {
        // A stand-in ioredis of that version: a Redis class the Limiter takes for ioredis's.
        const folder = path.join(dir, version, 'node_modules', 'ioredis');
        mkdirSync(path.join(folder, 'built'), { recursive: true });
        writeFileSync(path.join(folder, 'package.json'), JSON.stringify({ name: 'ioredis', version, main: 'built/index.js' }));
        writeFileSync(
          path.join(folder, 'built', 'Redis.js'),
          'class Redis { constructor() { this.isCluster = false; this.options = {}; } sendCommand() {} duplicate() {} }\nexports.default = Redis;\n',
        );
        writeFileSync(path.join(folder, 'built', 'index.js'), "exports.default = require('./Redis').default; exports.Command = class {};\n");
        const Stand = createRequire(path.join(dir, version, 'x.js'))('ioredis').default;
        let sent = 0;
        const client = new Stand();
        client.sendCommand = () => sent++;
        assert.throws(
          () => new Limiter(client),
          (e) => e instanceof XcloakError && e.code === 'ARGUMENT' && e.message.startsWith(`ioredis ${version} (`) && e.message.endsWith('is not supported: xcloak works with ioredis 5.x and 6.x'),
        );
        assert.equal(sent, 0);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
