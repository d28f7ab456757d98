// rate-limiter-flexible (v11): a limiter on RateLimiterCompatibleAbstract,
// so RateLimiterUnion, RLWrapperTimeouts, insuranceLimiter, RateLimiterQueue
// and the code written against RateLimiterRedis take an exact sliding window:
//
//   import { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';
//   const rl = new RateLimiterXcloak({ limiter, points: 100, duration: 60 });
//   try { const res = await rl.consume(ip); } catch (res) { /* 429, res.msBeforeNext */ }
//
// What each method sends, and where an exact log differs from a counter:
// - consume(key, points) -> XCLOAK.ALLOW key window points-limit COST points STAMP.
//   Resolves when admitted; rejects with a RateLimiterRes when not, and a
//   rejected request records nothing (a counter store counts it: consumedPoints
//   above `points` never happens here). msBeforeNext is reset_after when
//   admitted (until the window is empty), retry_after when rejected (until these
//   points fit), -1 when they can never fit (points above the limit). The
//   result carries `stamp` and the full `decision`.
// - get(key) -> XCLOAK.PEEK (records nothing; null for an empty window).
// - reward(key, points, { stamp }) -> XCLOAK.REFUND key stamp COST points. An
//   exact window only gives back a known admission: `stamp` (the consume
//   result's) is required, and reward without it throws. Counters subtract
//   from a total; refunding "some entry" would make the window wrong.
// - penalty(key, points) -> records up to `points` units, as many as fit
//   (ALLOW with COST, then with the room left): a log holds admissions only,
//   so it cannot go above the limit as a counter can. The key is then limited
//   until those entries leave the window.
// - block(key, secDuration) and the blockDuration option -> a separate key
//   `<key>:block` with PX (0: forever); consume and get check it first when
//   blocks are on (blockDuration > 0, or checkBlocks: true), one round trip
//   more per call. A rejection with blockDuration > 0 sets it (NX: the first
//   rejection, as rate-limiter-flexible blocks on the first crossing) for
//   max(blockDuration, the window's retry-after): on an exact window a block
//   that ended before the request fits would end in a rejection and a new
//   block, so a block lasts until the request fits at the earliest, and
//   msBeforeNext reports that wait.
// - set(key, points, secDuration) -> DEL, then penalty(points): not atomic, and
//   secDuration must be 0 or the limiter's duration (a window has one length).
// - delete(key) -> DEL key and its block key.
// - execEvenly is not supported (use Limiter.acquire, which waits the server's
//   retry-after).
// Outages: with onError 'raise' (the Limiter's default) an outage rejects
// with XcloakUnavailableError, which rate-limiter-flexible's insuranceLimiter
// and RLWrapperTimeouts act on; 'allow' resolves, 'deny' rejects with a
// RateLimiterRes.

import { RateLimiterCompatibleAbstract, RateLimiterRes } from 'rate-limiter-flexible';
import type { Decision, TierSpec } from './decision.js';
import { XcloakUnavailableError } from './errors.js';
import type { Limiter } from './limiter.js';
import { argumentError, checkBoolean, checkKeys, checkLimit, checkTiers, checkWindow, show } from './validate.js';

const OPTIONS = ['limiter', 'points', 'duration', 'tiers', 'keyPrefix', 'blockDuration', 'checkBlocks', 'insuranceLimiter', 'execEvenly'];

export interface RateLimiterXcloakOptions {
  readonly limiter: Limiter;
  /** The limit (default 4, as rate-limiter-flexible). */
  readonly points?: number;
  /** The window in seconds (default 1); must be a whole number of milliseconds. */
  readonly duration?: number;
  /** More tiers after (points, duration): `[windowMs, limit]` pairs. */
  readonly tiers?: readonly TierSpec[];
  /** Default 'rlflx', as rate-limiter-flexible; keys are `<keyPrefix>:<key>`. */
  readonly keyPrefix?: string;
  /**
   * Seconds a key stays blocked after a rejection (0: no block). On an exact
   * window the block lasts at least until the rejected request would fit:
   * max(blockDuration, the window's retry-after), which msBeforeNext reports.
   */
  readonly blockDuration?: number;
  /** Check block keys in consume/get even with blockDuration 0 (for block()). Default: blockDuration > 0. */
  readonly checkBlocks?: boolean;
  /** Answers instead when this limiter fails (an outage, a timeout): rate-limiter-flexible's insurance. */
  readonly insuranceLimiter?: InsuranceLimiter;
  /** Only false: spreading requests evenly is Limiter.acquire's job. */
  readonly execEvenly?: false;
}

