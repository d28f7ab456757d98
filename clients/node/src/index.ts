// xcloak: exact sliding-window rate limiting on Redis for ioredis and
// node-redis (docs/clients.md is the contract every xcloak package follows).
//
//   const limiter = new Limiter(redis);                 // ioredis Redis/Cluster, node-redis client/cluster
//   const d = await limiter.allow('user:42', 60_000, 100);
//   if (!d.allowed) response.writeHead(429, headers(d)).end();
//
// decision.ts is the pure core (reply -> Decision -> headers, acquire's step);
// block-cache.ts the block cache (pure: rejections repeated without a call);
// validate.ts the client's own argument checks; limiter.ts sends;
// ioredis-transport.ts and node-redis.ts are the transports; the
// adapters live in their own entry points (xcloak/express, xcloak/fastify,
// xcloak/rate-limiter-flexible, xcloak/express-rate-limit).

export {
  acquireStep,
  allowCommand,
  ceilSeconds,
  decisionFromReply,
  errorDecision,
  headers,
  multiDecision,
  peekCommand,
  policyName,
  refundCommand,
  tierPairs,
} from './decision.js';
export type {
  AcquireStep,
  CallSpec,
  Decision,
  HeaderOptions,
  HeaderStyle,
  MultiDecision,
  MultiHeaderOptions,
  TierSpec,
  TierState,
  Via,
} from './decision.js';
export { XcloakError, XcloakNotReplicatedError, XcloakTimeoutError, XcloakUnavailableError } from './errors.js';
export { Limiter } from './limiter.js';
export type { Stats } from './block-cache.js';
export type {
  AcquireOptions,
  AllowAllOptions,
  AllowOptions,
  AllowAllRequest,
  RedisClient,
  Clock,
  DurableOptions,
  ErrorPolicy,
  Fallback,
  LimiterOptions,
  PeekOptions,
  RefundOptions,
} from './limiter.js';
export { SCRIPTS } from './scripts.js';
export type { Script } from './scripts.js';
export { keySlot } from './slot.js';
export type { SendOptions, Transport } from './transport.js';
export { XcloakNotResentError } from './ioredis-transport.js';
