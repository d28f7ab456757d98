// RateLimiterXcloak inside rate-limiter-flexible 11: its own methods mapped
// onto XCLOAK.* (consume -> ALLOW with COST, get -> PEEK, reward -> REFUND by
// stamp, penalty, block, set, delete), and the class at work inside
// rate-limiter-flexible's RateLimiterUnion, RLWrapperTimeouts and
// insuranceLimiter, against real servers.
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { RLWrapperTimeouts, RateLimiterMemory, RateLimiterRedis, RateLimiterRes, RateLimiterUnion } from 'rate-limiter-flexible';
import { Limiter, XcloakError, XcloakUnavailableError } from 'xcloak';
import { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';
import { Server, freePort, stopAll } from './harness.mjs';
import { LIBRARIES, Redis, close, connect } from './clients.mjs';

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

const rejection = (promise) => promise.then(() => assert.fail('expected a rejection'), (e) => e);

for (const library of LIBRARIES) {
  describe(`${library}: RateLimiterXcloak's methods`, () => {
    const make = (options = {}) => new RateLimiterXcloak({ limiter: new Limiter(clients[library]), points: 3, duration: 60, ...options });

    test('consume: an exact window; a rejection records nothing; points are COST', async () => {
      const rl = make();
      for (let i = 0; i < 3; i++) {
        const r = await rl.consume('u');
        assert.ok(r instanceof RateLimiterRes);
        assert.deepEqual([r.remainingPoints, r.consumedPoints, r.isFirstInDuration], [2 - i, i + 1, i === 0]);
        assert.equal(r.msBeforeNext, 60000);
        assert.equal(typeof r.stamp, 'number');
      }
      const rejected = await rejection(rl.consume('u'));
      assert.ok(rejected instanceof RateLimiterRes);
      assert.equal(rejected.remainingPoints, 0);
      assert.equal(rejected.consumedPoints, 3, 'stops at the limit (RateLimiterRedis: 4, the attempt counted)');
      assert.ok(rejected.msBeforeNext > 59000 && rejected.msBeforeNext <= 60000);
      assert.equal(await server.admin.zcard('rlflx:u'), 3);
      const big = await rl.consume('v', 2);
      assert.deepEqual([big.remainingPoints, big.consumedPoints], [1, 2]);
      const tooMany = await rejection(rl.consume('v', 2));
      assert.equal(tooMany.remainingPoints, 1, 'the room left, not a counter above the limit');
      const never = await rejection(rl.consume('w', 4));
      assert.equal(never.msBeforeNext, -1, 'more points than the limit can never fit');
      assert.equal(await server.admin.exists('rlflx:w'), 0);
    });

    test('get is a PEEK (null for an empty window); reward refunds the stamp given, and needs one', async () => {
      const rl = make();
      assert.equal(await rl.get('u'), null);
      const first = await rl.consume('u');
      await sleep(2); // another millisecond: another stamp (one millisecond's admissions share theirs)
      await rl.consume('u', 2);
      assert.equal((await rl.get('u')).remainingPoints, 0);
      assert.equal(await server.admin.zcard('rlflx:u'), 3, 'get recorded nothing');
      const rewarded = await rl.reward('u', 1, { stamp: first.stamp });
      assert.equal(rewarded.remainingPoints, 1);
      assert.equal(rewarded.removed, 1);
      assert.equal((await rl.reward('u', 1, { stamp: first.stamp })).removed, 0, 'that admission is gone already');
      await assert.rejects(rl.reward('u', 1), (e) => e instanceof XcloakError && /needs options.stamp/.test(e.message));
    });

    test('penalty records as many points as fit; set resets then fills; delete removes the window', async () => {
      const rl = make();
      await rl.consume('u');
      const p = await rl.penalty('u', 5);
      assert.equal(p.remainingPoints, 0);
      assert.equal(await server.admin.zcard('rlflx:u'), 3, 'up to the limit, never above it');
      const s = await rl.set('u', 1, 0);
      assert.equal(s.remainingPoints, 2);
      await assert.rejects(rl.set('u', 1, 30), /secDuration must be 0 or the limiter's duration/);
      assert.equal(await rl.delete('u'), true);
      assert.equal(await rl.delete('u'), false);
    });

    test('blockDuration blocks after the first rejection, past the window; block() and delete()', async () => {
      const rl = make({ points: 2, duration: 0.3, blockDuration: 1 });
      await rl.consume('u');
      await rl.consume('u');
      const rejected = await rejection(rl.consume('u'));
      assert.equal(rejected.msBeforeNext, 1000, 'the block, as rate-limiter-flexible reports it');
      await sleep(400); // the window is empty again; the block holds
      const blocked = await rejection(rl.consume('u'));
      assert.ok(blocked.msBeforeNext > 0 && blocked.msBeforeNext <= 600);
      assert.equal((await rl.get('u')).remainingPoints, 0);
      assert.equal(await rl.delete('u'), true);
      assert.equal((await rl.consume('u')).remainingPoints, 1);
      const b = await rl.block('v', 0);
      assert.equal(b.msBeforeNext, -1, 'forever');
      assert.equal((await rejection(rl.consume('v'))).msBeforeNext, -1);
      await assert.rejects(make().block('x', 10), /block needs blockDuration/);
    });

    test('blockDuration shorter than the window: msBeforeNext is the real wait, and the block ends when the request fits', async () => {
      // The case of issue 31: 2 points a minute, a block of 2 s.
      const minute = make({ points: 2, duration: 60, blockDuration: 2 });
      await minute.consume('m');
      await minute.consume('m');
      const third = await rejection(minute.consume('m'));
      assert.ok(third.msBeforeNext > 59000 && third.msBeforeNext <= 60000, `msBeforeNext ${third.msBeforeNext}, not the 2000 of the block`);
      const pttl = await server.admin.pttl('rlflx:m:block');
      assert.ok(pttl > 59000 && pttl <= third.msBeforeNext, `the block lasts as long: ${pttl}`);
      // The same on a short window, where time can pass: the block (200 ms) ends
      // with the window's retry (about 1 s), not before; a consume in between
      // is answered by the block and renews nothing; then one is admitted.
      const rl = make({ points: 2, duration: 1, blockDuration: 0.2 });
      await rl.consume('u');
      await rl.consume('u');
      const rejected = await rejection(rl.consume('u'));
      assert.ok(rejected.msBeforeNext > 900 && rejected.msBeforeNext <= 1000, String(rejected.msBeforeNext));
      await sleep(300); // past blockDuration
      const still = await rejection(rl.consume('u'));
      assert.ok(still.msBeforeNext > 0 && still.msBeforeNext <= rejected.msBeforeNext - 250, `the same block, counting down: ${still.msBeforeNext}`);
      assert.equal(await server.calls('xcloak.allow'), 3 + 3, 'the blocked consume sent no ALLOW');
      await sleep(still.msBeforeNext + 20);
      const admitted = await rl.consume('u');
      assert.equal(admitted.remainingPoints, 1, 'admitted when msBeforeNext said, not blocked again');
    });

    test('options are checked when it is built, with the argument and its range', () => {
      const limiter = new Limiter(clients[library]);
      const refused = (re) => (e) => e instanceof XcloakError && e.code === 'ARGUMENT' && re.test(e.message);
      assert.throws(() => new RateLimiterXcloak({ limiter, points: -1 }), refused(/^points must be an integer from 0 to 1000000, got -1$/));
      assert.throws(() => new RateLimiterXcloak({ limiter, points: 1e11 }), refused(/^points must be an integer from 0 to 1000000/));
      assert.throws(() => new RateLimiterXcloak({ limiter, duration: '60' }), refused(/^duration must be a number of seconds in whole milliseconds .* got the string "60"$/));
      assert.throws(() => new RateLimiterXcloak({ limiter, duration: 0 }), refused(/^duration in milliseconds must be an integer from 1 to 9007199254740991/));
      assert.throws(() => new RateLimiterXcloak({ limiter, duration: 0.0005 }), refused(/^duration must be a number of seconds in whole milliseconds/));
      assert.throws(() => new RateLimiterXcloak({ limiter, blockDuration: -1 }), refused(/^blockDuration must be a number of seconds from 0/));
      assert.throws(() => new RateLimiterXcloak({ limiter, tiers: [[0, 5]] }), refused(/^tiers\[0\] window must be an integer from 1/));
      assert.throws(() => new RateLimiterXcloak({ limiter, pionts: 5 }), refused(/^RateLimiterXcloak options: unknown option "pionts"/));
      assert.throws(() => new RateLimiterXcloak({ limiter, execEvenly: true }), refused(/^execEvenly is not supported/));
      assert.throws(() => new RateLimiterXcloak({ points: 5 }), refused(/^limiter must be an xcloak Limiter/));
    });
  });
}

describe("inside rate-limiter-flexible's own compositions", () => {
  test('RateLimiterUnion of two xcloak limiters: results keyed by keyPrefix, a rejection by either rejects', async () => {
    const limiter = new Limiter(clients.ioredis);
    const perSecond = new RateLimiterXcloak({ limiter, keyPrefix: 'second', points: 2, duration: 1 });
    const perMinute = new RateLimiterXcloak({ limiter, keyPrefix: 'minute', points: 3, duration: 60 });
    const union = new RateLimiterUnion(perSecond, perMinute);
    const first = await union.consume('u');
    assert.deepEqual([first.second.remainingPoints, first.minute.remainingPoints], [1, 2]);
    await union.consume('u');
    const rejected = await rejection(union.consume('u'));
    assert.ok(rejected.second instanceof RateLimiterRes, 'the per-second limiter rejected');
    assert.equal(rejected.minute, undefined);
  });

  test('RLWrapperTimeouts around it: a paused server times out into the insurance limiter', async () => {
    const paused = await Server.start();
    const client = await connect('ioredis', paused.port);
    try {
      const xcloak = new RateLimiterXcloak({ limiter: new Limiter(client, { timeout: 5000 }), points: 3, duration: 60 });
      const wrapped = new RLWrapperTimeouts({ limiter: xcloak, timeoutMs: 100, insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 60 }) });
      assert.equal((await wrapped.consume('u')).remainingPoints, 2, 'through xcloak while the server answers');
      paused.pause();
      const insured = await wrapped.consume('u');
      assert.equal(insured.remainingPoints, 0, 'the memory limiter answered (its own count)');
      await rejection(wrapped.consume('u'));
    } finally {
      paused.resume();
      await close(client);
      await paused.destroy();
    }
  });

  test('its own insuranceLimiter: a stopped server is answered by the insurance; a bad argument is not', async () => {
    const gone = await Server.start();
    const client = await connect('ioredis', gone.port);
    try {
      const rl = new RateLimiterXcloak({
        limiter: new Limiter(client, { timeout: 200 }),
        points: 3,
        duration: 60,
        insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 60 }),
      });
      assert.equal((await rl.consume('u')).remainingPoints, 2);
      await gone.stop();
      assert.equal((await rl.consume('u')).remainingPoints, 0, 'the insurance answered');
      await rejection(rl.consume('u'));
      // A bad argument at a call (a COST above 10^6: the server's refusal) is raised, not insured.
      const broken = new RateLimiterXcloak({ limiter: new Limiter(clients.ioredis), points: 10, duration: 60, insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 60 }) });
      await assert.rejects(broken.consume('u', 2_000_000), (e) => e instanceof XcloakError && !(e instanceof XcloakUnavailableError) && /^ERR COST must be/.test(e.message));
    } finally {
      await close(client);
      await gone.destroy();
    }
  });

  test("as the insuranceLimiter of rate-limiter-flexible's RateLimiterRedis", async () => {
    const port = await freePort(); // nothing listens there
    const dead = new Redis({ port, host: '127.0.0.1', lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null });
    dead.on('error', () => {});
    try {
      const xcloak = new RateLimiterXcloak({ limiter: new Limiter(clients.ioredis), points: 2, duration: 60, keyPrefix: 'insured' });
      const primary = new RateLimiterRedis({ storeClient: dead, points: 10, duration: 60, insuranceLimiter: xcloak, rejectIfRedisNotReady: true });
      assert.equal((await primary.consume('u')).remainingPoints, 1, 'xcloak answered for the dead store');
      await primary.consume('u');
      await rejection(primary.consume('u'));
      assert.equal(await server.admin.zcard('insured:u'), 2);
    } finally {
      dead.disconnect();
    }
  });
});
