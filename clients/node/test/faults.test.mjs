// Outages and timeouts go to the error policy; a bad argument never does; and
// an ALLOW or REFUND that may have reached the server is never sent again, by
// the package or by the client library under it (docs/clients.md, Errors).
// Everything against real servers: paused with SIGSTOP, killed, restarted, or
// behind a TCP proxy whose connections the test cuts. The server itself
// counts what it ran (INFO commandstats).
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Limiter, SCRIPTS, XcloakError, XcloakTimeoutError, XcloakUnavailableError, XcloakNotReplicatedError } from 'xcloak';
import { xcloakCommand } from 'xcloak/ioredis';
import { Monitor, Proxy, SERVER_MAJOR, Server, stopAll, waitFor } from './harness.mjs';
import { LIBRARIES, close, connect, raw } from './clients.mjs';

after(stopAll);

const isTimeout = (e) => e instanceof XcloakUnavailableError && e.cause instanceof XcloakTimeoutError;

for (const library of LIBRARIES) {
  describe(`${library}: the error policy`, () => {
    test('a paused server: the timeout fires and each policy answers; a bad argument is raised under every policy', async () => {
      const server = await Server.start();
      const client = await connect(library, server.port);
      try {
        const limiters = Object.fromEntries(['raise', 'allow', 'deny'].map((p) => [p, new Limiter(client, { onError: p, timeout: 150 })]));
        for (const limiter of Object.values(limiters)) {
          // Healthy server: a bad argument is the caller's bug, never the policy's.
          await assert.rejects(limiter.allow('k', 0, 3), (e) => e instanceof XcloakError && !(e instanceof XcloakUnavailableError) && e.message === 'ERR window must be an integer from 1 to 9007199254740991 (milliseconds)');
          await assert.rejects(limiter.allow('k', 1.5, 3), (e) => e instanceof XcloakError && /window must be a whole number/.test(e.message));
        }
        await server.resetStats();
        server.pause();
        const started = Date.now();
        await assert.rejects(limiters.raise.allow('k', 60000, 3), isTimeout);
        assert.ok(Date.now() - started < 1000, 'the limiter timeout, not a library default');
        const open = await limiters.allow.allow('k', 60000, 3);
        assert.equal(open.allowed, true);
        assert.equal(open.via, 'error');
        assert.ok(open.error instanceof XcloakTimeoutError);
        assert.deepEqual(limiters.allow.headers(open), {}, 'a via=error decision makes no headers');
        const closed = await limiters.deny.peek('k', 60000, 3);
        assert.equal(closed.allowed, false);
        assert.equal(closed.via, 'error');
        // Still a bad argument while paused: the client refuses it before sending.
        await assert.rejects(limiters.allow.allow('k', 2.5, 3), (e) => e instanceof XcloakError && !(e instanceof XcloakUnavailableError));
        // refund and reset are no decisions: an outage throws whatever the policy.
        await assert.rejects(limiters.allow.refund('k', 1700000000000), isTimeout);
        await assert.rejects(limiters.deny.reset('other'), isTimeout);
        server.resume();
        // The three timed-out ALLOWs ran once each when the server came back; nothing was sent again.
        await waitFor('the queued calls to run', async () => (await server.calls('xcloak.allow')) === 2);
        await sleep(200);
        assert.equal(await server.calls('xcloak.allow'), 2, 'ALLOW: one per call (the peek is a PEEK)');
        assert.equal(await server.calls('xcloak.peek'), 1);
        assert.equal((await server.admin.zcard('k')), 2);
      } finally {
        server.resume();
        await close(client);
        await server.destroy();
      }
    });

    // A caller's cancellation is no outage: acquire aborted while its call
    // waits on a paused server rejects with the signal's reason under every
    // policy. Catches the policy's decision returned (a cancelled wait failing
    // open under allow).
    test('acquire aborted while its call waits on a paused server: the abort, never the policy', async () => {
      const server = await Server.start();
      const client = await connect(library, server.port);
      try {
        for (const onError of ['raise', 'allow', 'deny']) {
          const limiter = new Limiter(client, { onError, timeout: 300 });
          await limiter.allow('warm', 60000, 100);
          server.pause();
          const controller = new AbortController();
          setTimeout(() => controller.abort(new Error('client went away')), 50);
          try {
            await assert.rejects(limiter.acquire('k', 60000, 3, { maxWait: 5000, signal: controller.signal }), /client went away/, onError);
          } finally {
            server.resume();
          }
        }
      } finally {
        await close(client);
        await server.destroy();
      }
    });

    test('a stopped server goes to the policy; a restarted one serves again', async () => {
      const server = await Server.start();
      const client = await connect(library, server.port, library === 'ioredis' ? {} : { socket: { reconnectStrategy: () => 50 } });
      try {
        const deny = new Limiter(client, { onError: 'deny', timeout: 300 });
        assert.equal((await deny.allow('k', 60000, 3)).via, 'command');
        await server.stop();
        const d = await deny.allow('k', 60000, 3);
        assert.equal(d.via, 'error');
        assert.equal(d.allowed, false);
        assert.ok(d.error instanceof Error);
        await assert.rejects(new Limiter(client, { timeout: 300 }).allow('k', 60000, 3), (e) => e instanceof XcloakUnavailableError);
        await server.restart();
        // Whatever was queued while it was down was cancelled at its deadline: never written afterwards.
        await waitFor('the client to reconnect', async () => (await deny.allow('fresh', 60000, 3)).via === 'command');
        await sleep(300);
        assert.equal(await server.admin.exists('k'), 0, 'no call queued during the outage ran later');
      } finally {
        await close(client);
        await server.destroy();
      }
    });

    test("the server's can't-serve-now replies go to the policy: READONLY, BUSY", async () => {
      const primary = await Server.start();
      const replica = await Server.start();
      await replica.admin.call('REPLICAOF', '127.0.0.1', String(primary.port));
      const client = await connect(library, replica.port);
      const busy = await connect(library, primary.port);
      const onPrimary = await connect(library, primary.port);
      try {
        const d = await new Limiter(client, { onError: 'allow' }).allow('k', 60000, 3);
        assert.equal(d.via, 'error');
        assert.match(d.error.message, /^READONLY/);
        await primary.admin.call('CONFIG', 'SET', SERVER_MAJOR >= 7 ? 'busy-reply-threshold' : 'lua-time-limit', '20');
        const spin = raw(busy, ['EVAL', 'local i = 0 while true do i = i + 1 end', '0']).catch(() => {});
        await sleep(100);
        const blocked = await new Limiter(onPrimary, { onError: 'deny', timeout: 2000 }).allow('k', 60000, 3);
        assert.equal(blocked.via, 'error');
        assert.match(blocked.error.message, /^BUSY/);
        await raw(onPrimary, ['SCRIPT', 'KILL']);
        await spin;
      } finally {
        await close(client);
        await close(busy);
        await close(onPrimary);
        await primary.destroy();
        await replica.destroy();
      }
    });
  });

  describe(`${library}: never a second ALLOW or REFUND`, () => {
    // The server is paused with the call in its socket buffer, the client's
    // connection is cut (as a network blip or a proxy restart would), and the
    // server resumes: it runs what it had received, then the client reconnects.
    // Without the guard ioredis writes the unanswered call again on the new
    // connection (autoResendUnfulfilledCommands); node-redis never does.
    // `check(server, outcome)` runs before the server goes.
    async function cutWhilePaused({ module = true, prepare, send, check }) {
      const server = await Server.start({ module });
      const proxy = await Proxy.start(server.port);
      const client = await connect(library, proxy.port, library === 'node-redis' ? { socket: { reconnectStrategy: () => 20 } } : {});
      try {
        await prepare?.(client, server);
        await server.resetStats();
        server.pause();
        const outcome = send(client).then((value) => ({ value }), (error) => ({ error }));
        await sleep(150);
        proxy.cut();
        await sleep(150);
        server.resume();
        const result = await outcome;
        await waitFor('the client to reconnect', async () => (await raw(client, ['PING'])) === 'PONG');
        await sleep(300);
        await check(server, result);
      } finally {
        server.resume();
        await close(client);
        await proxy.stop();
        await server.destroy();
      }
    }

    test('the control: a plain INCR sent the same way', async () => {
      await cutWhilePaused({
        send: (client) => raw(client, ['INCR', 'n']),
        check: async (server) => {
          // ioredis writes the unanswered INCR again: the scenario below is real.
          assert.equal(Number(await server.admin.get('n')), library === 'ioredis' ? 2 : 1);
        },
      });
    });

    for (const via of ['command', 'script']) {
      const ran = (server) => server.calls(via === 'command' ? 'xcloak.allow' : 'evalsha');
      const options = { timeout: 100, onError: 'deny', fallback: via === 'script' ? 'always' : 'never' };
      // The scripts cached first, so the only EVALSHA is the call itself.
      const warm = async (client, server) => {
        for (const script of Object.values(SCRIPTS)) await server.admin.script('LOAD', script.text);
      };

      test(`ALLOW via the ${via}: timed out, connection cut, server back: it ran once`, async () => {
        await cutWhilePaused({
          module: via === 'command',
          prepare: warm,
          send: (client) => new Limiter(client, options).allow('k', 60000, 10),
          check: async (server, { value }) => {
            assert.equal(value.via, 'error', 'the deadline answered with the policy');
            assert.equal(value.allowed, false);
            assert.equal(await ran(server), 1);
            assert.equal(await server.admin.zcard('k'), 1);
          },
        });
      });

      test(`REFUND via the ${via}: timed out, connection cut, server back: it ran once`, async () => {
        let stamps;
        await cutWhilePaused({
          module: via === 'command',
          prepare: async (client, server) => {
            await warm(client, server);
            const limiter = new Limiter(client, { fallback: options.fallback });
            const now = Date.now();
            // Two admissions of cost 1 at one stamp: a second REFUND would remove the second.
            stamps = [(await limiter.allow('k', 600000, 10, { stamp: true, now })).stamp, (await limiter.allow('k', 600000, 10, { stamp: true, now })).stamp];
            assert.equal(stamps[0], stamps[1]);
          },
          send: (client) => new Limiter(client, options).refund('k', stamps[0]),
          check: async (server, { error }) => {
            assert.ok(error instanceof XcloakUnavailableError, 'refund: the outage is thrown');
            assert.equal(await server.calls(via === 'command' ? 'xcloak.refund' : 'evalsha'), 1);
            assert.equal(await server.admin.zcard('k'), 1, 'one entry refunded, not two');
          },
        });
      });
    }

    if (library === 'ioredis') {
      test('an XCLOAK.ALLOW of your own through xcloakCommand is never written twice either', async () => {
        await cutWhilePaused({
          send: (client) => client.sendCommand(xcloakCommand(client, ['XCLOAK.ALLOW', 'k', '60000', '10'])),
          check: async (server, { error }) => {
            assert.equal(error?.name, 'XcloakNotResentError', 'the caller hears of the lost connection');
            assert.equal(await server.calls('xcloak.allow'), 1);
          },
        });
      });

      test('in a pipeline: the ALLOW is not written again, the rest of the pipeline still is', async () => {
        await cutWhilePaused({
          send: (client) => client.pipeline().sendCommand(xcloakCommand(client, ['XCLOAK.ALLOW', 'k', '60000', '10'])).incr('n').exec(),
          check: async (server, { value }) => {
            assert.equal(await server.calls('xcloak.allow'), 1);
            assert.equal(Number(await server.admin.get('n')), 2, 'ioredis re-sent the INCR, as it does');
            assert.equal(value[0][0]?.name, 'XcloakNotResentError');
            assert.equal(value[1][1], 2);
          },
        });
      });

      test("ioredis' own commandTimeout leaves the call queued for a re-send: still once", async () => {
        await cutWhilePaused({
          send: async (client) => {
            const limiter = new Limiter(client, { timeout: 5000, onError: 'allow' });
            client.options.commandTimeout = 100;
            try {
              return await limiter.allow('k', 60000, 10);
            } finally {
              client.options.commandTimeout = undefined;
            }
          },
          check: async (server, { value }) => {
            assert.equal(value.via, 'error');
            assert.match(value.error.message, /Command timed out/);
            assert.equal(await server.calls('xcloak.allow'), 1);
          },
        });
      });
    }
  });
}

