// The pure core of the contract (docs/clients.md): the canonical command of a
// call, a server reply read into a Decision, a Decision (or a MultiDecision)
// written as HTTP header fields, and one step of acquire's loop. Nothing here
// touches a connection, so the conformance vectors drive it without a server.

import { argumentError, checkNumber, show } from './validate.js';

/** A tier after the positional one: `[window, limit]` or `{ window, limit }` (milliseconds). */
export type TierSpec = readonly [number, number] | { readonly window: number; readonly limit: number };

/**
 * Who decided: the module, the bundled Lua script, the error policy, or the
 * block cache (a rejection repeated without a call: docs/clients.md, Block cache).
 */
export type Via = 'command' | 'script' | 'error' | 'cache';

/** One tier's state, in the order the tiers were given (tier 0 is the positional pair). */
export interface TierState {
  readonly window: number;
  readonly limit: number;
  readonly remaining: number;
  /** Milliseconds; -1 when the cost is above this tier's limit. */
  readonly retryAfter: number;
  readonly resetAfter: number;
}

/** The reply of XCLOAK.ALLOW ... DETAILS [STAMP] or XCLOAK.PEEK, read into one value. */
export interface Decision {
  /** Admitted (a peek: would be admitted now). */
  readonly allowed: boolean;
  /** The binding tier's limit. */
  readonly limit: number;
  /** The binding tier's remaining units, never below 0. */
  readonly remaining: number;
  /**
   * Milliseconds until the request fits in every tier if nothing else is
   * admitted meanwhile; 0 when allowed; -1 when it can never fit
   * (`costExceedsLimit`).
   */
  readonly retryAfter: number;
  /** Milliseconds until the binding tier's window is empty. */
  readonly resetAfter: number;
  /** The cost is above a tier's limit: it can never be admitted. Answer with a client error, don't retry. */
  readonly costExceedsLimit: boolean;
  /** The binding tier's window, in milliseconds. */
  readonly window: number;
  /** The binding tier's index: 0 for the positional pair, i for the i-th TIER. */
  readonly tier: number;
  /** With tiers only (else empty): every tier, in the order given. */
  readonly tiers: readonly TierState[];
  /** With `stamp: true`: the admission's stamp, the handle `refund` takes; null when rejected or not asked. */
  readonly stamp: number | null;
  /**
   * A peek with `oldest: true`: the stamp (unix ms) of the oldest entry live in
   * the binding tier's window, where a moving window starts; null when that
   * window is empty or not asked.
   */
  readonly oldest: number | null;
  readonly via: Via;
  /** With `via === 'error'`: the outage or timeout that the error policy answered. */
  readonly error: Error | null;
}

/** The result of `allowAll`: all or nothing over several keys. */
export interface MultiDecision {
  readonly allowed: boolean;
  /** One per request sent, in order (a refunded request's decision still shows its admission). */
  readonly decisions: readonly Decision[];
  /** The index of the request that rejected, or null. */
  readonly rejected: number | null;
  /** The index of the binding decision: the rejected one, else the one with the fewest remaining (ties: the earliest). */
  readonly bindingIndex: number;
  /** `decisions[bindingIndex]`. */
  readonly binding: Decision;
  /** The binding decision's retryAfter. */
  readonly retryAfter: number;
  readonly via: Via;
  readonly error: Error | null;
}

/** What a call asks, as the contract's arguments (milliseconds and integers). */
export interface CallSpec {
  readonly key: string;
  readonly window: number;
  readonly limit: number;
  readonly cost?: number;
  readonly tiers?: readonly TierSpec[];
  readonly now?: number;
  readonly stamp?: boolean;
  /** A peek: ask for the oldest live entry (OLDEST). */
  readonly oldest?: boolean;
}

function tierPair(tier: TierSpec, i: number): [number, number] {
  if (Array.isArray(tier)) return [tier[0], tier[1]];
  if (!tier || typeof tier !== 'object') throw argumentError(`tiers[${i}] must be a [window, limit] pair, got ${show(tier)}`);
  const { window, limit } = tier as { window: number; limit: number };
  return [window, limit];
}

