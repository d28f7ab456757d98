// express-rate-limit (v8): a Store that enforces an exact sliding window in
// the server.
//
//   import { rateLimit } from 'express-rate-limit';
//   import { XcloakStore } from 'xcloak/express-rate-limit';
//   app.use(rateLimit({ windowMs: 60_000, limit: 100, store: new XcloakStore({ limiter }) }));
//
// express-rate-limit calls increment(key) with no limit (it resolves the limit
// after the call), so the store takes windowMs and limit from init(options),
// or from its own options when express-rate-limit's `limit` is a function. The
// server decides: increment is one XCLOAK.ALLOW ... STAMP, and a rejected
// request is never recorded. Its totalHits is then limit + 1, so that
// express-rate-limit rejects it too.
//
// decrement(key) gets only the key, yet must refund exactly the request it
// belongs to (skipSuccessfulRequests / skipFailedRequests). express-rate-limit
// calls it from promise callbacks it attaches after `await increment(key)`,
// so the request's async context reaches it: increment enters an
// AsyncLocalStorage state holding the admission's stamp, decrement reads it
// back and sends XCLOAK.REFUND key stamp. A rejected request has no stamp:
// its decrement refunds nothing (a counter store would subtract the rejected
// hit it counted). A decrement called outside any increment's context (not
// express-rate-limit's own middleware) cannot be tied to a request: it does
// nothing and warns once, rather than refund some other request's entry.
//
// What differs from a counter store (rate-limit-redis, the MemoryStore):
// - a sliding window: resetTime is when the window is empty (admitted) or when
//   the request fits (rejected), not the end of a fixed window;
// - a rejection records nothing, and totalHits is then limit + 1, not a count
//   of the attempts;
// - decrement refunds that request's own admission, or nothing;
// - get(key) is a PEEK; resetAll is not provided (it would need a SCAN of every
//   node); resetKey is DEL.

import { AsyncLocalStorage } from 'node:async_hooks';
import type { XcloakError } from './errors.js';
import type { Limiter } from './limiter.js';
import { argumentError, checkKeys, checkLimit, checkWindow, show } from './validate.js';

export interface XcloakStoreOptions {
  readonly limiter: Limiter;
  /** Put before express-rate-limit's key (default `rl:http:`, the middleware's default keys). */
  readonly prefix?: string;
  /** The window, when express-rate-limit's is not to be used (must then agree with it). */
  readonly windowMs?: number;
  /** The limit: needed when express-rate-limit's `limit` is a function (which must return this number). */
  readonly limit?: number;
}

/** What increment leaves for decrement in the request's async context. */
interface Pending {
  readonly key: string;
  stamp: number | null;
  refunded: boolean;
}

/** The part of express-rate-limit's Options that init reads. */
export interface InitOptions {
  readonly windowMs?: number;
  readonly limit?: number | ((...args: any[]) => unknown);
}

export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

export class XcloakStore {
  readonly limiter: Limiter;
  readonly prefix: string;
  /** Keys are shared by every process using the same server (express-rate-limit's validations read this). */
  readonly localKeys = false;
  private windowMs: number | undefined;
  private limit: number | undefined;
  private readonly own: { windowMs?: number; limit?: number };
  private readonly context = new AsyncLocalStorage<Pending>();
  private warned = false;
  /** What init refused: the store then rejects every request (never fails open). */
  private refused: XcloakError | undefined;

  /** Checks its own options now (the limiter, and the window and limit when given). */
  constructor(options: XcloakStoreOptions) {
    checkKeys('XcloakStore options', options, ['limiter', 'prefix', 'windowMs', 'limit']);
    if (typeof options?.limiter?.allow !== 'function') throw argumentError(`limiter must be an xcloak Limiter, got ${show(options?.limiter)}`);
    if (options.prefix !== undefined && typeof options.prefix !== 'string') throw argumentError(`prefix must be a string, got ${show(options.prefix)}`);
    if (options.windowMs !== undefined) checkWindow('windowMs', options.windowMs);
    if (options.limit !== undefined) checkLimit('limit', options.limit);
    this.limiter = options.limiter;
    this.prefix = options.prefix ?? 'rl:http:';
    this.own = { windowMs: options.windowMs, limit: options.limit };
    this.windowMs = options.windowMs;
    this.limit = options.limit;
  }

