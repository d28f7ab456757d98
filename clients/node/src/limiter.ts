// The Limiter: the contract's calls (docs/clients.md) over an ioredis or
// node-redis client, with the Lua fallback chosen per node, the per-call
// timeout, the error policy and the durable mode. The decisions themselves
// are decision.ts's; this file only sends and receives.

import { setTimeout as sleepFor } from 'node:timers/promises';
import {
  acquireStep,
  allowCommand,
  decisionFromReply,
  errorDecision,
  headers as headerFields,
  multiDecision,
  peekCommand,
  refundCommand,
  type CallSpec,
  type Decision,
  type HeaderOptions,
  type MultiDecision,
  type MultiHeaderOptions,
  type TierSpec,
  type Via,
} from './decision.js';
import {
  XcloakNotReplicatedError,
  XcloakUnavailableError,
  isNoScript,
  isUnknownCommand,
  toXcloakError,
} from './errors.js';
import { BlockCache, DEFAULT_BLOCK_CACHE, MAX_BLOCK_CACHE, type Stats } from './block-cache.js';
import { DeadlineQueue, type Deadline } from './deadline.js';
import { IoredisTransport, type IoredisClient } from './ioredis-transport.js';
import { NodeRedisTransport, isNodeRedis, type NodeRedisClient } from './node-redis.js';
import { SCRIPTS } from './scripts.js';
import type { Transport } from './transport.js';
import { argumentError, checkBoolean, checkChoice, checkKeys, checkMs, integerIn, show } from './validate.js';

/**
 * What a Limiter takes: an ioredis `Redis` or `Cluster` (ioredis 5 and 6), a
 * node-redis client or cluster (`createClient()`, `createCluster()`, redis 5
 * and 6), or a Transport of your own.
 */
export type RedisClient = IoredisClient | NodeRedisClient | Transport;

/** `raise` (default): throw XcloakUnavailableError; `allow`: fail open; `deny`: fail closed. Only outages and timeouts. */
export type ErrorPolicy = 'raise' | 'allow' | 'deny';
/** `auto` (default): the command, the script where the server lacks it; `always`: the script; `never`: the command only. */
export type Fallback = 'auto' | 'always' | 'never';

/** The time source of a limiter: for tests and replays (calls then send NOW from it). */
export interface Clock {
  /** Unix time in milliseconds. */
  now(): number;
  /** Resolves after `ms`; rejects when `signal` aborts. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

export interface DurableOptions {
  /** Replicas that must hold an admission (`WAIT replicas timeout`). */
  readonly replicas: number;
  /** WAIT's timeout, in milliseconds. */
  readonly timeout: number;
}

export interface LimiterOptions {
  /** Put before every key (default ''). */
  readonly prefix?: string;
  readonly fallback?: Fallback;
  /** How long a node served by the script goes before the command is tried again, in ms (default 60 000). */
  readonly probeInterval?: number;
  /** What an outage or a timeout gives: `raise` (default), `allow` (fail open) or `deny` (fail closed). Never applied to a bad argument. */
  readonly onError?: ErrorPolicy;
  /**
   * PEEK may be read from a replica where the client reads from replicas
   * (ioredis `scaleReads`, node-redis `useReplicas`). Default false: every
   * call goes to the key's primary.
   */
  readonly replicaReads?: boolean;
  /** Per call, in ms (default 1000), whatever the client's own socket settings. */
  readonly timeout?: number;
  /** An admission counts once this many replicas hold it (docs/clients.md, Durable mode). */
  readonly durable?: DurableOptions;
  /** With a clock, every call sends NOW from it and acquire sleeps through it. */
  readonly clock?: Clock;
  /** Uniform in [0, 1): acquire's jitter (default Math.random). */
  readonly random?: () => number;
  /** acquire's jitter: up to this fraction of the retry-after is added (default 0.1). */
  readonly jitterFraction?: number;
  /**
   * The block cache's capacity, in keys (default 10 000; 0 turns it off): a
   * key the server rejected is answered locally, rejected (`via: 'cache'`),
   * with no call, until its retry-after has passed (docs/clients.md, Block
   * cache). An integer from 0 to 1 000 000.
   */
  readonly blockCache?: number;
}