/** Any rate-limiter-flexible limiter. */
export interface InsuranceLimiter {
  consume(key: string | number, points?: number, options?: Record<string, unknown>): Promise<RateLimiterRes>;
  penalty(key: string | number, points?: number, options?: Record<string, unknown>): Promise<RateLimiterRes>;
  reward(key: string | number, points?: number, options?: Record<string, unknown>): Promise<RateLimiterRes>;
  get(key: string | number, options?: Record<string, unknown>): Promise<RateLimiterRes | null>;
  set(key: string | number, points: number, secDuration: number, options?: Record<string, unknown>): Promise<RateLimiterRes>;
  block(key: string | number, secDuration: number, options?: Record<string, unknown>): Promise<RateLimiterRes>;
  delete(key: string | number, options?: Record<string, unknown>): Promise<boolean>;
  blockDuration: number;
  execEvenly: boolean;
}

/** A RateLimiterRes with the admission's stamp (for reward) and the Decision behind it. */
export type XcloakRes = RateLimiterRes & { readonly stamp: number | null; readonly decision: Decision | null };

function res(remaining: number, msBeforeNext: number, consumed: number, first: boolean, decision: Decision | null): XcloakRes {
  const out = new RateLimiterRes(remaining, msBeforeNext, consumed, first) as XcloakRes;
  Object.defineProperties(out, {
    stamp: { value: decision?.stamp ?? null, enumerable: false },
    decision: { value: decision, enumerable: false },
  });
  return out;
}

/** The least room left over every tier: what one more admission can take. */
function room(d: Decision): number {
  return d.tiers.length > 0 ? Math.min(...d.tiers.map((t) => t.remaining)) : d.remaining;
}

function checkBlockSeconds(name: string, value: unknown): void {
  if (value === undefined) return;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || value * 1000 > Number.MAX_SAFE_INTEGER) {
    throw argumentError(`${name} must be a number of seconds from 0 to ${Number.MAX_SAFE_INTEGER / 1000}, got ${show(value)}`);
  }
}

export class RateLimiterXcloak extends RateLimiterCompatibleAbstract {
  readonly limiter: Limiter;
  readonly points: number;
  readonly duration: number;
  readonly tiers: readonly TierSpec[] | undefined;
  private readonly prefix: string;
  private blockSeconds: number;
  private readonly checkBlocksOption: boolean | undefined;
  readonly insuranceLimiter: InsuranceLimiter | undefined;
  // rate-limiter-flexible declares these as properties; they are accessors
  // here (defined on the prototype below), as in its own limiters.
  declare readonly keyPrefix: string;
  declare blockDuration: number;
  declare execEvenly: boolean;

  /** Checks every option now, with the server's ranges: a bad one throws here, never at a consume. */
  constructor(options: RateLimiterXcloakOptions) {
    super();
    checkKeys('RateLimiterXcloak options', options, OPTIONS);
    if (typeof options?.limiter?.allow !== 'function') throw argumentError(`limiter must be an xcloak Limiter, got ${show(options?.limiter)}`);
    this.limiter = options.limiter;
    this.points = checkLimit('points', options.points ?? 4);
    this.duration = options.duration ?? 1;
    if (typeof this.duration !== 'number' || !(Math.abs(this.duration * 1000 - Math.round(this.duration * 1000)) < 1e-6)) {
      throw argumentError(`duration must be a number of seconds in whole milliseconds (0.001 to ${Number.MAX_SAFE_INTEGER / 1000}), got ${show(options.duration)}`);
    }
    checkWindow('duration in milliseconds', Math.round(this.duration * 1000));
    checkTiers('tiers', options.tiers);
    this.tiers = options.tiers;
    if (options.keyPrefix !== undefined && typeof options.keyPrefix !== 'string') throw argumentError(`keyPrefix must be a string, got ${show(options.keyPrefix)}`);
    this.prefix = options.keyPrefix ?? 'rlflx';
    checkBlockSeconds('blockDuration', options.blockDuration);
    this.blockSeconds = options.blockDuration ?? 0;
    checkBoolean('checkBlocks', options.checkBlocks);
    if (options.execEvenly !== undefined && options.execEvenly !== false) {
      throw argumentError('execEvenly is not supported: use Limiter.acquire, which waits the server retry-after');
    }
    if (options.insuranceLimiter !== undefined && typeof options.insuranceLimiter?.consume !== 'function') {
      throw argumentError(`insuranceLimiter must be a rate-limiter-flexible limiter, got ${show(options.insuranceLimiter)}`);
    }
    this.checkBlocksOption = options.checkBlocks;
    this.insuranceLimiter = options.insuranceLimiter;
    if (this.insuranceLimiter) {
      this.insuranceLimiter.blockDuration = this.blockSeconds;
      this.insuranceLimiter.execEvenly = false;
    }
  }

