// What the Express and Fastify middleware share (docs/clients.md,
// Middleware): the client's key (its address; a forwarded address only
// through proxies the user trusts), one or more limits per route as one
// all-or-nothing call, the contract's headers, the error policy's answer, and
// the exact refund of a request's own admission once its response is known.

import { BlockList, isIP } from 'node:net';
import type { IncomingMessage } from 'node:http';
import { headers as headerFields, type Decision, type HeaderStyle, type MultiDecision, type TierSpec } from './decision.js';
import { XcloakError } from './errors.js';
import type { AllowRequest, Limiter } from './limiter.js';

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

/** What the middleware does with a request. */
export interface Verdict {
  /** `next`: serve it; 429: rejected; 503: the error policy denied it. */
  readonly status: 'next' | 429 | 503;
  readonly headers: Record<string, string>;
  readonly body: string;
  readonly decision: MultiDecision | undefined;
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
    if (!family) throw new XcloakError(`ERR trustedProxies: ${JSON.stringify(entry)} is not an address or a CIDR range`);
    const type = family === 6 ? 'ipv6' : 'ipv4';
    if (bits === undefined) block.addAddress(address, type);
    else {
      const prefix = Number(bits);
      if (!Number.isInteger(prefix) || prefix < 0 || prefix > (family === 6 ? 128 : 32)) {
        throw new XcloakError(`ERR trustedProxies: ${JSON.stringify(entry)} has a bad prefix length`);
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

  constructor(private readonly options: MiddlewareOptions<Req>) {
    if (!options?.limiter) throw new XcloakError('ERR the middleware needs a limiter');
    const limits = Array.isArray(options.limits) ? options.limits : [options.limits as LimitSpec<Req>];
    if (limits.length === 0) throw new XcloakError('ERR the middleware needs at least one limit');
    const names = limits.map((l) => l.name ?? 'http');
    names.forEach((name, i) => {
      if (names.indexOf(name) !== i) throw new XcloakError(`ERR limits[${i}]: the name ${JSON.stringify(name)} is taken; give each limit its own name`);
    });
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
      return { status: 'next', headers: {}, body: '', decision: undefined, finish: noFinish };
    }
    const clientKey = this.options.key ? await this.options.key(request) : this.address(request);
    const requests: AllowRequest[] = [];
    for (const limit of this.limits) {
      const key = limit.key ? await limit.key(request) : clientKey;
      const cost = typeof limit.cost === 'function' ? await limit.cost(request) : limit.cost;
      requests.push({ key: `rl:${limit.name ?? 'http'}:${key}`, window: limit.window, limit: limit.limit, tiers: limit.tiers, cost });
    }
    const multi = await this.decide(limiter, requests);
    if (multi.via === 'error') {
      // The error policy answered an outage ('raise' threw already).
      if (multi.allowed) return { status: 'next', headers: {}, body: '', decision: multi, finish: noFinish };
      return { status: 503, headers: {}, body: 'Service Unavailable: the rate limiter cannot answer\n', decision: multi, finish: noFinish };
    }
    const fields = this.style === false ? {} : headerFields(multi, { style: this.style, names: this.limits.map((l) => l.names) });
    if (!multi.allowed) {
      const body = multi.binding.costExceedsLimit
        ? 'Too Many Requests: this request is larger than the limit and can never be admitted\n'
        : `Too Many Requests: retry after ${Math.max(1, Math.ceil(multi.retryAfter / 1000))} s\n`;
      return { status: 429, headers: fields, body, decision: multi, finish: noFinish };
    }
    return { status: 'next', headers: fields, body: '', decision: multi, finish: this.refunder(requests, multi.decisions) };
  }

  private async decide(limiter: Limiter, requests: AllowRequest[]): Promise<MultiDecision> {
    if (requests.length > 1) return limiter.allowAll(requests);
    const [r] = requests as [AllowRequest];
    const decision = await limiter.allow(r.key, r.window, r.limit, { cost: r.cost, tiers: r.tiers, stamp: this.refunds });
    return single(decision);
  }

  /** Once the response is known: refund every admission of this request by its own stamp, if skip* says so. */
  private refunder(requests: readonly AllowRequest[], decisions: readonly Decision[]): Verdict['finish'] {
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