const LIMITER_OPTIONS = ['prefix', 'fallback', 'probeInterval', 'onError', 'replicaReads', 'timeout', 'durable', 'clock', 'random', 'jitterFraction', 'blockCache'];
const ALLOW_OPTIONS = ['cost', 'tiers', 'stamp', 'now'];
const PEEK_OPTIONS = ['cost', 'tiers', 'now', 'oldest'];
const REFUND_OPTIONS = ['cost'];
const ACQUIRE_OPTIONS = ['cost', 'tiers', 'maxWait', 'signal'];
const REQUEST_KEYS = ['key', 'window', 'limit', 'cost', 'tiers'];
const ALLOW_ALL_OPTIONS = ['now'];

function checkKey(key: unknown): void {
  if (typeof key !== 'string') throw argumentError(`key must be a string, got ${show(key)}`);
}

export interface AllowOptions {
  /** Units this request takes (default 1). */
  readonly cost?: number;
  /** Tiers after the positional `window limit`: `[window, limit]` pairs. */
  readonly tiers?: readonly TierSpec[];
  /** Ask for the admission's stamp (the handle `refund` takes). */
  readonly stamp?: boolean;
  /** Unix ms, for replays and tests (default: the limiter's clock, else the server's). */
  readonly now?: number;
}

export interface PeekOptions {
  readonly cost?: number;
  readonly tiers?: readonly TierSpec[];
  readonly now?: number;
  /** Also ask for the oldest entry live in the binding tier's window (`OLDEST`; `Decision.oldest`): where a moving window starts. */
  readonly oldest?: boolean;
}

export interface RefundOptions {
  /** Entries to remove at that stamp (default 1): the admission's cost. */
  readonly cost?: number;
}

export interface AcquireOptions {
  readonly cost?: number;
  readonly tiers?: readonly TierSpec[];
  /** The longest it waits, in ms. */
  readonly maxWait: number;
  /** Stops the wait (the promise rejects with the signal's reason). A call in flight is never abandoned. */
  readonly signal?: AbortSignal;
}

export interface AllowAllRequest {
  readonly key: string;
  readonly window: number;
  readonly limit: number;
  readonly cost?: number;
  readonly tiers?: readonly TierSpec[];
}

export interface AllowAllOptions {
  readonly now?: number;
}

interface NodeState {
  /** Served by the script since `since` (performance.now()). */
  script: boolean;
  since: number;
  /** Whether EVALSHA_RO exists there (Redis 7.0+); undefined until a peek asked. */
  readOnlyScripts: boolean | undefined;
}

type Kind = 'allow' | 'peek' | 'refund';

interface Sent {
  readonly reply: unknown;
  readonly via: Via;
}

const realClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) => sleepFor(ms, undefined, { signal }).then(() => undefined),
};

/**
 * Whether a reply to `command` may hold an integer near 2^53 (a window, a
 * retry or reset after it, or a stamp of a NOW that large): some client
 * decoders round those (see node-redis.ts). The arguments after the key are
 * windows, limits, costs and times; a limit or cost is at most 10^6.
 */
function nearMaxExact(command: string[]): boolean {
  for (let i = 2; i < command.length; i++) {
    const arg = command[i]!;
    // At least 2^52: more than 16 digits, or 16 digits from 4503599627370496 up.
    if (arg.length > 16 || (arg.length === 16 && arg >= '4503599627370496')) return true;
  }
  return false;
}

