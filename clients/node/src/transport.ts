// What the Limiter needs from a client library: send one command to the node
// that serves a key, know which node that is (the fallback is chosen per
// node), and WAIT on that node's connection. One implementation per library:
// ioredis.ts (Redis, Cluster) and node-redis.ts (client, cluster).

export interface SendOptions {
  /** The key the command routes by, as the limiter built it (the client's own keyPrefix, if any, still to come). */
  readonly key: string;
  /** Only reads (PEEK): a client that reads from replicas may send it there. */
  readonly readonly: boolean;
  /** Aborts at the limiter's deadline: a command not yet written is then never written. */
  readonly signal: AbortSignal;
}

export interface Transport {
  readonly library: 'ioredis' | 'node-redis';
  readonly cluster: boolean;
  /** `host:port` of the primary that serves `key` ('' for a standalone server, or a slot not known yet). */
  nodeOf(key: string): string;
  /** Sends `argv` (name first, every argument a string); resolves with the reply, rejects with what the library threw. */
  send(argv: readonly string[], options: SendOptions): Promise<unknown>;
  /** `WAIT replicas timeout` on the connection of `key`'s primary (the one the last write went on). */
  wait(key: string, replicas: number, timeoutMs: number, signal: AbortSignal): Promise<number>;
}
