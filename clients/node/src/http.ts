// What the Express and Fastify middleware share (docs/clients.md,
// Middleware): the client's key (its address; a forwarded address only
// through proxies the user trusts), one or more limits per route as one
// all-or-nothing call, the contract's headers, the error policy's answer, and
// the exact refund of a request's own admission once its response is known.

import { BlockList, isIP } from 'node:net';
import type { IncomingMessage } from 'node:http';
import { headers as headerFields, type Decision, type HeaderStyle, type MultiDecision, type TierSpec } from './decision.js';
import type { AllowAllRequest, Limiter } from './limiter.js';
import { argumentError, checkBoolean, checkChoice, checkCost, checkFunction, checkKeys, checkLimit, checkTiers, checkWindow, show } from './validate.js';

/** One limit of a route: `limit` per `window` ms (and each tier's), on its own key. */
export interface LimitSpec<Req = IncomingMessage> {
  /** Names the key (`rl:<name>:<client key>`), default `http`. Several limits need different names. */
  readonly name?: string;
  readonly window: number;
  readonly limit: number;
  readonly tiers?: readonly TierSpec[];
  /** Units a request takes (default 1), or a function of the request. */
  readonly cost?: number | ((request: Req) => number | Promise<number>);
  /** This limit's client key (default: the middleware's `key`), e.g. the account instead of the address. */
  readonly key?: (request: Req) => string | Promise<string>;
  /** Policy names for the headers, one per tier. */
  readonly names?: readonly string[];
}

export interface MiddlewareOptions<Req = IncomingMessage> {
  readonly limiter: Limiter;
  readonly limits: LimitSpec<Req> | readonly LimitSpec<Req>[];
  /** The client key (default: the client's address, see `trustedProxies`). */
  readonly key?: (request: Req) => string | Promise<string>;
  /**
   * Proxies whose forwarded addresses are believed: addresses or CIDR ranges
   * (`10.0.0.0/8`, `::1`). Without them the forwarding header is ignored; with
   * them the client is the rightmost address not in this list.
   */
  readonly trustedProxies?: readonly string[];
  /** Which header carries the forwarded chain (default `x-forwarded-for`). */
  readonly proxyHeader?: 'x-forwarded-for' | 'forwarded';
  /** Header style (default `ietf`), or false for none. */
  readonly headers?: HeaderStyle | false;
  /** Refund the request's own admission when its response succeeded (status < 400). */
  readonly skipSuccessfulRequests?: boolean;
  /** Refund it when the response failed (status >= 400, or the connection closed before the response ended). */
  readonly skipFailedRequests?: boolean;
  /** Decides success from the final status (default: status < 400). */
  readonly requestWasSuccessful?: (statusCode: number) => boolean;
  /** Not limited at all (e.g. health checks). */
  readonly skip?: (request: Req) => boolean | Promise<boolean>;
  /** Called with each refund that fails (the admission then stays: conservative). Default: ignore. */
  readonly onRefundError?: (error: Error) => void;
}

/**
 * What the middleware leaves on the request as `req.rateLimit`: the shape of
 * express-rate-limit's `RateLimitInfo`, of the binding limit (the rejected
 * one, else the one with the fewest remaining), plus xcloak's whole decision.
 */
export interface RateLimitInfo {
  /** The binding tier's limit. */
  readonly limit: number;
  /** Units in its window now, this request's included when admitted (a rejection records nothing). */
  readonly used: number;
  readonly remaining: number;
  /** When the binding tier's window is empty (undefined when the error policy answered). */
  readonly resetTime: Date | undefined;
  /** The binding limit's key (`rl:<name>:<client key>`). */
  readonly key: string;
  /** xcloak's decision: every limit's, with tiers, stamps and `via`. */
  readonly decision: MultiDecision;
}