/** The tiers as `[window, limit]` pairs. */
export function tierPairs(tiers: readonly TierSpec[] | undefined): Array<[number, number]> {
  if (tiers === undefined) return [];
  if (!Array.isArray(tiers)) throw argumentError(`tiers must be an array of [window, limit] pairs, got ${show(tiers)}`);
  return tiers.map(tierPair);
}

// Every number goes out as the decimal integer the server parses; a window
// that is not a whole number of milliseconds is the client's to refuse
// (docs/clients.md, Arguments), and so is anything that is not a number at
// all (plain JS: the string '60000'). Every other range check is the server's.
function windowArg(window: unknown, name: string): string {
  checkNumber(name, window);
  if (Number.isFinite(window) && !Number.isInteger(window)) {
    throw argumentError(`${name} must be a whole number of milliseconds, got ${window}`);
  }
  return intArg(window as number, name);
}

function intArg(value: unknown, name: string): string {
  checkNumber(name, value);
  // BigInt keeps 2^53 and above exact in the text (String(2**70) is "1.18e+21").
  if (Number.isInteger(value) && !Number.isSafeInteger(value)) return BigInt(value as number).toString();
  return String(value);
}

/** The arguments after the key that ALLOW and PEEK share: `window limit [TIER w l]... [COST c] [NOW t]`. */
function windowArgs(spec: CallSpec): string[] {
  const args = [windowArg(spec.window, 'window'), intArg(spec.limit, 'limit')];
  tierPairs(spec.tiers).forEach(([window, limit], i) => {
    args.push('TIER', windowArg(window, `window of TIER ${i + 1}`), intArg(limit, `limit of TIER ${i + 1}`));
  });
  if (spec.cost !== undefined && spec.cost !== 1) args.push('COST', intArg(spec.cost, 'cost'));
  if (spec.now !== undefined) args.push('NOW', intArg(spec.now, 'now'));
  return args;
}

/** `XCLOAK.ALLOW key window limit [TIER w l]... [COST c] [NOW t] DETAILS [STAMP]`, every argument a string. */
export function allowCommand(spec: CallSpec): string[] {
  const command = ['XCLOAK.ALLOW', spec.key, ...windowArgs(spec), 'DETAILS'];
  if (spec.stamp) command.push('STAMP');
  return command;
}

/** `XCLOAK.PEEK key window limit [TIER w l]... [COST c] [NOW t] [OLDEST]`. */
export function peekCommand(spec: CallSpec): string[] {
  const command = ['XCLOAK.PEEK', spec.key, ...windowArgs(spec)];
  if (spec.oldest) command.push('OLDEST');
  return command;
}

/** `XCLOAK.REFUND key stamp [COST c]`. */
export function refundCommand(key: string, stamp: number, cost?: number): string[] {
  const command = ['XCLOAK.REFUND', key, intArg(stamp, 'stamp')];
  if (cost !== undefined && cost !== 1) command.push('COST', intArg(cost, 'cost'));
  return command;
}

function integer(value: unknown, what: string): number {
  if (typeof value === 'number') return value;
  if (typeof value === 'bigint') return Number(value);
  if (typeof value === 'string' && /^-?\d+$/.test(value)) return Number(value);
  throw new TypeError(`xcloak: unexpected reply: ${what} is ${JSON.stringify(value)}`);
}

function tierState(entry: unknown): TierState {
  if (!Array.isArray(entry) || entry.length !== 5) throw new TypeError(`xcloak: unexpected tier in reply: ${JSON.stringify(entry)}`);
  const [window, limit, remaining, retryAfter, resetAfter] = entry.map((v, i) => integer(v, `tier field ${i}`));
  return { window, limit, remaining, retryAfter, resetAfter };
}

/**
 * Reads the reply of `allowCommand(spec)` or `peekCommand(spec)` into a
 * Decision: `[allowed, limit, remaining, retry_after_ms, reset_after_ms]`,
 * with tiers a sixth element (one such entry per tier, window first), and with
 * STAMP a last element (-1 when rejected), with OLDEST (a peek) the oldest live
 * entry of the binding tier's window (-1 when it is empty).
 */
