// Redis Cluster (3 primaries + 3 replicas): every call reaches its key's node
// (0 MOVED, counted by the servers), admissions are exact, ioredis' keyPrefix
// applies, PEEK goes to replicas where the client reads from them and the
// limiter has replicaReads (else to the primary); ioredis' own calls and
// pipelines route through xcloakCommand (a plain `call` is the control); the
// cluster's retry after a lost connection never sends an ALLOW twice; and
// the fallback is chosen per node (one primary without the module, then
// MODULE LOAD on it at run time).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Limiter, XcloakUnavailableError, keySlot } from 'xcloak';
import { xcloakCommand } from 'xcloak/ioredis';
import { Cluster, MODULE, Proxy, stopAll } from './harness.mjs';
import { LIBRARIES, close, connectCluster, raw } from './clients.mjs';

after(stopAll);

const KEYS = 120;
const LIMIT = 3;
const WINDOW = 600000;

/** Sums a counter over nodes. */
async function total(nodes, method, arg) {
  let sum = 0;
  for (const node of nodes) sum += await node[method](arg);
  return sum;
}

describe('a 3+3 cluster with the module on every node', () => {
  let cluster;
  let primaries;
  let replicas;
  before(async () => {
    cluster = await Cluster.start({ primaries: 3, replicas: 1 });
    primaries = await cluster.primaries();
    replicas = await cluster.replicas();
  });
  after(async () => cluster?.destroy());

  test('the key slot is the server\'s', async () => {
    for (const key of ['a', 'rl:user:42', '{tag}x', 'x{tag}', '{}x', 'é', 'a{b}c{d}']) {
      assert.equal(keySlot(key), await cluster.nodes[0].admin.call('CLUSTER', 'KEYSLOT', key), key);
    }
  });

  for (const library of LIBRARIES) {
    test(`${library}: the Limiter reaches every key's node, admits exactly, and peeks on replicas`, async () => {
      const client = await connectCluster(library, cluster.nodes[0].port, library === 'ioredis' ? { scaleReads: 'slave' } : { useReplicas: true });
      try {
        const limiter = new Limiter(client, { prefix: `${library}:`, replicaReads: true });
        const onPrimary = new Limiter(client, { prefix: `${library}:` });
        await cluster.resetStats();
        let admitted = 0;
        for (let round = 0; round <= LIMIT; round++) {
          const decisions = await Promise.all(Array.from({ length: KEYS }, (_, i) => limiter.allow(`k${i}`, WINDOW, LIMIT)));
          for (const d of decisions) {
            assert.equal(d.via, 'command');
            assert.equal(d.allowed, round < LIMIT, `round ${round}`);
            if (d.allowed) admitted++;
          }
        }
        assert.equal(admitted, KEYS * LIMIT);
        assert.equal(await total(cluster.nodes, 'errorCount', 'MOVED'), 0, 'MOVED replies');
        assert.equal(await total(primaries, 'calls', 'xcloak.allow'), KEYS * (LIMIT + 1));
        for (let i = 0; i < KEYS; i += 17) {
          const owner = await cluster.ownerOf(`${library}:k${i}`);
          assert.equal(await owner.admin.zcard(`${library}:k${i}`), LIMIT, `k${i} on its slot's primary`);
          assert.equal(limiter.transport.nodeOf(`${library}:k${i}`), owner.address);
        }
        // PEEK: replicas hold the windows once replication caught up.
        await cluster.waitReplicated();
        await cluster.resetStats();
        const peeks = await Promise.all(Array.from({ length: KEYS }, (_, i) => limiter.peek(`k${i}`, WINDOW, LIMIT)));
        assert.ok(peeks.every((d) => !d.allowed && d.remaining === 0));
        const onReplicas = await total(replicas, 'calls', 'xcloak.peek');
        const onPrimaries = await total(primaries, 'calls', 'xcloak.peek');
        assert.equal(onReplicas + onPrimaries, KEYS);
        if (library === 'ioredis') assert.equal(onPrimaries, 0, "scaleReads 'slave': every PEEK on a replica");
        else assert.ok(onReplicas > 0, 'useReplicas: PEEKs on replicas too');
        assert.equal(await total(cluster.nodes, 'errorCount', 'MOVED'), 0);
        // Without replicaReads (the default) every PEEK goes to the primary.
        await cluster.resetStats();
        await Promise.all(Array.from({ length: KEYS }, (_, i) => onPrimary.peek(`k${i}`, WINDOW, LIMIT)));
        assert.equal(await total(replicas, 'calls', 'xcloak.peek'), 0);
        assert.equal(await total(primaries, 'calls', 'xcloak.peek'), KEYS);
        // allowAll over keys in different slots.
        const multi = await limiter.allowAll([{ key: 'fresh:a', window: WINDOW, limit: 1 }, { key: 'k0', window: WINDOW, limit: LIMIT }]);
        assert.equal(multi.allowed, false);
        assert.equal(multi.rejected, 1);
        assert.equal(await (await cluster.ownerOf(`${library}:fresh:a`)).admin.zcard(`${library}:fresh:a`), 0, 'refunded on its own node');
      } finally {
        await close(client);
      }
    });
  }

  test("ioredis: keyPrefix applies to the Limiter's keys, and the fallback's", async () => {
    const client = await connectCluster('ioredis', cluster.nodes[0].port, { keyPrefix: 'app:' });
    try {
      await cluster.resetStats();
      for (const fallback of ['never', 'always']) {
        const limiter = new Limiter(client, { prefix: `rl:${fallback}:`, fallback });
        for (let i = 0; i < 30; i++) assert.equal((await limiter.allow(`k${i}`, WINDOW, LIMIT)).allowed, true);
        for (let i = 0; i < 30; i++) {
          const key = `app:rl:${fallback}:k${i}`;
          assert.equal(await (await cluster.ownerOf(key)).admin.zcard(key), 1, key);
        }
      }
      assert.equal(await total(cluster.nodes, 'errorCount', 'MOVED'), 0);
    } finally {
      await close(client);
    }
  });

  test("ioredis' own calls and pipelines through xcloakCommand: 0 MOVED, keyPrefix, PEEK on replicas; a plain call is the control", async () => {
    const plain = await connectCluster('ioredis', cluster.nodes[0].port, { scaleReads: 'slave' });
    const prefixed = await connectCluster('ioredis', cluster.nodes[0].port, { enableAutoPipelining: true, keyPrefix: 'auto:', scaleReads: 'slave' });
    try {
      // The control: ioredis alone sends a module command to a random primary.
      await cluster.resetStats();
      for (let i = 0; i < 30; i++) await plain.call('xcloak.allow', `control:${i}`, WINDOW, LIMIT).catch(() => {});
      assert.ok((await total(cluster.nodes, 'errorCount', 'MOVED')) > 0, 'without xcloakCommand, MOVED');

      await cluster.resetStats();
      for (let i = 0; i < 30; i++) assert.equal(await plain.sendCommand(xcloakCommand(plain, ['xcloak.allow', `call:${i}`, WINDOW, LIMIT])), 1);
      for (let i = 0; i < 30; i++) {
        const results = await plain
          .pipeline()
          .sendCommand(xcloakCommand(plain, ['xcloak.allow', `pipe:${i}`, WINDOW, LIMIT]))
          .sendCommand(xcloakCommand(plain, ['XCLOAK.ALLOW', `pipe:${i}`, WINDOW, LIMIT, 'DETAILS']))
          .exec();
        assert.deepEqual(results.map(([e]) => e), [null, null]);
      }
      const replies = await Promise.all(Array.from({ length: 60 }, (_, i) => prefixed.sendCommand(xcloakCommand(prefixed, ['xcloak.allow', `k${i % 30}`, WINDOW, LIMIT]))));
      assert.deepEqual(replies, Array(60).fill(1));
      assert.equal(await total(cluster.nodes, 'errorCount', 'MOVED'), 0);
      assert.equal(await total(await cluster.primaries(), 'calls', 'xcloak.allow'), 30 + 60 + 60);
      for (let i = 0; i < 30; i += 7) assert.equal(await (await cluster.ownerOf(`auto:k${i}`)).admin.zcard(`auto:k${i}`), 2);
      await cluster.waitReplicated();
      await cluster.resetStats();
      await Promise.all(Array.from({ length: 30 }, (_, i) => prefixed.sendCommand(xcloakCommand(prefixed, ['xcloak.peek', `k${i}`, WINDOW, LIMIT]))));
      assert.equal(await total(await cluster.primaries(), 'calls', 'xcloak.peek'), 0);
      assert.equal(await total(await cluster.replicas(), 'calls', 'xcloak.peek'), 30);
    } finally {
      await close(plain);
      await close(prefixed);
    }
  });

  // An outage at request 1: request 0 is refunded on its own node, then the
  // policy answers once: under allow and deny the decision received for
  // request 0, then a via=error decision for request 1 (its own tier 0),
  // which binds; rejected is 1 under deny, null under allow; raise throws.
  // Catches the error decision built from request 0, the received decisions
  // dropped, rejected left null under deny, no refund.
  for (const library of LIBRARIES) {
    for (const onError of ['raise', 'allow', 'deny']) {
      test(`${library}: allowAll with its second key's node paused (${onError}): the first is refunded, the policy answers once`, async () => {
        const client = await connectCluster(library, cluster.nodes[0].port);
        try {
          const limiter = new Limiter(client, { timeout: 150, onError });
          const first = `outage:${library}:${onError}:a`;
          const firstOwner = await cluster.ownerOf(first);
          let second;
          for (let i = 0; !second; i++) if ((await cluster.ownerOf(`outage:${library}:${onError}:b${i}`)) !== firstOwner) second = `outage:${library}:${onError}:b${i}`;
          const secondOwner = await cluster.ownerOf(second);
          await limiter.reset(second); // the connection exists
          secondOwner.pause();
          let outcome;
          try {
            outcome = await limiter.allowAll([{ key: first, window: WINDOW, limit: 5 }, { key: second, window: 120000, limit: 7 }]).catch((error) => ({ error }));
          } finally {
            secondOwner.resume();
          }
          assert.equal(await firstOwner.admin.exists(first), 0, 'request 0 refunded on its own node');
          if (onError === 'raise') {
            assert.ok(outcome.error instanceof XcloakUnavailableError, String(outcome.error));
            return;
          }
          const multi = outcome;
          assert.equal(multi.allowed, onError === 'allow');
          assert.equal(multi.via, 'error');
          assert.equal(multi.rejected, onError === 'deny' ? 1 : null);
          assert.equal(multi.bindingIndex, 1);
          assert.equal(multi.decisions.length, 2);
          const [received, failed] = multi.decisions;
          assert.equal(received.allowed, true);
          assert.equal(received.via, 'command');
          assert.equal(received.limit, 5);
          assert.equal(received.remaining, 4, 'it still shows its own admission');
          assert.equal(typeof received.stamp, 'number');
          assert.equal(failed.via, 'error');
          assert.equal(failed.allowed, multi.allowed);
          assert.ok(failed.error instanceof Error);
          assert.deepEqual([failed.limit, failed.window, failed.remaining, failed.tier], [7, 120000, 0, 0], "request 1's tier 0");
          assert.equal(multi.binding, failed);
          assert.equal(multi.retryAfter, 0);
          assert.deepEqual(limiter.headers(multi), {});
        } finally {
          await close(client);
        }
      });
    }
  }

  for (const library of LIBRARIES) {
    test(`${library}: a node's connection lost with an ALLOW in flight: the cluster never sends it again`, async () => {
      // Every node behind a proxy (ioredis natMap, node-redis nodeAddressMap),
      // so the test can cut one node's connection while that node is paused.
      const proxies = new Map();
      for (const node of cluster.nodes) proxies.set(node.address, await Proxy.start(node.port));
      const mapped = Object.fromEntries([...proxies].map(([address, proxy]) => [address, { host: '127.0.0.1', port: proxy.port }]));
      const first = proxies.get(cluster.nodes[0].address).port;
      const client =
        library === 'ioredis'
          ? await connectCluster('ioredis', first, { natMap: mapped })
          : await connectCluster('node-redis', first, { nodeAddressMap: mapped });
      try {
        const limiter = new Limiter(client, { timeout: 100, onError: 'deny' });
        for (const [name, send] of [
          ['ALLOW', (key) => limiter.allow(key, WINDOW, LIMIT)],
          ['INCR (the control)', (key) => raw(client, ['INCR', key])],
        ]) {
          const key = `lost:${library}:${name}`;
          const owner = await cluster.ownerOf(key);
          await warmUp(client, key);
          await owner.resetStats();
          owner.pause();
          const outcome = send(key).catch((e) => e);
          await sleep(150);
          proxies.get(owner.address).cut();
          await sleep(400); // past ioredis' retryDelayOnFailover (100 ms)
          owner.resume();
          await outcome;
          await sleep(600);
          const ran = name === 'ALLOW' ? await owner.calls('xcloak.allow') : Number(await owner.admin.get(key));
          // ioredis' Cluster re-sends a command whose connection closed; node-redis never does.
          const expected = name === 'ALLOW' || library === 'node-redis' ? 1 : 2;
          assert.equal(ran, expected, `${name}: ran ${ran} times`);
        }
      } finally {
        await close(client);
        for (const proxy of proxies.values()) await proxy.stop();
      }
    });
  }
});