function transportOf(client: unknown): Transport {
  const c = client as any;
  if (c && typeof c.isCluster === 'boolean' && typeof c.sendCommand === 'function') return new IoredisTransport(c);
  if (isNodeRedis(c)) return new NodeRedisTransport(c);
  if (c && typeof c.send === 'function' && typeof c.nodeOf === 'function' && typeof c.wait === 'function') return c as Transport;
  throw argumentError(`client must be an ioredis Redis or Cluster, or a node-redis client or cluster, got ${show(client)}`);
}

/**
 * Exact sliding-window rate limiting on one Redis (standalone or cluster),
 * through XCLOAK.* where the server has the module and the bundled Lua script
 * where it doesn't.
 */
export class Limiter {
  readonly transport: Transport;
  readonly prefix: string;
  readonly fallback: Fallback;
  readonly probeInterval: number;
  readonly onError: ErrorPolicy;
  readonly replicaReads: boolean;
  readonly timeout: number;
  readonly durable: DurableOptions | undefined;
  readonly jitterFraction: number;
  private readonly clock: Clock;
  private readonly clockGiven: boolean;
  private readonly random: () => number;
  private readonly nodes = new Map<string, NodeState>();
  /** A standalone server is one node: no map lookup per call. */
  private readonly single: NodeState | undefined;
  /** Calls with the limiter's timeout; calls that also WAIT (durable) get the WAIT's timeout on top. */
  private readonly deadlines: DeadlineQueue;
  private readonly writeDeadlines: DeadlineQueue;
  /** Undefined when `blockCache` is 0. */
  private readonly cache: BlockCache | undefined;

  constructor(client: RedisClient, options: LimiterOptions = {}) {
    checkKeys('Limiter options', options, LIMITER_OPTIONS);
    this.transport = transportOf(client);
    if (options.prefix !== undefined && typeof options.prefix !== 'string') throw argumentError(`prefix must be a string, got ${show(options.prefix)}`);
    this.prefix = options.prefix ?? '';
    this.fallback = checkChoice('fallback', options.fallback, ['auto', 'always', 'never'], 'auto');
    this.onError = checkChoice('onError', options.onError, ['raise', 'allow', 'deny'], 'raise');
    checkBoolean('replicaReads', options.replicaReads);
    this.replicaReads = options.replicaReads === true;
    this.probeInterval = checkMs('probeInterval', options.probeInterval, 60_000);
    this.timeout = checkMs('timeout', options.timeout, 1000, 1);
    this.jitterFraction = options.jitterFraction ?? 0.1;
    if (typeof this.jitterFraction !== 'number' || !(this.jitterFraction >= 0 && this.jitterFraction <= 1)) {
      throw argumentError(`jitterFraction must be a number from 0 to 1, got ${show(this.jitterFraction)}`);
    }
    if (options.clock !== undefined && (typeof options.clock?.now !== 'function' || typeof options.clock?.sleep !== 'function')) {
      throw argumentError('clock must be an object with now() and sleep(ms, signal)');
    }
    if (options.random !== undefined && typeof options.random !== 'function') throw argumentError(`random must be a function, got ${show(options.random)}`);
    if (options.durable) {
      checkKeys('durable', options.durable, ['replicas', 'timeout']);
      const { replicas, timeout } = options.durable;
      if (!Number.isInteger(replicas) || replicas < 1) throw argumentError(`durable.replicas must be an integer of at least 1, got ${show(replicas)}`);
      if (timeout === undefined) throw argumentError('durable.timeout must be a number of milliseconds of at least 0, got undefined');
      checkMs('durable.timeout', timeout, 0, 0);
      this.durable = { replicas, timeout };
    }
    this.deadlines = new DeadlineQueue(this.timeout);
    this.writeDeadlines = this.durable ? new DeadlineQueue(this.timeout + this.durable.timeout) : this.deadlines;
    this.single = this.transport.cluster ? undefined : { script: false, since: 0, readOnlyScripts: undefined };
    const capacity = options.blockCache === undefined ? DEFAULT_BLOCK_CACHE : integerIn('blockCache', options.blockCache, 0, MAX_BLOCK_CACHE, ' (entries)');
    this.cache = capacity > 0 ? new BlockCache(capacity) : undefined;
    this.clockGiven = options.clock !== undefined;
    this.clock = options.clock ?? realClock;
    this.random = options.random ?? Math.random;
  }