export function decisionFromReply(reply: unknown, spec: CallSpec, via: Via): Decision {
  if (!Array.isArray(reply) || reply.length < 5) throw new TypeError(`xcloak: unexpected reply ${JSON.stringify(reply)}`);
  const [allowed, limit, remaining, retryAfter, resetAfter] = reply.slice(0, 5).map((v, i) => integer(v, `field ${i}`));
  let next = 5;
  let tiers: TierState[] = [];
  let tier = 0;
  let window = spec.window;
  if (spec.tiers && spec.tiers.length > 0) {
    const entries = reply[next++];
    if (!Array.isArray(entries)) throw new TypeError(`xcloak: reply without its tiers: ${JSON.stringify(reply)}`);
    tiers = entries.map(tierState);
    // The binding tier is the first whose fields equal the reply's (the
    // server breaks ties to the earliest tier).
    const binding = tiers.findIndex(
      (t) => t.limit === limit && t.remaining === remaining && t.retryAfter === retryAfter && t.resetAfter === resetAfter,
    );
    tier = binding < 0 ? 0 : binding;
    window = tiers[tier]?.window ?? spec.window;
  }
  let stamp: number | null = null;
  if (spec.stamp && reply.length > next) {
    const value = integer(reply[next], 'stamp');
    stamp = value < 0 ? null : value;
  }
  let oldest: number | null = null;
  if (spec.oldest && reply.length > next) {
    const value = integer(reply[next], 'oldest');
    oldest = value < 0 ? null : value;
  }
  return {
    allowed: allowed === 1,
    limit,
    remaining,
    retryAfter,
    resetAfter,
    costExceedsLimit: retryAfter < 0,
    window,
    tier,
    tiers,
    stamp,
    oldest,
    via,
    error: null,
  };
}

/** The decision the error policy gives for an outage: tier 0 as asked, no headers. */
export function errorDecision(spec: CallSpec, allowed: boolean, error: Error): Decision {
  return {
    allowed,
    limit: spec.limit,
    remaining: 0,
    retryAfter: 0,
    resetAfter: 0,
    costExceedsLimit: false,
    window: spec.window,
    tier: 0,
    tiers: [],
    stamp: null,
    oldest: null,
    via: 'error',
    error,
  };
}

/** The MultiDecision of the decisions sent, in order; `rejected` is the index that rejected, if any. */
export function multiDecision(decisions: readonly Decision[], rejected: number | null): MultiDecision {
  let bindingIndex = 0;
  if (rejected !== null) bindingIndex = rejected;
  else decisions.forEach((d, i) => { if (d.remaining < decisions[bindingIndex]!.remaining) bindingIndex = i; });
  const binding = decisions[bindingIndex]!;
  return {
    allowed: rejected === null,
    decisions,
    rejected,
    bindingIndex,
    binding,
    retryAfter: binding.retryAfter,
    via: binding.via,
    error: null,
  };
}

// ---- Headers

export type HeaderStyle = 'ietf' | 'legacy' | 'both';

export interface HeaderOptions {
  /** `ietf` (default): RateLimit-Policy and RateLimit, one policy per tier; `legacy`: draft-06's three fields; `both`. */
  readonly style?: HeaderStyle;
  /** Policy names, one per tier (default `<limit>-in-<s>s`, or `<limit>-in-<ms>ms`). */
  readonly names?: readonly string[];
}

export interface MultiHeaderOptions {
  readonly style?: HeaderStyle;
  /** One list of names per request. */
  readonly names?: ReadonlyArray<readonly string[] | undefined>;
}

/** Seconds, rounded up: rounding down tells a client to come back before its request can fit. */
export function ceilSeconds(ms: number): number {
  return Math.ceil(ms / 1000);
}

/** `5-in-60s` when the window is a whole number of seconds, else `3-in-1500ms`. */
export function policyName(limit: number, window: number): string {
  return window % 1000 === 0 ? `${limit}-in-${window / 1000}s` : `${limit}-in-${window}ms`;
}