/** What the middleware does with a request. */
export interface Verdict {
  /** `next`: serve it; 429: rejected; 503: the error policy denied it. */
  readonly status: 'next' | 429 | 503;
  readonly headers: Record<string, string>;
  readonly body: string;
  readonly decision: MultiDecision | undefined;
  /** `req.rateLimit` (undefined when skipped). */
  readonly info: RateLimitInfo | undefined;
  /** Refunds the admissions by their stamps once the final status is known (a no-op unless skip* asks). */
  readonly finish: (statusCode: number, completed: boolean) => void;
}

const noFinish = () => {};

function normalizeAddress(address: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  return mapped ? mapped[1]! : address;
}

function trusted(list: readonly string[]): BlockList {
  const block = new BlockList();
  for (const entry of list) {
    const [address, bits] = entry.split('/') as [string, string | undefined];
    const family = isIP(address);
    if (!family) throw argumentError(`trustedProxies: ${JSON.stringify(entry)} is not an address or a CIDR range`);
    const type = family === 6 ? 'ipv6' : 'ipv4';
    if (bits === undefined) block.addAddress(address, type);
    else {
      const prefix = Number(bits);
      if (!Number.isInteger(prefix) || prefix < 0 || prefix > (family === 6 ? 128 : 32)) {
        throw argumentError(`trustedProxies: ${JSON.stringify(entry)} has a prefix length outside 0 to ${family === 6 ? 128 : 32}`);
      }
      block.addSubnet(address, prefix, type);
    }
  }
  return block;
}

function forwardedChain(header: string | string[] | undefined, kind: 'x-forwarded-for' | 'forwarded'): string[] {
  if (header === undefined) return [];
  const text = Array.isArray(header) ? header.join(',') : header;
  if (kind === 'x-forwarded-for') return text.split(',').map((s) => s.trim()).filter(Boolean);
  // Forwarded: for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711" (RFC 7239)
  const out: string[] = [];
  for (const element of text.split(',')) {
    const pair = element.split(';').map((s) => s.trim()).find((s) => s.toLowerCase().startsWith('for='));
    if (!pair) continue;
    let value = pair.slice(4).trim().replace(/^"|"$/g, '');
    const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(value);
    if (bracketed) value = bracketed[1]!;
    else if (/^\d+\.\d+\.\d+\.\d+:\d+$/.test(value)) value = value.slice(0, value.lastIndexOf(':'));
    out.push(value);
  }
  return out;
}

/** The client's address: the socket's peer, or through trusted proxies the rightmost untrusted forwarded address. */
export function clientAddress(
  remoteAddress: string | undefined,
  headers: Record<string, string | string[] | undefined>,
  proxies: BlockList | undefined,
  kind: 'x-forwarded-for' | 'forwarded' = 'x-forwarded-for',
): string {
  const peer = normalizeAddress(remoteAddress ?? '');
  if (!proxies) return peer;
  const chain = [...forwardedChain(headers[kind], kind).map(normalizeAddress), peer];
  for (let i = chain.length - 1; i >= 0; i--) {
    const address = chain[i]!;
    const family = isIP(address);
    if (!family || !proxies.check(address, family === 6 ? 'ipv6' : 'ipv4')) return address;
  }
  return chain[0]!;
}

const nativeRequest = (request: unknown): IncomingMessage => ((request as { raw?: IncomingMessage }).raw ?? request) as IncomingMessage;

/** The middleware's core, framework-free: `check(request)` gives the verdict. */
export class RateLimitCore<Req> {
  private readonly limits: readonly LimitSpec<Req>[];
  private readonly proxies: BlockList | undefined;
  private readonly style: HeaderStyle | false;
  private readonly refunds: boolean;