  /** What the block cache saved: the calls it answered, and the keys it holds now (zeros when it is off). */
  get stats(): Stats {
    return this.cache ? this.cache.stats : { cacheHits: 0, cacheEntries: 0 };
  }

  /** One request against `key`: at most `limit` per `window` ms (and each tier's), `cost` units. */
  allow(key: string, window: number, limit: number, options: AllowOptions = {}): Promise<Decision> {
    let spec: CallSpec;
    let command: string[];
    try {
      checkKey(key);
      checkKeys('allow options', options, ALLOW_OPTIONS);
      spec = this.spec(key, window, limit, options.cost, options.tiers, options.now, options.stamp);
      command = allowCommand(spec);
    } catch (error) {
      return Promise.reject(error);
    }
    // The block cache: a call with NOW (explicit, or the limiter's clock) never meets it.
    let sentAt: number | undefined;
    if (this.cache !== undefined && spec.now === undefined) {
      const cached = this.cache.lookup(spec);
      if (cached !== undefined) return Promise.resolve(cached);
      sentAt = this.cache.now(); // before sending: a cached deadline can only be early
    }
    if (this.durable) {
      const decided = this.decide(spec, this.allowOnce(spec, command, options.stamp === true));
      return sentAt === undefined ? decided : decided.then((d) => this.remember(spec, sentAt, d));
    }
    return this.decideNow('allow', spec, command, this.deadlines, sentAt);
  }

  /** What `allow` would decide now; records nothing. Goes to a replica where the client reads from replicas. */
  peek(key: string, window: number, limit: number, options: PeekOptions = {}): Promise<Decision> {
    let spec: CallSpec;
    let command: string[];
    try {
      checkKey(key);
      checkKeys('peek options', options, PEEK_OPTIONS);
      spec = { ...this.spec(key, window, limit, options.cost, options.tiers, options.now, false), oldest: options.oldest === true };
      command = peekCommand(spec);
    } catch (error) {
      return Promise.reject(error);
    }
    return this.decideNow('peek', spec, command, this.deadlines);
  }

  /** Removes up to `cost` entries of the admission `stamp`; resolves with how many it removed. Outages throw, whatever the policy. */
  async refund(key: string, stamp: number, options: RefundOptions = {}): Promise<number> {
    checkKey(key);
    checkKeys('refund options', options, REFUND_OPTIONS);
    const fullKey = this.prefix + key;
    const command = refundCommand(fullKey, stamp, options.cost);
    this.cache?.forget(fullKey); // before sending: the window may open now
    try {
      return await this.writeDeadlines.run(async (deadline) => {
        const { reply } = await this.exec('refund', command, deadline);
        const removed = Number(reply);
        if (this.durable) await this.replicate(fullKey, deadline, nearMaxExact(command));
        return removed;
      });
    } catch (error) {
      throw toXcloakError(error);
    }
  }

  /** Deletes the window (`DEL key`); resolves with whether there was one. Outages throw, whatever the policy. */
  async reset(key: string): Promise<boolean> {
    checkKey(key);
    const fullKey = this.prefix + key;
    this.cache?.forget(fullKey);
    return Number(await this.command(['DEL', fullKey])) > 0;
  }

