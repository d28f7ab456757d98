// Express (4 and 5) middleware, also usable on a bare node:http server:
//
//   import { rateLimit } from 'xcloak/express';
//   app.use('/api', rateLimit({ limiter, limits: { window: 60_000, limit: 100 } }));
//
// Rejected: 429 with the contract's headers (docs/clients.md); allowed: the
// same headers on the response; either way `req.rateLimit` holds
// express-rate-limit's fields of the binding limit and the decision
// (http.ts, RateLimitInfo). The options are checked when it is built. The
// limiter's error policy decides an outage:
// 'raise' passes the error to Express's error handler (usually 500), 'allow'
// serves the request without headers, 'deny' answers 503.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { RateLimitCore, type MiddlewareOptions, type RateLimitInfo, type Verdict } from './http.js';

export { clientAddress } from './http.js';
export type { LimitSpec, MiddlewareOptions, RateLimitInfo, Verdict } from './http.js';

/** The request and response an Express middleware sees (node's, which Express extends). */
export type ExpressRequest = IncomingMessage;
export type ExpressResponse = ServerResponse & { locals?: Record<string, unknown> };
export type NextFunction = (error?: unknown) => void;

export interface ExpressOptions<Req extends IncomingMessage = ExpressRequest> extends MiddlewareOptions<Req> {
  /** Answers a rejected request instead of the default 429 (the headers are already set). */
  readonly onRejected?: (request: Req, response: ExpressResponse, verdict: Verdict) => void;
}

export type ExpressMiddleware<Req extends IncomingMessage> = (request: Req, response: ExpressResponse, next: NextFunction) => void;

/**
 * The rate-limiting middleware: `(req, res, next) => void`. The key functions
 * see node's request; name your request type to see more
 * (`rateLimit<Request>({ ... })` with Express's `Request`).
 */
export function rateLimit(options: ExpressOptions<ExpressRequest>): ExpressMiddleware<ExpressRequest>;
export function rateLimit<Req extends IncomingMessage>(options: ExpressOptions<Req>): ExpressMiddleware<Req>;
export function rateLimit<Req extends IncomingMessage>(options: ExpressOptions<Req>): ExpressMiddleware<Req> {
  const core = new RateLimitCore<Req>(options, ['onRejected']);
  return function xcloakRateLimit(request: Req, response: ExpressResponse, next: NextFunction): void {
    core.check(request).then(
      (verdict) => {
        if (response.headersSent) return next();
        for (const [name, value] of Object.entries(verdict.headers)) response.setHeader(name, value);
        (request as { rateLimit?: RateLimitInfo }).rateLimit = verdict.info;
        if (verdict.status === 'next') {
          // Refund by stamp once the status is final (skip* only).
          response.once('finish', () => verdict.finish(response.statusCode, true));
          response.once('close', () => verdict.finish(response.statusCode, response.writableFinished));
          return next();
        }
        if (verdict.status === 429 && options.onRejected) return options.onRejected(request, response, verdict);
        response.statusCode = verdict.status;
        response.setHeader('Content-Type', 'text/plain; charset=utf-8');
        response.end(verdict.body);
      },
      (error) => next(error),
    );
  };
}
