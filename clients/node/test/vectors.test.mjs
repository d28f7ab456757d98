// Every conformance vector (clients/conformance/vectors.json) through this
// package: first the pure core alone (commands, reply -> Decision -> headers,
// acquire's steps, allow_all's binding), then through the Limiter against a
// live server, for both client libraries, once through the command (module
// loaded) and once through the fallback (a server without it), comparing the
// commands the server received (MONITOR), the decisions, both header styles,
// the errors (XcloakError with the server's text), acquire's sleeps on a
// virtual clock and allow_all's calls. `raw` steps are the replay's only.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import {
  Limiter,
  SCRIPTS,
  XcloakError,
  XcloakUnavailableError,
  acquireStep,
  allowCommand,
  decisionFromReply,
  headers,
  multiDecision,
  peekCommand,
  refundCommand,
} from 'xcloak';
import { Monitor, Server, VECTORS, stopAll } from './harness.mjs';
import { Redis } from './clients.mjs';

/** A Decision in the vectors' shape (milliseconds, snake case). */
export function wire(d) {
  return {
    allowed: d.allowed,
    limit: d.limit,
    remaining: d.remaining,
    retry_after_ms: d.retryAfter,
    reset_after_ms: d.resetAfter,
    cost_exceeds_limit: d.costExceedsLimit,
    window_ms: d.window,
    tier: d.tier,
    tiers: d.tiers.map((t) => ({
      window_ms: t.window,
      limit: t.limit,
      remaining: t.remaining,
      retry_after_ms: t.retryAfter,
      reset_after_ms: t.resetAfter,
    })),
    stamp: d.stamp,
  };
}

const specOf = (step, now = step.now) => ({
  key: step.key,
  window: step.window,
  limit: step.limit,
  cost: step.cost,
  tiers: step.tiers,
  now,
  stamp: step.stamp,
  oldest: step.oldest,
});

/** A peek with `oldest` records `oldest_ms` (null: none); every other call's Decision has oldest null. */
const oldestOf = (step) => (step.oldest ? step.oldest_ms : null);

function checkHeaders(where, decision, step) {
  assert.deepEqual(headers(decision, { style: 'ietf', names: step.names }), step.headers.ietf, `${where}: ietf headers`);
  assert.deepEqual(headers(decision, { style: 'legacy', names: step.names }), step.headers.legacy, `${where}: legacy headers`);
  assert.deepEqual(headers(decision, { style: 'both', names: step.names }), { ...step.headers.ietf, ...step.headers.legacy }, `${where}: both`);
}

const cases = VECTORS.cases;
const steps = (op) => cases.flatMap((c) => c.steps.filter((s) => s.op === op).map((s) => [c.name, s]));

