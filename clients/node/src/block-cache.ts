// The block cache (docs/clients.md, Block cache): after the server rejects a
// request with a retry-after, the same key, the same shape (window, limit,
// tiers) and a cost at least as large cannot be admitted before the local
// monotonic time the call was sent plus that retry-after. A later allow in
// that time is answered here, rejected, with no call. It never admits. A cost
// above a tier's limit (or not a whole number) is always sent: the server says
// it can never fit (or refuses it), not when to retry.
//
// Pure: no I/O; the monotonic clock (performance.now(), in ms) is injected.
// One entry per full key in a Map, whose insertion order is the LRU order
// (a hit deletes and sets its entry again; an insert past capacity evicts the
// first). The event loop runs each method to its end: nothing to lock.

import type { CallSpec, Decision, TierSpec, TierState } from './decision.js';

/** What the block cache saved: `Limiter.stats`. */
export interface Stats {
  /** Calls answered by the cache since the limiter was built (each one a round trip not made). */
  readonly cacheHits: number;
  /** Entries held now (expired ones not yet met included). */
  readonly cacheEntries: number;
}

/** The default capacity (entries), and the largest accepted. */
export const DEFAULT_BLOCK_CACHE = 10_000;
export const MAX_BLOCK_CACHE = 1_000_000;

/** One rejected key: the request's shape, its cost, and what the server said, as of `sentAt`. */
interface Entry {
  readonly window: number;
  readonly limit: number;
  /** The tiers after the positional pair, flat `[w1, l1, w2, l2, ...]`; null when none. */
  readonly tiers: readonly number[] | null;
  readonly cost: number;
  readonly sentAt: number;
  /** sentAt + the server's retry-after: never later than the true deadline. */
  readonly deadline: number;
  // The server's decision, what a cached answer repeats (aged).
  readonly decidedLimit: number;
  readonly decidedWindow: number;
  readonly tier: number;
  readonly resetAfter: number;
  /** The decision's tier states (null when the request had no tiers: no array held). */
  readonly tierStates: readonly TierState[] | null;
}

const tierWindow = (t: TierSpec): number => (Array.isArray(t) ? t[0] : (t as { window: number }).window);
const tierLimit = (t: TierSpec): number => (Array.isArray(t) ? t[1] : (t as { limit: number }).limit);

function flatTiers(tiers: readonly TierSpec[] | undefined): number[] | null {
  if (!tiers || tiers.length === 0) return null;
  const out: number[] = [];
  for (const t of tiers) out.push(tierWindow(t), tierLimit(t));
  return out;
}

/**
 * A cost the cache may answer for: a whole number that fits every tier's
 * limit. Anything else is sent, so that the server's answer stands: its
 * error for a bad cost, its never-fits (-1) for a cost above a limit.
 */
function fits(entry: Entry, cost: number): boolean {
  if (!Number.isInteger(cost) || cost > entry.limit) return false;
  if (entry.tiers !== null) for (let i = 1; i < entry.tiers.length; i += 2) if (cost > entry.tiers[i]!) return false;
  return true;
}

/** The request has exactly the entry's shape: window, limit and every tier. */
function sameShape(entry: Entry, spec: CallSpec): boolean {
  if (entry.window !== spec.window || entry.limit !== spec.limit) return false;
  const tiers = spec.tiers;
  const n = tiers ? tiers.length : 0;
  if (entry.tiers === null) return n === 0;
  if (entry.tiers.length !== 2 * n) return false;
  for (let i = 0; i < n; i++) {
    const t = tiers![i]!;
    if (entry.tiers[2 * i] !== tierWindow(t) || entry.tiers[2 * i + 1] !== tierLimit(t)) return false;
  }
  return true;
}

export class BlockCache {
  private readonly entries = new Map<string, Entry>();
  private hits = 0;

  /**
   * `capacity` entries at most (0: nothing is ever held); `monotonic` is the
   * local monotonic clock in ms (performance.now() by default; tests inject one).
   */
  constructor(
    readonly capacity: number,
    readonly monotonic: () => number = () => performance.now(),
  ) {}

  /** The monotonic time now: what the limiter takes just before it sends an allow. */
  now(): number {
    return this.monotonic();
  }

  /**
   * Before an allow of `spec` (its full key): the rejection the cache can give
   * at `at`, or undefined (send it). An expired entry met here is dropped; an
   * entry of another shape, or a smaller cost, stays and the call is sent.
   */
  lookup(spec: CallSpec, at: number = this.monotonic()): Decision | undefined {
    const entry = this.entries.get(spec.key);
    if (entry === undefined) return undefined;
    if (at >= entry.deadline) {
      this.entries.delete(spec.key);
      return undefined;
    }
    const cost = spec.cost ?? 1;
    if (cost < entry.cost || !sameShape(entry, spec) || !fits(entry, cost)) return undefined;
    // Touch: the most recently used is the last in the Map's order.
    this.entries.delete(spec.key);
    this.entries.set(spec.key, entry);
    this.hits++;
    const elapsed = Math.floor(at - entry.sentAt);
    return {
      allowed: false,
      limit: entry.decidedLimit,
      remaining: 0,
      retryAfter: Math.max(1, Math.ceil(entry.deadline - at)),
      resetAfter: Math.max(0, entry.resetAfter - elapsed),
      costExceedsLimit: false,
      window: entry.decidedWindow,
      tier: entry.tier,
      tiers: entry.tierStates === null ? [] : entry.tierStates.map((t) => ({
        window: t.window,
        limit: t.limit,
        remaining: t.remaining,
        retryAfter: Math.max(0, t.retryAfter - elapsed),
        resetAfter: Math.max(0, t.resetAfter - elapsed),
      })),
      stamp: null,
      oldest: null,
      via: 'cache',
      error: null,
    };
  }

  /**
   * After the server decided an allow of `spec` sent at `sentAt`: a rejection
   * that can fit later is held (replacing the key's entry); an admission drops
   * the key's entry (the window opened earlier than held: a refund somewhere).
   * A never-fits rejection, the error policy's decision, and a cached one
   * change nothing.
   */
  record(spec: CallSpec, sentAt: number, decision: Decision): void {
    if (decision.via !== 'command' && decision.via !== 'script') return;
    if (decision.allowed) {
      this.entries.delete(spec.key);
      return;
    }
    if (!(decision.retryAfter > 0) || this.capacity === 0) return;
    const entry: Entry = {
      window: spec.window,
      limit: spec.limit,
      tiers: flatTiers(spec.tiers),
      cost: spec.cost ?? 1,
      sentAt,
      deadline: sentAt + decision.retryAfter,
      decidedLimit: decision.limit,
      decidedWindow: decision.window,
      tier: decision.tier,
      resetAfter: decision.resetAfter,
      tierStates: decision.tiers.length > 0 ? decision.tiers : null,
    };
    // Replaced: deleted first, so that it moves to the most recent end.
    if (!this.entries.delete(spec.key) && this.entries.size >= this.capacity) {
      const lru = this.entries.keys().next();
      if (!lru.done) this.entries.delete(lru.value);
    }
    this.entries.set(spec.key, entry);
  }

  /** Drops `key`'s entry (a refund or a reset of it through the same limiter, sent after this). */
  forget(key: string): void {
    this.entries.delete(key);
  }

  /** Entries held now (expired ones not yet met included). */
  get size(): number {
    return this.entries.size;
  }

  get stats(): Stats {
    return { cacheHits: this.hits, cacheEntries: this.entries.size };
  }
}
