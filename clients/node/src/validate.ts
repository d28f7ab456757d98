// The client's own argument checks, for what plain JavaScript can get wrong
// and TypeScript can't catch, and for configuration checked when it is built
// (a middleware, a store, a rate-limiter-flexible limiter): the same ranges as
// the server's (src/args.rs), named the same way, so that a bad limit is
// refused at startup, not at the first request, and never reaches the error
// policy. Client-side errors are XcloakError with code 'ARGUMENT' and a
// message that does not begin with `ERR` (that prefix is the server's).

import { XcloakError } from './errors.js';

/** The largest window, NOW or stamp: 2^53 - 1 milliseconds. */
export const MAX_WINDOW = Number.MAX_SAFE_INTEGER;
/** The server's default `max-limit` (a module load argument; its ceiling is 10^9). */
export const MAX_LIMIT = 1_000_000;
export const MAX_COST = 1_000_000;
/** Tiers in one call, the positional one included. */
export const MAX_TIERS = 16;

/** A client-side refusal: names the argument and its valid range. */
export function argumentError(message: string): XcloakError {
  return new XcloakError(message, { code: 'ARGUMENT' });
}

export function show(value: unknown): string {
  if (typeof value === 'string') return `the string ${JSON.stringify(value)}`;
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  if (value === null) return 'null';
  if (typeof value === 'object') return 'an object';
  return String(value);
}

export function integerIn(name: string, value: unknown, min: number, max: number, unit = ''): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw argumentError(`${name} must be an integer from ${min} to ${max}${unit}, got ${show(value)}`);
  }
  return value;
}

/** A window: a whole number of milliseconds, 1 to 2^53 - 1. */
export function checkWindow(name: string, value: unknown): number {
  return integerIn(name, value, 1, MAX_WINDOW, ' (milliseconds)');
}

export function checkLimit(name: string, value: unknown): number {
  return integerIn(name, value, 0, MAX_LIMIT);
}

export function checkCost(name: string, value: unknown): number {
  return integerIn(name, value, 1, MAX_COST);
}

/** Tiers after the positional pair: `[window, limit]` or `{ window, limit }`, at most 15. */
export function checkTiers(name: string, tiers: unknown): void {
  if (tiers === undefined) return;
  if (!Array.isArray(tiers)) throw argumentError(`${name} must be an array of [window, limit] pairs, got ${show(tiers)}`);
  if (tiers.length > MAX_TIERS - 1) throw argumentError(`${name} must hold at most ${MAX_TIERS - 1} tiers, got ${tiers.length}`);
  tiers.forEach((tier: unknown, i) => {
    const pair = Array.isArray(tier)
      ? tier
      : tier && typeof tier === 'object'
        ? [(tier as { window?: unknown }).window, (tier as { limit?: unknown }).limit]
        : undefined;
    if (!pair || pair.length !== 2) throw argumentError(`${name}[${i}] must be a [window, limit] pair, got ${show(tier)}`);
    checkWindow(`${name}[${i}] window`, pair[0]);
    checkLimit(`${name}[${i}] limit`, pair[1]);
  });
}

/** A number of the caller's type, before the server checks its range (plain JS passes strings: '60000'). */
export function checkNumber(name: string, value: unknown): void {
  if (typeof value !== 'number' || Number.isNaN(value)) {
    throw argumentError(`${name} must be a number, got ${show(value)}`);
  }
}

/** An options object holds only the keys it knows: a misspelled one (`teirs`, `cots`) is refused, not ignored. */
export function checkKeys(what: string, options: unknown, known: readonly string[]): void {
  if (options === undefined) return;
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw argumentError(`${what} must be an object, got ${show(options)}`);
  }
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) throw argumentError(`${what}: unknown option ${JSON.stringify(key)} (known: ${known.join(', ')})`);
  }
}

export function checkFunction(name: string, value: unknown): void {
  if (value !== undefined && typeof value !== 'function') throw argumentError(`${name} must be a function, got ${show(value)}`);
}

export function checkBoolean(name: string, value: unknown): void {
  if (value !== undefined && typeof value !== 'boolean') throw argumentError(`${name} must be true or false, got ${show(value)}`);
}

export function checkChoice<T extends string>(name: string, value: unknown, choices: readonly T[], fallback: T): T {
  if (value === undefined) return fallback;
  if (!choices.includes(value as T)) throw argumentError(`${name} must be one of ${choices.join(', ')}, got ${show(value)}`);
  return value as T;
}

/** A duration in milliseconds, at least `min` (an option of the limiter: timeout, probeInterval, ...). */
export function checkMs(name: string, value: unknown, fallback: number, min = 0): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min) {
    throw argumentError(`${name} must be a number of milliseconds of at least ${min}, got ${show(value)}`);
  }
  return value;
}
