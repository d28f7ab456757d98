// Fastify (v4 and v5): an onRequest hook, for one route or a whole scope.
//
//   import { rateLimit } from 'xcloak/fastify';
//   app.get('/api', { onRequest: rateLimit({ limiter, limits: { window: 60_000, limit: 100 } }) }, handler);
//   app.addHook('onRequest', rateLimit({ limiter, limits }));   // every route of this scope
//
// Rejected: 429 with the contract's headers (docs/clients.md); allowed: the
// same headers on the reply. The limiter's error policy decides an outage:
// 'raise' throws into Fastify's error handler (500), 'allow' serves the request
// without headers, 'deny' answers 503.

import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { RateLimitCore, type MiddlewareOptions, type RateLimitInfo, type Verdict } from './http.js';

export { clientAddress } from './http.js';
export type { LimitSpec, MiddlewareOptions, RateLimitInfo, Verdict } from './http.js';

/** The parts of Fastify's request and reply this hook uses (structural: no import of fastify). */
export interface FastifyLikeRequest {
  readonly raw: IncomingMessage;
  readonly headers: IncomingHttpHeaders;
}
export interface FastifyLikeReply {
  readonly raw: ServerResponse;
  code(statusCode: number): FastifyLikeReply;
  header(name: string, value: string): FastifyLikeReply;
  type(contentType: string): FastifyLikeReply;
  send(payload?: unknown): FastifyLikeReply;
  readonly statusCode: number;
}

export interface FastifyOptions<Req extends FastifyLikeRequest = FastifyLikeRequest> extends MiddlewareOptions<Req> {
  /** Answers a rejected request instead of the default 429 (the headers are already set). */
  readonly onRejected?: (request: Req, reply: FastifyLikeReply, verdict: Verdict) => unknown;
}

export type FastifyHook<Req extends FastifyLikeRequest> = (request: Req, reply: FastifyLikeReply) => Promise<unknown>;

/**
 * The onRequest hook: `async (request, reply) => ...`. The key functions see
 * `{ raw, headers }`; name your request type to see more
 * (`rateLimit<FastifyRequest>({ ... })`).
 */
export function rateLimit(options: FastifyOptions<FastifyLikeRequest>): FastifyHook<FastifyLikeRequest>;
export function rateLimit<Req extends FastifyLikeRequest>(options: FastifyOptions<Req>): FastifyHook<Req>;
export function rateLimit<Req extends FastifyLikeRequest>(options: FastifyOptions<Req>): FastifyHook<Req> {
  const core = new RateLimitCore<Req>(options, ['onRejected']);
  return async function xcloakRateLimit(request: Req, reply: FastifyLikeReply): Promise<unknown> {
    const verdict = await core.check(request);
    for (const [name, value] of Object.entries(verdict.headers)) reply.header(name, value);
    (request as { rateLimit?: RateLimitInfo }).rateLimit = verdict.info;
    if (verdict.status === 'next') {
      const response = reply.raw;
      response.once('finish', () => verdict.finish(response.statusCode, true));
      response.once('close', () => verdict.finish(response.statusCode, response.writableFinished));
      return undefined;
    }
    if (verdict.status === 429 && options.onRejected) return options.onRejected(request, reply, verdict);
    return reply.code(verdict.status).type('text/plain; charset=utf-8').send(verdict.body);
  };
}