  /**
   * Waits until admitted, sleeping the server's retry-after (plus jitter),
   * never past `maxWait`; resolves with the last Decision (rejected when the
   * deadline came first or the request can never fit).
   */
  async acquire(key: string, window: number, limit: number, options: AcquireOptions): Promise<Decision> {
    checkKeys('acquire options', options, ACQUIRE_OPTIONS);
    if (options?.maxWait === undefined) throw argumentError('acquire needs maxWait (milliseconds)');
    const maxWait = checkMs('maxWait', options.maxWait, 0);
    const { signal } = options;
    const deadline = this.clock.now() + maxWait;
    for (;;) {
      signal?.throwIfAborted();
      const now = this.clock.now();
      let decision: Decision;
      try {
        decision = await this.allow(key, window, limit, {
          cost: options.cost,
          tiers: options.tiers,
          ...(this.clockGiven ? { now } : {}),
        });
      } catch (error) {
        // Aborted while the call was out: the caller's cancellation, not an outage.
        if (signal?.aborted && error instanceof XcloakUnavailableError) throw signal.reason;
        throw error;
      }
      // An admission that came back is returned even if aborted meanwhile; a
      // decision of the error policy is not: the abort is no outage.
      if (signal?.aborted && decision.via === 'error') throw signal.reason;
      const step = acquireStep(decision, now, deadline, this.jitterFraction, this.random);
      if (step.done) return decision;
      try {
        await this.clock.sleep(step.sleep, signal);
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        throw error;
      }
    }
  }

  /**
   * All or nothing over several keys: each request admitted in order with
   * STAMP; on a rejection the earlier ones are refunded by their stamps and
   * the later ones are not sent.
   */
  async allowAll(requests: readonly AllowAllRequest[], options: AllowAllOptions = {}): Promise<MultiDecision> {
    if (!Array.isArray(requests) || requests.length === 0) throw argumentError('allowAll needs an array of at least one request');
    checkKeys('allowAll options', options, ALLOW_ALL_OPTIONS);
    requests.forEach((r, i) => {
      checkKeys(`allowAll requests[${i}]`, r, REQUEST_KEYS);
      checkKey(r.key);
    });
    const now = options.now ?? (this.clockGiven ? this.clock.now() : undefined);
    const specs = requests.map((r) => this.spec(r.key, r.window, r.limit, r.cost, r.tiers, now, true));
    specs.forEach((spec) => allowCommand(spec)); // refuses a bad window before anything is sent
    const decisions: Decision[] = [];
    const cache = now === undefined ? this.cache : undefined;
    for (let j = 0; j < specs.length; j++) {
      // A request the block cache rejects is rejected at j as the server would: no call.
      const cached = cache?.lookup(specs[j]!);
      if (cached !== undefined) {
        decisions.push(cached);
        await this.refundAll(specs, decisions.slice(0, j));
        return multiDecision(decisions, j);
      }
      const sentAt = cache?.now();
      let decision: Decision;
      try {
        decision = await this.allowOnce(specs[j]!);
        if (sentAt !== undefined) cache!.record(specs[j]!, sentAt, decision);
      } catch (error) {
        await this.refundAll(specs, decisions);
        const failure = toXcloakError(error);
        if (!(failure instanceof XcloakUnavailableError) || this.onError === 'raise') throw failure;
        const allowed = this.onError === 'allow';
        const sent = [...decisions, errorDecision(specs[j]!, allowed, failure.cause)];
        return { ...multiDecision(sent, allowed ? null : j), allowed, bindingIndex: j, binding: sent[j]!, retryAfter: 0, via: 'error', error: failure.cause };
      }
      decisions.push(decision);
      if (!decision.allowed) {
        await this.refundAll(specs, decisions.slice(0, j));
        return multiDecision(decisions, j);
      }
    }
    return multiDecision(decisions, null);
  }

  /** The HTTP header fields of a decision (docs/clients.md, Headers). */
  headers(decision: Decision, options?: HeaderOptions): Record<string, string>;
  headers(decision: MultiDecision, options?: MultiHeaderOptions): Record<string, string>;
  headers(decision: Decision | MultiDecision, options?: HeaderOptions | MultiHeaderOptions): Record<string, string> {
    return headerFields(decision as Decision, options as HeaderOptions);
  }

  /** Who serves `key`'s node now: the command or the script (undefined before the first call there). */
  viaOf(key: string): Via | undefined {
    const state = this.single ?? this.nodes.get(this.transport.nodeOf(this.prefix + key));
    if (this.fallback === 'always') return 'script';
    return state ? (state.script ? 'script' : 'command') : undefined;
  }

