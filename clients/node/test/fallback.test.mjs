// The Lua fallback (docs/clients.md, Fallback): `auto` moves to the script on
// "unknown command" (nothing was applied), `always` never sends XCLOAK.*,
// `never` raises; a server served by the script is probed again after
// probeInterval (MODULE LOAD picked up without a restart); NOSCRIPT loads the
// script by EVAL once; PEEK uses EVALSHA_RO where it exists (7.0+) and
// EVALSHA where it doesn't. Counted by the servers themselves.
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Limiter, SCRIPTS, XcloakError, XcloakUnavailableError } from 'xcloak';
import { MODULE, SERVER_MAJOR, Server, stopAll } from './harness.mjs';
import { LIBRARIES, close, connect } from './clients.mjs';

after(stopAll);

for (const library of LIBRARIES) {
  describe(`${library}: the fallback`, () => {
    test("auto: 'unknown command', then the script for that server; NOSCRIPT loads it by EVAL once", async () => {
      const server = await Server.start({ module: false });
      const client = await connect(library, server.port);
      try {
        await server.resetStats(); // the clients' handshakes (CLIENT SETINFO on 7.0) answer ERR too
        const limiter = new Limiter(client);
        const first = await limiter.allow('k', 60000, 2);
        assert.deepEqual([first.via, first.allowed, first.remaining], ['script', true, 1]);
        assert.equal(await server.errorCount('ERR'), 1, 'one unknown command');
        assert.equal(await server.calls('eval'), 1, 'NOSCRIPT on a fresh server: EVAL of the text');
        const second = await limiter.allow('k', 60000, 2);
        const third = await limiter.allow('k', 60000, 2);
        assert.deepEqual([second.via, second.remaining, third.allowed], ['script', 0, false]);
        assert.equal(await server.errorCount('ERR'), 1, 'the server is known to lack the module: no second probe');
        assert.equal(await server.calls('evalsha'), 3, 'EVALSHA every time (the first answered NOSCRIPT)');
        assert.equal(await server.calls('eval'), 1);
        // A flushed script cache (a restart, a failover to a fresh node): one EVAL again.
        await server.admin.script('FLUSH');
        assert.equal((await limiter.peek('k', 60000, 2)).remaining, 0);
        assert.equal(await limiter.refund('k', first.stamp ?? 0), 0, 'no stamp asked: nothing to refund');
        // The peek's script, and the refund's (never cached there), by EVAL(_RO) once each.
        if (SERVER_MAJOR >= 7) assert.deepEqual([await server.calls('eval_ro'), await server.calls('eval')], [1, 2]);
        else assert.equal(await server.calls('eval'), 3);
        assert.equal(await server.admin.zcard('k'), 2, 'the script wrote the same sorted set the module would');
      } finally {
        await close(client);
        await server.destroy();
      }
    });

    test("never raises the unknown command; always never sends XCLOAK.*", async () => {
      const bare = await Server.start({ module: false });
      const full = await Server.start();
      const onBare = await connect(library, bare.port);
      const onFull = await connect(library, full.port);
      try {
        for (const onError of ['raise', 'allow', 'deny']) {
          await assert.rejects(
            new Limiter(onBare, { fallback: 'never', onError }).allow('k', 60000, 2),
            (e) => e instanceof XcloakError && !(e instanceof XcloakUnavailableError) && /^ERR unknown command/i.test(e.message),
          );
        }
        const always = new Limiter(onFull, { fallback: 'always' });
        assert.equal((await always.allow('k', 60000, 2)).via, 'script');
        assert.equal((await always.peek('k', 60000, 2)).via, 'script');
        assert.equal(await full.calls('xcloak.allow'), 0);
        assert.equal(await full.calls('xcloak.peek'), 0);
        // The module reads the script's window: a deployment moves between them on live keys.
        const module = new Limiter(onFull, { fallback: 'never' });
        const d = await module.allow('k', 60000, 2);
        assert.deepEqual([d.via, d.remaining], ['command', 0]);
      } finally {
        await close(onBare);
        await close(onFull);
        await bare.destroy();
        await full.destroy();
      }
    });

    test('re-probe: MODULE LOAD on a server served by the script is picked up after probeInterval', async () => {
      const server = await Server.start({ module: false });
      const client = await connect(library, server.port);
      try {
        const limiter = new Limiter(client, { probeInterval: 400 });
        assert.equal((await limiter.allow('k', 60000, 3)).via, 'script');
        await server.admin.call('MODULE', 'LOAD', MODULE);
        const soon = await limiter.allow('k', 60000, 3);
        assert.equal(soon.via, 'script', 'within probeInterval: still the script, no probe');
        await sleep(450);
        const probed = await limiter.allow('k', 60000, 3);
        assert.deepEqual([probed.via, probed.remaining], ['command', 0], 'the probe: the command, on the same window');
        assert.equal(limiter.viaOf('k'), 'command');
        assert.equal(await server.calls('xcloak.allow'), 1);
      } finally {
        await close(client);
        await server.destroy();
      }
    });

    test('PEEK through the script: EVALSHA_RO on 7.0+, EVALSHA where the server lacks it', async () => {
      // A server without EVALSHA_RO (as before 7.0): the command renamed away.
      const args = SERVER_MAJOR >= 7 ? ['--rename-command', 'EVALSHA_RO', ''] : [];
      const old = await Server.start({ module: false, args });
      const client = await connect(library, old.port);
      try {
        for (const script of Object.values(SCRIPTS)) await old.admin.script('LOAD', script.text);
        await old.resetStats();
        const limiter = new Limiter(client, { fallback: 'always' });
        await limiter.allow('k', 60000, 2);
        for (let i = 0; i < 3; i++) assert.equal((await limiter.peek('k', 60000, 2)).remaining, 1);
        assert.equal(await old.calls('evalsha'), 4, 'one ALLOW and three PEEKs by EVALSHA');
        assert.equal(await old.errorCount('ERR'), 1, 'EVALSHA_RO tried once');
      } finally {
        await close(client);
        await old.destroy();
      }
      if (SERVER_MAJOR < 7) return;
      const server = await Server.start({ module: false });
      const onServer = await connect(library, server.port);
      try {
        const limiter = new Limiter(onServer, { fallback: 'always' });
        await limiter.peek('k', 60000, 2);
        await limiter.peek('k', 60000, 2);
        assert.equal(await server.calls('evalsha_ro'), 2);
      } finally {
        await close(onServer);
        await server.destroy();
      }
    });
  });
}