  /** `<keyPrefix>:<key>` (or the key itself with an empty prefix). */
  getKey(key: string | number): string {
    return this.prefix.length > 0 ? `${this.prefix}:${key}` : String(key);
  }

  private get window(): number {
    return Math.round(this.duration * 1000);
  }

  private get blocks(): boolean {
    return this.checkBlocksOption ?? this.blockSeconds > 0;
  }

  /** The rest of the block on `key` in ms (0: none, -1: forever). */
  private async blockLeft(rlKey: string): Promise<number> {
    if (!this.blocks) return 0;
    const ttl = Number(await this.limiter.command(['PTTL', `${rlKey}:block`], true));
    if (ttl === -2) return 0;
    return ttl === -1 ? -1 : ttl;
  }

  /** Runs `work`; on a failure that is no RateLimiterRes, the insurance limiter's `method` answers instead. */
  private async insured<T>(method: keyof InsuranceLimiter, args: unknown[], work: () => Promise<T>): Promise<T> {
    try {
      return await work();
    } catch (error) {
      if (error instanceof RateLimiterRes || !this.insuranceLimiter || !(error instanceof XcloakUnavailableError)) throw error;
      return (this.insuranceLimiter[method] as (...a: unknown[]) => Promise<T>)(...args);
    }
  }

  private fromDecision(d: Decision, cost: number): XcloakRes {
    const consumed = d.limit - d.remaining;
    if (d.via === 'error') return res(d.allowed ? this.points : 0, 0, 0, false, d);
    if (d.allowed) return res(d.remaining, d.resetAfter, consumed, consumed === cost, d);
    return res(d.remaining, d.costExceedsLimit ? -1 : d.retryAfter, consumed, false, d);
  }

  override consume(key: string | number, pointsToConsume = 1, options: Record<string, unknown> = {}): Promise<RateLimiterRes> {
    return this.insured('consume', [key, pointsToConsume, options], async () => {
      const rlKey = this.getKey(key);
      const blocked = await this.blockLeft(rlKey);
      if (blocked !== 0) throw res(0, blocked, this.points + 1, false, null);
      const d = await this.limiter.allow(rlKey, this.window, this.points, { cost: pointsToConsume, tiers: this.tiers, stamp: true });
      const out = this.fromDecision(d, pointsToConsume);
      if (d.allowed) return out;
      if (this.blockSeconds > 0 && d.via !== 'error' && !d.costExceedsLimit) {
        // The block lasts until the request would fit at the earliest: a
        // block shorter than the window's retry-after would end into a
        // rejection (and a new block) on an exact window.
        const ms = Math.max(Math.round(this.blockSeconds * 1000), d.retryAfter);
        if ((await this.limiter.command(['SET', `${rlKey}:block`, '1', 'PX', String(ms), 'NX'])) === 'OK') {
          throw res(out.remainingPoints, ms, out.consumedPoints, false, d);
        }
      }
      throw out;
    });
  }

  override penalty(key: string | number, points = 1, options: Record<string, unknown> = {}): Promise<RateLimiterRes> {
    return this.insured('penalty', [key, points, options], () => this.fill(this.getKey(key), points));
  }