  /**
   * @internal A plain command on the node of `argv[1]` (a full key: no prefix
   * added), under the limiter's timeout; outages throw. The
   * rate-limiter-flexible adapter keeps its block keys with it.
   */
  async command(argv: string[], readonly = false): Promise<unknown> {
    try {
      return await this.deadlines.run((deadline) => this.transport.send(argv, { key: argv[1] ?? '', readonly: readonly && this.replicaReads, deadline }));
    } catch (error) {
      throw toXcloakError(error);
    }
  }

  // ---- internals

  private spec(key: string, window: number, limit: number, cost?: number, tiers?: readonly TierSpec[], now?: number, stamp?: boolean): CallSpec {
    const at = now ?? (this.clockGiven ? this.clock.now() : undefined);
    // Durable mode always sends STAMP (the deny path refunds by it); allowOnce shows it only if asked.
    const wantStamp = stamp === true || this.durable !== undefined;
    return { key: this.prefix + key, window, limit, cost, tiers, now: at, stamp: wantStamp };
  }

  /**
   * ALLOW once, with its deadline and (durable) its WAIT after an admitting
   * reply; rejects with what failed, no policy. `showStamp`: the decision keeps
   * the stamp (durable mode sends STAMP for its own refund).
   */
  private allowOnce(spec: CallSpec, command: string[] = allowCommand(spec), showStamp = true): Promise<Decision> {
    return this.writeDeadlines.run((deadline) =>
      this.exec('allow', command, deadline).then((sent) => {
        const decision = decisionFromReply(sent.reply, spec, sent.via);
        const shown = showStamp || decision.stamp === null ? decision : { ...decision, stamp: null };
        if (!this.durable || !decision.allowed) return shown;
        return this.replicate(spec.key, deadline, nearMaxExact(command)).then(
          () => shown,
          async (error) => {
            // Under deny, a request turned away consumes nothing (best effort).
            if (this.onError === 'deny' && decision.stamp !== null) await this.refundBestEffort(spec.key, decision.stamp, spec.cost);
            throw error;
          },
        );
      }),
    );
  }

  /**
   * One ALLOW (not durable) or PEEK, the hot path: one promise around the
   * transport's, the deadline from the limiter's queue, the policy on failure.
   */
  private decideNow(kind: 'allow' | 'peek', spec: CallSpec, command: string[], queue: DeadlineQueue, sentAt?: number): Promise<Decision> {
    return new Promise<Decision>((resolve, reject) => {
      const fail = (error: unknown) => {
        const failure = toXcloakError(error);
        if (!(failure instanceof XcloakUnavailableError) || this.onError === 'raise') reject(failure);
        else resolve(errorDecision(spec, this.onError === 'allow', failure.cause));
      };
      const deadline = queue.start(fail);
      this.exec(kind, command, deadline).then(
        (sent) => {
          if (!queue.settle(deadline)) return;
          try {
            const decision = decisionFromReply(sent.reply, spec, sent.via);
            if (sentAt !== undefined) this.cache!.record(spec, sentAt, decision);
            resolve(decision);
          } catch (error) {
            reject(error);
          }
        },
        (error) => {
          if (queue.settle(deadline)) fail(error);
        },
      );
    });
  }

  /** Records a server decision in the block cache; returns it. */
  private remember(spec: CallSpec, sentAt: number, decision: Decision): Decision {
    this.cache!.record(spec, sentAt, decision);
    return decision;
  }

  /** Applies the error policy to an outage; a refusal by the server is always thrown. */
  private decide(spec: CallSpec, decided: Promise<Decision>): Promise<Decision> {
    return decided.then(undefined, (error) => {
      const failure = toXcloakError(error);
      if (!(failure instanceof XcloakUnavailableError) || this.onError === 'raise') throw failure;
      return errorDecision(spec, this.onError === 'allow', failure.cause);
    });
  }