  /** Checks every option now: a bad configuration throws here, at startup, never at a request. */
  constructor(
    private readonly options: MiddlewareOptions<Req>,
    extraOptions: readonly string[] = [],
  ) {
    checkKeys('rateLimit options', options, [...MIDDLEWARE_OPTIONS, ...extraOptions]);
    if (!options || typeof options.limiter?.allow !== 'function' || typeof options.limiter?.allowAll !== 'function') {
      throw argumentError(`limiter must be an xcloak Limiter, got ${show(options?.limiter)}`);
    }
    if (options.limits === undefined) throw argumentError('limits is required: { window, limit } or an array of them');
    const limits = Array.isArray(options.limits) ? options.limits : [options.limits as LimitSpec<Req>];
    if (limits.length === 0) throw argumentError('limits must hold at least one limit');
    limits.forEach((l, i) => checkLimitSpec(`limits[${i}]`, l));
    const names = limits.map((l) => l.name ?? 'http');
    names.forEach((name, i) => {
      if (names.indexOf(name) !== i) throw argumentError(`limits[${i}].name: ${JSON.stringify(name)} is taken; give each limit its own name`);
    });
    for (const fn of ['key', 'skip', 'requestWasSuccessful', 'onRefundError', 'onRejected'] as const) {
      checkFunction(fn, (options as unknown as Record<string, unknown>)[fn]);
    }
    checkBoolean('skipSuccessfulRequests', options.skipSuccessfulRequests);
    checkBoolean('skipFailedRequests', options.skipFailedRequests);
    checkChoice('proxyHeader', options.proxyHeader, ['x-forwarded-for', 'forwarded'], 'x-forwarded-for');
    if (options.headers !== false) checkChoice('headers', options.headers, ['ietf', 'legacy', 'both'], 'ietf');
    if (options.trustedProxies !== undefined && !Array.isArray(options.trustedProxies)) {
      throw argumentError(`trustedProxies must be an array of addresses or CIDR ranges, got ${show(options.trustedProxies)}`);
    }
    this.limits = limits;
    this.proxies = options.trustedProxies?.length ? trusted(options.trustedProxies) : undefined;
    this.style = options.headers ?? 'ietf';
    this.refunds = options.skipSuccessfulRequests === true || options.skipFailedRequests === true;
  }

  /** The client key of a request by default: its address. */
  address(request: Req): string {
    const raw = nativeRequest(request);
    return clientAddress(raw.socket?.remoteAddress, raw.headers, this.proxies, this.options.proxyHeader);
  }

  async check(request: Req): Promise<Verdict> {
    const { limiter } = this.options;
    if (this.options.skip && (await this.options.skip(request))) {
      return { status: 'next', headers: {}, body: '', decision: undefined, info: undefined, finish: noFinish };
    }
    const clientKey = this.options.key ? await this.options.key(request) : this.address(request);
    const requests: AllowAllRequest[] = [];
    for (const limit of this.limits) {
      const key = limit.key ? await limit.key(request) : clientKey;
      const cost = typeof limit.cost === 'function' ? await limit.cost(request) : limit.cost;
      requests.push({ key: `rl:${limit.name ?? 'http'}:${key}`, window: limit.window, limit: limit.limit, tiers: limit.tiers, cost });
    }
    const multi = await this.decide(limiter, requests);
    const info = rateLimitInfo(multi, requests);
    if (multi.via === 'error') {
      // The error policy answered an outage ('raise' threw already).
      if (multi.allowed) return { status: 'next', headers: {}, body: '', decision: multi, info, finish: noFinish };
      return { status: 503, headers: {}, body: 'Service Unavailable: the rate limiter cannot answer\n', decision: multi, info, finish: noFinish };
    }
    const fields = this.style === false ? {} : headerFields(multi, { style: this.style, names: this.limits.map((l) => l.names) });
    if (!multi.allowed) {
      const body = multi.binding.costExceedsLimit
        ? 'Too Many Requests: this request is larger than the limit and can never be admitted\n'
        : `Too Many Requests: retry after ${Math.max(1, Math.ceil(multi.retryAfter / 1000))} s\n`;
      return { status: 429, headers: fields, body, decision: multi, info, finish: noFinish };
    }
    return { status: 'next', headers: fields, body: '', decision: multi, info, finish: this.refunder(requests, multi.decisions) };
  }

