// What the Limiter needs from a client library: send one command to the node
// that serves a key, know which node that is (the fallback is chosen per
// node), and WAIT on that node's connection. One implementation per library:
// ioredis.ts (Redis, Cluster) and node-redis.ts (client, cluster).

/** The deadline of one limiter call, shared by its sends. */
export interface CallDeadline {
  /** When it passes, on performance.now()'s clock. */
  readonly at: number;
  /** An AbortSignal that aborts at the deadline (made on first use: it costs more than the call). */
  readonly signal: AbortSignal;
  /** Runs `cancel` at the deadline (at once if it passed): for what is still unwritten then. */
  onExpire(cancel: () => void): void;
}

export interface SendOptions {
  /** The key the command routes by, as the limiter built it (the client's own keyPrefix, if any, still to come). */
  readonly key: string;
  /** Only reads (PEEK): a client that reads from replicas may send it there. */
  readonly readonly: boolean;
  /** The limiter's deadline: a command not yet written then is never written. */
  readonly deadline: CallDeadline;
  /** The reply may hold integers near 2^53 (a huge window or NOW): decode them exactly (see node-redis.ts). */
  readonly exactIntegers?: boolean;
}

export interface Transport {
  readonly library: 'ioredis' | 'node-redis';
  readonly cluster: boolean;
  /** `host:port` of the primary that serves `key` ('' for a standalone server, or a slot not known yet). */
  nodeOf(key: string): string;
  /** Sends `argv` (name first, every argument a string); resolves with the reply, rejects with what the library threw. */
  send(argv: readonly string[], options: SendOptions): Promise<unknown>;
  /** `WAIT replicas timeout` on the connection of `key`'s primary that the write went on (`exactIntegers` as for it). */
  wait(key: string, replicas: number, timeoutMs: number, deadline: CallDeadline, exactIntegers?: boolean): Promise<number>;
}