function policies(decision: Decision): TierState[] {
  if (decision.tiers.length > 0) return [...decision.tiers];
  const { window, limit, remaining, retryAfter, resetAfter } = decision;
  return [{ window, limit, remaining, retryAfter, resetAfter }];
}

function ietfFields(decisions: ReadonlyArray<[Decision, readonly string[] | undefined]>): Record<string, string> {
  const policy: string[] = [];
  const state: string[] = [];
  for (const [decision, names] of decisions) {
    policies(decision).forEach((t, i) => {
      const name = names?.[i] ?? policyName(t.limit, t.window);
      policy.push(`"${name}";q=${t.limit};w=${ceilSeconds(t.window)}`);
      state.push(`"${name}";r=${t.remaining};t=${ceilSeconds(t.resetAfter)}`);
    });
  }
  return { 'RateLimit-Policy': policy.join(', '), RateLimit: state.join(', ') };
}

function legacyFields(binding: Decision): Record<string, string> {
  return {
    'RateLimit-Limit': String(binding.limit),
    'RateLimit-Remaining': String(binding.remaining),
    'RateLimit-Reset': String(ceilSeconds(binding.resetAfter)),
  };
}

function fields(
  sent: ReadonlyArray<[Decision, readonly string[] | undefined]>,
  binding: Decision,
  allowed: boolean,
  style: HeaderStyle,
): Record<string, string> {
  if (binding.via === 'error') return {};
  let out: Record<string, string> = {};
  if (style === 'ietf' || style === 'both') out = { ...out, ...ietfFields(sent) };
  if (style === 'legacy' || style === 'both') out = { ...out, ...legacyFields(binding) };
  if (style !== 'ietf' && style !== 'legacy' && style !== 'both') {
    throw argumentError(`style must be 'ietf', 'legacy' or 'both', got ${show(style)}`);
  }
  if (!allowed && binding.retryAfter > 0) out['Retry-After'] = String(Math.max(1, ceilSeconds(binding.retryAfter)));
  return out;
}

/** The HTTP header fields of a Decision or a MultiDecision (docs/clients.md, Headers). None for `via === 'error'`. */
export function headers(decision: Decision, options?: HeaderOptions): Record<string, string>;
export function headers(decision: MultiDecision, options?: MultiHeaderOptions): Record<string, string>;
export function headers(decision: Decision | MultiDecision, options: HeaderOptions | MultiHeaderOptions = {}): Record<string, string> {
  const style = options.style ?? 'ietf';
  if ('decisions' in decision) {
    const names = (options as MultiHeaderOptions).names;
    if (decision.via === 'error') return {};
    const sent = decision.decisions.map((d, i): [Decision, readonly string[] | undefined] => [d, names?.[i]]);
    return fields(sent, decision.binding, decision.allowed, style);
  }
  return fields([[decision, (options as HeaderOptions).names]], decision, decision.allowed, style);
}

// ---- acquire

/** What acquire does after a decision: stop with an outcome, or sleep and ask again. */
export type AcquireStep =
  | { readonly done: true; readonly outcome: 'admitted' | 'deadline' | 'never' | 'error' }
  | { readonly done: false; readonly sleep: number };

/**
 * One turn of acquire's loop (docs/clients.md, acquire): stop when admitted,
 * answered by the error policy, never-fits or unable to fit before the
 * deadline; else sleep the server's retry-after plus
 * `floor(retryAfter * jitterFraction * u)` (u uniform in [0, 1), drawn only
 * when the fraction is above 0), never past the deadline, at least 1 ms.
 */
export function acquireStep(decision: Decision, now: number, deadline: number, jitterFraction: number, random: () => number): AcquireStep {
  if (decision.via === 'error') return { done: true, outcome: 'error' };
  if (decision.allowed) return { done: true, outcome: 'admitted' };
  if (decision.costExceedsLimit) return { done: true, outcome: 'never' };
  const left = deadline - now;
  if (decision.retryAfter > left) return { done: true, outcome: 'deadline' };
  const jitter = jitterFraction > 0 ? Math.floor(decision.retryAfter * jitterFraction * random()) : 0;
  return { done: false, sleep: Math.max(1, Math.min(decision.retryAfter + jitter, left)) };
}