  /**
   * Called by express-rate-limit with its options when `rateLimit()` is set
   * up: the window and the limit come from there, checked with the server's
   * ranges. A bad one throws. express-rate-limit catches what init throws and
   * only logs it, and would then meet a store error per request with
   * `passOnStoreError` (fail open), so the error is also thrown again outside
   * its catch (the app stops at startup, as on a bad Limiter), and until then
   * every increment rejects the request (fail closed).
   */
  init(options: InitOptions): void {
    try {
      this.configure(options);
    } catch (error) {
      this.refused = error as XcloakError;
      process.nextTick(() => {
        throw error;
      });
      throw error;
    }
  }

  private configure(options: InitOptions): void {
    const { windowMs, limit } = options ?? {};
    if (this.own.windowMs !== undefined && windowMs !== undefined && windowMs !== this.own.windowMs) {
      throw argumentError(`XcloakStore: its windowMs ${this.own.windowMs} differs from express-rate-limit's ${show(windowMs)}`);
    }
    if (this.own.limit !== undefined && typeof limit === 'number' && limit !== this.own.limit) {
      throw argumentError(`XcloakStore: its limit ${this.own.limit} differs from express-rate-limit's ${limit}`);
    }
    const window = this.own.windowMs ?? windowMs;
    if (window === undefined) throw argumentError('windowMs is required (express-rate-limit gives it to init)');
    checkWindow('windowMs', window);
    if (typeof limit === 'number') checkLimit('limit', limit);
    else if (this.own.limit === undefined) {
      throw argumentError("limit: express-rate-limit's limit is a function; give the store its own `limit` (the function must return it)");
    }
    this.windowMs = window;
    if (typeof limit === 'number') this.limit = limit;
  }

  private settings(): { windowMs: number; limit: number } {
    if (this.windowMs === undefined || this.limit === undefined) {
      throw argumentError('XcloakStore has no window or limit: pass it to rateLimit() (init) or to the store');
    }
    return { windowMs: this.windowMs, limit: this.limit };
  }

  /** One request: XCLOAK.ALLOW key windowMs limit DETAILS STAMP. */
  async increment(key: string): Promise<ClientRateLimitInfo> {
    // A configuration init refused: every request is rejected, never served unlimited.
    if (this.refused) return { totalHits: Number.MAX_SAFE_INTEGER, resetTime: undefined };
    const pending: Pending = { key, stamp: null, refunded: false };
    // Entered before the first await: the rest of express-rate-limit's
    // middleware, and the finish/close callbacks it attaches, run in it.
    this.context.enterWith(pending);
    const { windowMs, limit } = this.settings();
    const d = await this.limiter.allow(this.prefix + key, windowMs, limit, { stamp: true });
    const now = Date.now();
    if (d.via === 'error') {
      // The limiter's error policy answered an outage ('raise' threw already).
      return { totalHits: d.allowed ? 1 : limit + 1, resetTime: new Date(now + windowMs) };
    }
    pending.stamp = d.stamp;
    if (d.allowed) return { totalHits: Math.max(1, d.limit - d.remaining), resetTime: new Date(now + d.resetAfter) };
    return { totalHits: limit + 1, resetTime: new Date(now + (d.retryAfter >= 0 ? d.retryAfter : d.resetAfter)) };
  }

  /** Refunds exactly this request's own admission (by its stamp), or nothing if it was rejected. */
  async decrement(key: string): Promise<void> {
    const pending = this.context.getStore();
    if (!pending || pending.key !== key) {
      if (!this.warned) {
        this.warned = true;
        process.emitWarning(
          'XcloakStore.decrement was called outside the request that incremented the key: it cannot tell which admission to refund, so it refunds none',
          { code: 'XCLOAK_DECREMENT_WITHOUT_REQUEST' },
        );
      }
      return;
    }
    if (pending.stamp === null || pending.refunded) return;
    pending.refunded = true;
    await this.limiter.refund(this.prefix + key, pending.stamp);
  }

  /** DEL of the window. */
  async resetKey(key: string): Promise<void> {
    await this.limiter.reset(this.prefix + key);
  }

  /** A PEEK: what the window holds now; undefined for an empty window. */
  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    const { windowMs, limit } = this.settings();
    const d = await this.limiter.peek(this.prefix + key, windowMs, limit);
    if (d.via === 'error' || (d.remaining === d.limit && d.resetAfter === 0)) return undefined;
    return { totalHits: d.limit - d.remaining, resetTime: new Date(Date.now() + d.resetAfter) };
  }
}