describe('the pure core, driven by every vector without a server', () => {
  test('the vectors hold every op', () => {
    for (const op of ['allow', 'peek', 'refund', 'reset', 'acquire', 'allow_all', 'setup', 'raw']) assert.ok(steps(op).length > 0, op);
  });

  test('allow and peek: the canonical command, the Decision, the headers', () => {
    let n = 0;
    for (const [name, step] of [...steps('allow'), ...steps('peek')]) {
      const where = `${name} ${step.op} ${JSON.stringify(step.command)}`;
      const command = step.op === 'allow' ? allowCommand(specOf(step)) : peekCommand(specOf(step));
      assert.deepEqual(command, step.command, where);
      if (step.error) continue;
      const decision = decisionFromReply(step.reply, specOf(step), 'command');
      assert.deepEqual(wire(decision), step.decision, where);
      assert.equal(decision.oldest, oldestOf(step), `${where}: oldest`);
      checkHeaders(where, decision, step);
      n++;
    }
    assert.ok(n > 100, `${n} decisions`);
  });

  test('refund: the canonical command', () => {
    for (const [name, step] of steps('refund')) {
      assert.deepEqual(refundCommand(step.key, step.stamp, step.cost), step.command, name);
    }
  });

  test("acquire: every call's command, every sleep, the outcome", () => {
    for (const [name, step] of steps('acquire')) {
      const deadline = step.start + step.max_wait_ms;
      const draws = [...step.random];
      let now = step.start;
      step.calls.forEach((call, i) => {
        assert.equal(call.now, now, `${name} call ${i}: the clock`);
        assert.deepEqual(allowCommand(specOf(step, now)), call.command, `${name} call ${i}`);
        const decision = decisionFromReply(call.reply, specOf(step, now), 'command');
        const next = acquireStep(decision, now, deadline, step.jitter_fraction, () => draws.shift());
        if (call.sleep_ms === null) {
          assert.equal(next.done, true, `${name}: stops after call ${i}`);
          assert.equal(next.outcome, step.outcome, name);
          assert.deepEqual(wire(decision), step.decision, name);
        } else {
          assert.deepEqual(next, { done: false, sleep: call.sleep_ms }, `${name} call ${i}`);
          now += call.sleep_ms;
        }
      });
      assert.equal(draws.length, 0, `${name}: every random draw used`);
    }
  });

  test("allow_all: the calls, the binding decision, the headers", () => {
    for (const [name, step] of steps('allow_all')) {
      const decisions = [];
      let rejected = null;
      const allows = step.calls.filter((c) => c.command[0] === 'XCLOAK.ALLOW');
      allows.forEach((call, i) => {
        const spec = { ...specOf(step.requests[i], step.now), stamp: true };
        assert.deepEqual(allowCommand(spec), call.command, `${name} request ${i}`);
        const d = decisionFromReply(call.reply, spec, 'command');
        decisions.push(d);
        if (!d.allowed) rejected = i;
      });
      // The refunds: the admitted ones before the rejection, in order, by stamp and cost.
      const refunds = step.calls.filter((c) => c.command[0] === 'XCLOAK.REFUND').map((c) => c.command);
      const expected = rejected === null ? [] : decisions.slice(0, rejected).map((d, i) => refundCommand(step.requests[i].key, d.stamp, step.requests[i].cost));
      assert.deepEqual(refunds, expected, `${name}: refunds`);
      const multi = multiDecision(decisions, rejected);
      assert.equal(multi.allowed, step.allowed, name);
      assert.equal(multi.rejected, step.rejected, name);
      assert.equal(multi.bindingIndex, step.binding, name);
      assert.deepEqual(multi.decisions.map(wire), step.decisions, name);
      assert.deepEqual(headers(multi, { style: 'ietf', names: step.names }), step.headers.ietf, `${name}: ietf`);
      assert.deepEqual(headers(multi, { style: 'legacy', names: step.names }), step.headers.legacy, `${name}: legacy`);
    }
  });

  test('a window that is not whole milliseconds is refused by the client, naming window', () => {
    assert.throws(() => allowCommand({ key: 'k', window: 1.5, limit: 1 }), (e) => e instanceof XcloakError && e.code === 'ARGUMENT' && /^window must be a whole number of milliseconds, got 1.5$/.test(e.message));
    assert.throws(() => peekCommand({ key: 'k', window: 1000, limit: 1, tiers: [[10.25, 1]] }), /window of TIER 1 must be a whole number/);
  });
});

// ---- Live: every vector through the Limiter.

/** Opens a client of `library` on `server`; returns [client, close, sendRaw]. */
async function open(library, server) {
  if (library.startsWith('ioredis')) {
    const client = new Redis({ port: server.port, host: '127.0.0.1', stringNumbers: library === 'ioredis+stringNumbers' });
    await new Promise((resolve, reject) => client.once('ready', resolve).once('error', reject));
    return { client, close: () => client.quit(), raw: (argv) => client.call(...argv) };
  }
  const client = createClient({ url: server.url });
  client.on('error', () => {});
  await client.connect();
  return { client, close: () => client.quit(), raw: (argv) => client.sendCommand(argv) };
}

/** The command a call sends on a server without the module (fallback 'always'). */
function scriptCommand(command, readOnlyScripts) {
  const [name, key, ...args] = command;
  const script = { 'XCLOAK.ALLOW': SCRIPTS.allow, 'XCLOAK.PEEK': SCRIPTS.peek, 'XCLOAK.REFUND': SCRIPTS.refund }[name];
  if (!script) return command;
  const evalsha = name === 'XCLOAK.PEEK' && readOnlyScripts ? 'EVALSHA_RO' : 'EVALSHA';
  return [evalsha, script.sha, '1', key, ...args];
}