describe('durable mode: WAIT on the same connection after an admission', () => {
  // Catches: WAIT pipelined behind every call (a rejection then waits too, for
  // its whole timeout while a replica is down), WAIT on another connection,
  // STAMP sent only under deny (nothing to refund by), a stamp shown that was
  // not asked for, a not-replicated admission reported as a success.
  for (const library of LIBRARIES) {
    test(`${library}: replicated admissions stand; unreplicated ones go to the policy, and deny refunds them`, async () => {
      const primary = await Server.start();
      const replica = await Server.start();
      await replica.admin.call('REPLICAOF', '127.0.0.1', String(primary.port));
      await waitFor('the replica to link', async () => (await replica.info('replication')).master_link_status === 'up');
      const client = await connect(library, primary.port);
      const monitor = await Monitor.start(primary);
      try {
        const durable = { replicas: 1, timeout: 1000 }; // a loaded machine's replica may take 150 ms to acknowledge
        const raise = new Limiter(client, { durable });
        const ok = await raise.allow('k', 60000, 2);
        assert.equal(ok.via, 'command');
        assert.equal(ok.allowed, true);
        assert.equal(ok.stamp, null, 'STAMP was sent for the deny path, but not asked: not shown');
        assert.equal(await primary.calls('wait'), 1);
        const asked = await raise.allow('k', 60000, 2, { stamp: true });
        assert.equal(typeof asked.stamp, 'number');
        const rejected = await raise.allow('k', 60000, 2);
        assert.equal(rejected.allowed, false);
        assert.equal(await primary.calls('wait'), 2, 'a rejection wrote nothing: no WAIT');
        const allow = ['XCLOAK.ALLOW', 'k', '60000', '2', 'DETAILS', 'STAMP'];
        const seen = await monitor.barrier({ sources: true });
        assert.deepEqual(seen.map((l) => l.args), [allow, ['WAIT', '1', '1000'], allow, ['WAIT', '1', '1000'], allow]);
        assert.equal(seen[1].source, seen[0].source, 'WAIT on the connection of its ALLOW');
        assert.equal(seen[3].source, seen[2].source, 'WAIT on the connection of its ALLOW');

        replica.pause();
        await assert.rejects(raise.allow('other', 60000, 5), (e) => e instanceof XcloakUnavailableError && e.cause instanceof XcloakNotReplicatedError);
        assert.equal(await primary.admin.zcard('other'), 1, 'under raise the admission stays (conservative)');
        const open = await new Limiter(client, { durable, onError: 'allow' }).allow('other', 60000, 5);
        assert.equal(open.allowed, true);
        assert.equal(open.via, 'error');
        assert.ok(open.error instanceof XcloakNotReplicatedError);
        const closed = await new Limiter(client, { durable, onError: 'deny' }).allow('other', 60000, 5);
        assert.equal(closed.allowed, false);
        assert.equal(closed.via, 'error');
        assert.equal(await primary.admin.zcard('other'), 2, 'deny refunded its own admission: turned away, it consumes nothing');
        assert.equal(await primary.calls('wait'), 5, 'one WAIT per admission');
        const full = await new Limiter(client, { durable, onError: 'deny' }).allow('other', 60000, 0);
        assert.equal(full.allowed, false);
        assert.equal(full.via, 'command', 'a rejection with the replica down: no WAIT, no wait');
        assert.equal(await primary.calls('wait'), 5);
        const sent = (await monitor.barrier()).filter((args) => args[0] === 'XCLOAK.ALLOW');
        assert.ok(sent.every((args) => args.at(-1) === 'STAMP'), 'every durable ALLOW carries STAMP, whatever the policy');
      } finally {
        monitor.stop();
        replica.resume();
        await close(client);
        await primary.destroy();
        await replica.destroy();
      }
    });
  }
});