  private async decide(limiter: Limiter, requests: AllowAllRequest[]): Promise<MultiDecision> {
    if (requests.length > 1) return limiter.allowAll(requests);
    const [r] = requests as [AllowAllRequest];
    const decision = await limiter.allow(r.key, r.window, r.limit, { cost: r.cost, tiers: r.tiers, stamp: this.refunds });
    return single(decision);
  }

  /** Once the response is known: refund every admission of this request by its own stamp, if skip* says so. */
  private refunder(requests: readonly AllowAllRequest[], decisions: readonly Decision[]): Verdict['finish'] {
    if (!this.refunds) return noFinish;
    const { skipSuccessfulRequests, skipFailedRequests, requestWasSuccessful, limiter, onRefundError } = this.options;
    let done = false;
    return (statusCode, completed) => {
      if (done) return;
      done = true;
      const success = completed && (requestWasSuccessful ? requestWasSuccessful(statusCode) : statusCode < 400);
      if (!(success ? skipSuccessfulRequests : skipFailedRequests)) return;
      decisions.forEach((decision, i) => {
        if (decision.stamp === null || decision.via === 'error') return;
        const { key, cost } = requests[i]!;
        limiter.refund(key, decision.stamp, { cost }).catch((error: Error) => onRefundError?.(error));
      });
    };
  }
}

const MIDDLEWARE_OPTIONS = [
  'limiter',
  'limits',
  'key',
  'trustedProxies',
  'proxyHeader',
  'headers',
  'skipSuccessfulRequests',
  'skipFailedRequests',
  'requestWasSuccessful',
  'skip',
  'onRefundError',
];
const LIMIT_KEYS = ['name', 'window', 'limit', 'tiers', 'cost', 'key', 'names'];

/** One limit of a route, checked with the server's ranges (src/args.rs). */
function checkLimitSpec(at: string, spec: unknown): void {
  checkKeys(at, spec, LIMIT_KEYS);
  if (spec === undefined) throw argumentError(`${at} must be an object { window, limit }, got undefined`);
  const l = spec as Record<string, unknown>;
  if (l.name !== undefined && (typeof l.name !== 'string' || l.name === '')) throw argumentError(`${at}.name must be a non-empty string, got ${show(l.name)}`);
  checkWindow(`${at}.window`, l.window);
  checkLimit(`${at}.limit`, l.limit);
  checkTiers(`${at}.tiers`, l.tiers);
  if (typeof l.cost !== 'function' && l.cost !== undefined) checkCost(`${at}.cost`, l.cost);
  checkFunction(`${at}.key`, l.key);
  if (l.names !== undefined) {
    const tiers = 1 + ((l.tiers as unknown[] | undefined)?.length ?? 0);
    if (!Array.isArray(l.names) || l.names.length > tiers || !l.names.every((n) => typeof n === 'string')) {
      throw argumentError(`${at}.names must be an array of at most ${tiers} strings (one per tier), got ${show(l.names)}`);
    }
  }
}

/** `req.rateLimit`: express-rate-limit's fields of the binding limit, and the decision. */
function rateLimitInfo(multi: MultiDecision, requests: readonly AllowAllRequest[]): RateLimitInfo {
  const binding = multi.binding;
  const key = requests[multi.bindingIndex]?.key ?? '';
  if (binding.via === 'error') return { limit: binding.limit, used: 0, remaining: 0, resetTime: undefined, key, decision: multi };
  return {
    limit: binding.limit,
    used: binding.limit - binding.remaining,
    remaining: binding.remaining,
    resetTime: new Date(Date.now() + binding.resetAfter),
    key,
    decision: multi,
  };
}

/** A single decision as the MultiDecision of one request. */
export function single(decision: Decision): MultiDecision {
  return {
    allowed: decision.allowed,
    decisions: [decision],
    rejected: decision.allowed ? null : 0,
    bindingIndex: 0,
    binding: decision,
    retryAfter: decision.retryAfter,
    via: decision.via,
    error: decision.error,
  };
}