async function runCase(testCase, { limiter, raw, via, readOnlyScripts, limiterFor }) {
  const sent = [];
  for (const [index, step] of testCase.steps.entries()) {
    const where = `${testCase.name} step ${index} (${step.op})`;
    switch (step.op) {
      case 'raw':
        continue;
      case 'setup': {
        const reply = await raw(step.command);
        assert.deepEqual(typeof step.reply === 'number' ? Number(reply) : reply, step.reply, where);
        sent.push(step.command);
        break;
      }
      case 'allow':
      case 'peek': {
        const options = { cost: step.cost, tiers: step.tiers, now: step.now };
        if (step.op === 'allow') options.stamp = step.stamp;
        else options.oldest = step.oldest;
        const call = () => (step.op === 'allow' ? limiter.allow(step.key, step.window, step.limit, options) : limiter.peek(step.key, step.window, step.limit, options));
        sent.push(scriptCommandIf(via, step.command, readOnlyScripts));
        if (step.error) {
          await assert.rejects(call(), (e) => e instanceof XcloakError && !(e instanceof XcloakUnavailableError) && e.message === step.error, where);
          break;
        }
        const decision = await call();
        assert.deepEqual(wire(decision), step.decision, where);
        assert.equal(decision.oldest, oldestOf(step), `${where}: oldest`);
        assert.equal(decision.via, via, where);
        checkHeaders(where, decision, step);
        break;
      }
      case 'refund': {
        sent.push(scriptCommandIf(via, step.command, readOnlyScripts));
        const call = () => limiter.refund(step.key, step.stamp, { cost: step.cost });
        if (step.error) await assert.rejects(call(), (e) => e instanceof XcloakError && e.message === step.error, where);
        else assert.equal(await call(), step.removed, where);
        break;
      }
      case 'reset':
        sent.push(step.command);
        assert.equal(await limiter.reset(step.key), step.existed, where);
        break;
      case 'acquire': {
        let now = step.start;
        const sleeps = [];
        const draws = [...step.random];
        const clocked = limiterFor({
          clock: { now: () => now, sleep: async (ms) => { sleeps.push(ms); now += ms; } },
          random: () => draws.shift(),
          jitterFraction: step.jitter_fraction,
        });
        const decision = await clocked.acquire(step.key, step.window, step.limit, { cost: step.cost, tiers: step.tiers, maxWait: step.max_wait_ms });
        sent.push(...step.calls.map((c) => scriptCommandIf(via, c.command, readOnlyScripts)));
        assert.deepEqual(sleeps, step.calls.filter((c) => c.sleep_ms !== null).map((c) => c.sleep_ms), `${where}: sleeps`);
        assert.deepEqual(wire(decision), step.decision, where);
        break;
      }
      case 'allow_all': {
        const multi = await limiter.allowAll(step.requests, { now: step.now });
        sent.push(...step.calls.map((c) => scriptCommandIf(via, c.command, readOnlyScripts)));
        assert.equal(multi.allowed, step.allowed, where);
        assert.equal(multi.rejected, step.rejected, where);
        assert.equal(multi.bindingIndex, step.binding, where);
        assert.deepEqual(multi.decisions.map(wire), step.decisions, where);
        assert.deepEqual(headers(multi, { style: 'ietf', names: step.names }), step.headers.ietf, where);
        assert.deepEqual(headers(multi, { style: 'legacy', names: step.names }), step.headers.legacy, where);
        break;
      }
      default:
        assert.fail(`${where}: unknown op`);
    }
  }
  return sent;
}

function scriptCommandIf(via, command, readOnlyScripts) {
  return via === 'script' ? scriptCommand(command, readOnlyScripts) : command;
}

// ioredis 6.0.0 (like node-redis, whose decoder it shares) reads an integer
// as `number * 10 + byte - 48`, which rounds past 2^53: the integers within 57
// of 2^53 - 1 come back one off. The transports read them as text where a
// reply may hold one (huge-windows); a client with `stringNumbers: true` as well.
for (const library of ['ioredis', 'ioredis+stringNumbers', 'node-redis']) {
  for (const via of ['command', 'script']) {
    describe(`every vector through ${library}, via the ${via}`, () => {
      let server;
      let monitor;
      let connection;
      let readOnlyScripts;
      before(async () => {
        server = await Server.start({ module: via === 'command' });
        readOnlyScripts = (await server.version())[0] >= 7;
        // Cached beforehand, so the commands sent are exactly the vectors' (NOSCRIPT is tested in fallback.test.mjs).
        for (const script of Object.values(SCRIPTS)) await server.admin.script('LOAD', script.text);
        connection = await open(library, server);
        monitor = await Monitor.start(server);
      });
      after(async () => {
        monitor?.stop();
        await connection?.close();
        await server?.destroy();
      });

      for (const testCase of cases) {
        if (testCase.steps.every((s) => s.op === 'raw')) continue;
        test(testCase.name, async () => {
          await server.admin.flushall();
          await monitor.barrier();
          const fallback = via === 'script' ? 'always' : 'never';
          const limiterFor = (options = {}) => new Limiter(connection.client, { fallback, ...options });
          const sent = await runCase(testCase, { limiter: limiterFor(), raw: connection.raw, via, readOnlyScripts, limiterFor });
          assert.deepEqual(await monitor.barrier(), sent, `${testCase.name}: the commands the server received`);
        });
      }
    });
  }
}

after(stopAll);