  /** Records up to `points` units, as many as fit now; resolves with the window after. */
  private async fill(rlKey: string, points: number): Promise<XcloakRes> {
    let want = Math.min(points, this.points);
    let last: Decision | undefined;
    // A rejected ALLOW applies nothing, so asking again with the room left is safe.
    for (let attempt = 0; attempt < 4 && want > 0; attempt++) {
      last = await this.limiter.allow(rlKey, this.window, this.points, { cost: want, tiers: this.tiers });
      if (last.allowed || last.via === 'error') break;
      // A cached rejection says no room for this cost, not how much there is: ask.
      const known = last.via === 'cache' ? await this.limiter.peek(rlKey, this.window, this.points, { cost: want, tiers: this.tiers }) : last;
      if (!known.allowed) want = Math.min(want, room(known));
    }
    if (!last || want === 0) last = await this.limiter.peek(rlKey, this.window, this.points, { tiers: this.tiers });
    return res(last.allowed ? last.remaining : room(last), last.resetAfter, last.limit - last.remaining, false, last);
  }

  override reward(key: string | number, points = 1, options: Record<string, unknown> = {}): Promise<RateLimiterRes> {
    const stamp = options.stamp;
    if (typeof stamp !== 'number') {
      return Promise.reject(
        argumentError(
          "reward needs options.stamp, the consume result's stamp: an exact window refunds a known admission, not some entry",
        ),
      );
    }
    return this.insured('reward', [key, points, options], async () => {
      const rlKey = this.getKey(key);
      const removed = await this.limiter.refund(rlKey, stamp, { cost: points });
      const d = await this.limiter.peek(rlKey, this.window, this.points, { tiers: this.tiers });
      const out = res(d.remaining, d.resetAfter, d.limit - d.remaining, false, d);
      Object.defineProperty(out, 'removed', { value: removed, enumerable: false });
      return out;
    });
  }

  override get(key: string | number, options: Record<string, unknown> = {}): Promise<RateLimiterRes | null> {
    return this.insured('get', [key, options], async () => {
      const rlKey = this.getKey(key);
      const blocked = await this.blockLeft(rlKey);
      if (blocked !== 0) return res(0, blocked, this.points + 1, false, null);
      const d = await this.limiter.peek(rlKey, this.window, this.points, { tiers: this.tiers });
      if (d.via !== 'error' && d.remaining === d.limit && d.resetAfter === 0 && d.tiers.every((t) => t.resetAfter === 0)) return null;
      return res(d.remaining, d.resetAfter, d.limit - d.remaining, false, d);
    });
  }

  override set(key: string | number, points: number, secDuration: number, options: Record<string, unknown> = {}): Promise<RateLimiterRes> {
    if (secDuration && Math.round(secDuration * 1000) !== this.window) {
      return Promise.reject(argumentError(`set: secDuration must be 0 or the limiter's duration (${this.duration} s): a window has one length`));
    }
    return this.insured('set', [key, points, secDuration, options], async () => {
      const rlKey = this.getKey(key);
      await this.limiter.reset(rlKey);
      return this.fill(rlKey, points);
    });
  }

  override block(key: string | number, secDuration: number, options: Record<string, unknown> = {}): Promise<RateLimiterRes> {
    if (!this.blocks) {
      return Promise.reject(argumentError('block needs blockDuration > 0 or checkBlocks: true, so that consume checks the block key'));
    }
    return this.insured('block', [key, secDuration, options], async () => {
      const blockKey = `${this.getKey(key)}:block`;
      const ms = Math.round(secDuration * 1000);
      await this.limiter.command(ms > 0 ? ['SET', blockKey, '1', 'PX', String(ms)] : ['SET', blockKey, '1']);
      return res(0, ms > 0 ? ms : -1, this.points + 1, false, null);
    });
  }

  override delete(key: string | number, options: Record<string, unknown> = {}): Promise<boolean> {
    return this.insured('delete', [key, options], async () => {
      const rlKey = this.getKey(key);
      const existed = await this.limiter.reset(rlKey);
      const blocked = Number(await this.limiter.command(['DEL', `${rlKey}:block`])) > 0;
      return existed || blocked;
    });
  }
}

Object.defineProperties(RateLimiterXcloak.prototype, {
  keyPrefix: {
    get(this: any): string {
      return this.prefix;
    },
  },
  blockDuration: {
    get(this: any): number {
      return this.blockSeconds;
    },
    set(this: any, value: number) {
      checkBlockSeconds('blockDuration', value);
      this.blockSeconds = value === undefined ? 0 : value;
    },
  },
  execEvenly: {
    get(): boolean {
      return false;
    },
    set(value: boolean) {
      if (value) throw argumentError('execEvenly is not supported: use Limiter.acquire, which waits the server retry-after');
    },
  },
});
