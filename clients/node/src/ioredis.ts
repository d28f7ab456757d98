// xcloak/ioredis: XCLOAK commands for your own ioredis calls, routed and
// guarded as a Limiter's are (ioredis-transport.ts says how), and the versions
// supported.
//
//   import { xcloakCommand } from 'xcloak/ioredis';
//   const reply = await cluster.sendCommand(xcloakCommand(cluster, ['XCLOAK.ALLOW', 'user:42', 60000, 100, 'DETAILS']));

export { SUPPORTED_IOREDIS, XcloakNotResentError, xcloakCommand } from './ioredis-transport.js';
export type { IoredisClient, XcloakIoCommand } from './ioredis-transport.js';