async function warmUp(client, key) {
  // The connection to the key's node exists before the pause.
  await raw(client, ['EXISTS', key]);
}

describe('a 3+3 cluster where one primary lacks the module', () => {
  let cluster;
  let bare;
  before(async () => {
    cluster = await Cluster.start({ primaries: 3, replicas: 1, module: (i) => i !== 0 });
    bare = cluster.nodes[0];
    assert.equal((await bare.info('replication')).role, 'master');
  });
  after(async () => cluster?.destroy());

  test('the fallback is chosen per node, and MODULE LOAD there moves that node back to the command', async () => {
    const clients = await Promise.all(LIBRARIES.map((library) => connectCluster(library, cluster.nodes[1].port)));
    try {
      // blockCache 0: the rejections after MODULE LOAD must reach the node (the block cache would answer them).
      const limiters = clients.map((client, n) => new Limiter(client, { prefix: `${LIBRARIES[n]}:`, probeInterval: 300, blockCache: 0 }));
      const keys = Array.from({ length: 60 }, (_, i) => `k${i}`);
      for (const [n, limiter] of limiters.entries()) {
        const owners = await Promise.all(keys.map((k) => cluster.ownerOf(`${LIBRARIES[n]}:${k}`)));
        assert.ok(owners.some((o) => o === bare) && owners.some((o) => o !== bare));
        for (let round = 0; round < 2; round++) {
          const decisions = await Promise.all(keys.map((k) => limiter.allow(k, WINDOW, 2)));
          decisions.forEach((d, i) => {
            assert.equal(d.allowed, true);
            assert.equal(d.via, owners[i] === bare ? 'script' : 'command', `${LIBRARIES[n]} ${keys[i]}`);
          });
        }
        const third = await Promise.all(keys.map((k) => limiter.allow(k, WINDOW, 2)));
        assert.ok(third.every((d) => !d.allowed), 'both forms count the same window');
      }
      assert.equal(await total(cluster.nodes, 'errorCount', 'MOVED'), 0);
      // A rolling MODULE LOAD: picked up within probeInterval, on the windows the script wrote.
      await bare.admin.call('MODULE', 'LOAD', MODULE);
      await sleep(350);
      for (const [n, limiter] of limiters.entries()) {
        const decisions = await Promise.all(keys.map((k) => limiter.allow(k, WINDOW, 2)));
        decisions.forEach((d, i) => {
          assert.equal(d.via, 'command', `${LIBRARIES[n]} ${keys[i]} after MODULE LOAD`);
          assert.equal(d.allowed, false, 'the module reads the sorted set the script wrote');
        });
      }
    } finally {
      for (const client of clients) await close(client);
    }
  });
});