  private async replicate(key: string, deadline: Deadline, exactIntegers = false): Promise<void> {
    const { replicas, timeout } = this.durable!;
    const acknowledged = await this.transport.wait(key, replicas, timeout, deadline, exactIntegers);
    if (acknowledged < replicas) throw new XcloakUnavailableError(new XcloakNotReplicatedError(replicas, acknowledged));
  }

  private async refundAll(specs: readonly CallSpec[], admitted: readonly Decision[]): Promise<void> {
    for (let i = 0; i < admitted.length; i++) {
      const stamp = admitted[i]!.stamp;
      if (stamp !== null) await this.refundBestEffort(specs[i]!.key, stamp, specs[i]!.cost);
    }
  }

  /** A refund whose failure leaves the admission in place: the window stays conservative, never generous. */
  private async refundBestEffort(fullKey: string, stamp: number, cost?: number): Promise<void> {
    this.cache?.forget(fullKey);
    try {
      await this.deadlines.run((deadline) => this.exec('refund', refundCommand(fullKey, stamp, cost), deadline));
    } catch {
      // best effort (docs/clients.md, allow_all)
    }
  }

  private state(node: string): NodeState {
    let state = this.nodes.get(node);
    if (!state) {
      state = { script: false, since: 0, readOnlyScripts: undefined };
      this.nodes.set(node, state);
    }
    return state;
  }

  /** Sends `command` (XCLOAK.*) or, where the node lacks the module, its script; says which answered. */
  private exec(kind: Kind, command: string[], deadline: Deadline): Promise<Sent> {
    const key = command[1]!;
    const node = this.single ?? this.state(this.transport.nodeOf(key));
    if (this.fallback === 'always') return this.viaScript(kind, command, node, deadline);
    if (node.script && this.fallback === 'auto' && performance.now() - node.since < this.probeInterval) {
      return this.viaScript(kind, command, node, deadline);
    }
    return this.transport.send(command, { key, readonly: kind === 'peek' && this.replicaReads, deadline, exactIntegers: nearMaxExact(command) }).then(
      (reply): Sent => {
        node.script = false;
        return { reply, via: 'command' };
      },
      (error) => {
        if (this.fallback === 'never' || !isUnknownCommand(error)) throw error;
        // Nothing was applied: this node is served by the script from now on
        // (until the next probe).
        node.script = true;
        node.since = performance.now();
        return this.viaScript(kind, command, node, deadline);
      },
    );
  }

  private viaScript(kind: Kind, command: string[], node: NodeState, deadline: Deadline): Promise<Sent> {
    return this.script(kind, command, node, deadline).then((reply): Sent => ({ reply, via: 'script' }));
  }

  private async script(kind: Kind, command: string[], node: NodeState, deadline: Deadline): Promise<unknown> {
    const script = SCRIPTS[kind];
    const key = command[1]!;
    const args = command.slice(2);
    const readonly = kind === 'peek';
    const ro = readonly && node.readOnlyScripts !== false;
    const exactIntegers = nearMaxExact(command);
    const send = (argv: string[]) => this.transport.send(argv, { key, readonly: readonly && this.replicaReads, deadline, exactIntegers });
    try {
      const reply = await send([ro ? 'EVALSHA_RO' : 'EVALSHA', script.sha, '1', key, ...args]);
      if (ro) node.readOnlyScripts = true;
      return reply;
    } catch (error) {
      if (ro && isUnknownCommand(error)) {
        node.readOnlyScripts = false; // before Redis 7.0
        return this.script(kind, command, node, deadline);
      }
      // Not cached there (a restart, SCRIPT FLUSH, a new node): nothing ran.
      // EVAL of the text runs it and caches it, once.
      if (isNoScript(error)) return send([ro ? 'EVAL_RO' : 'EVAL', script.text, '1', key, ...args]);
      throw error;
    }
  }
}
