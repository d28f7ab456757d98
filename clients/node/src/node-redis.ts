// node-redis (the `redis` package, v6): a client from createClient() or a
// cluster from createCluster(). Connect it first (`await client.connect()`).
//
// No re-send (read in @redis/client 6.3.1's source, proven by test/faults):
// node-redis writes a command once. When the socket closes, every written,
// unanswered command is rejected (SocketClosedUnexpectedlyError) and never
// written again; commands not yet written wait in its offline queue for the
// reconnection. The limiter passes its deadline as the command's `timeout`,
// which removes a command from that queue while it is still unwritten, so
// nothing is written after the limiter answered. A cluster follows only MOVED
// and ASK, where nothing ran.

import { keySlot } from './slot.js';
import type { CallDeadline, SendOptions, Transport } from './transport.js';

/** A node-redis (the `redis` package, v6) client from createClient(), or a cluster from createCluster(), connected. */
export type NodeRedisClient =
  | { readonly isReady: boolean; sendCommand(...args: any[]): Promise<unknown> }
  | { readonly masters: readonly unknown[]; sendCommand(...args: any[]): Promise<unknown>; nodeClient(...args: any[]): unknown };

/** Whether `client` looks like a node-redis client or cluster (duck-typed: this package imports no client library). */
export function isNodeRedis(client: any): boolean {
  return typeof client?.sendCommand === 'function' && typeof client?.isCluster !== 'boolean' && ('isReady' in client || 'masters' in client);
}

// The limiter's deadline goes with every command as node-redis' own
// `timeout`, which removes a command from its offline queue while it is still
// unwritten (node-redis already gives every command a 5 s one by default, so
// this costs nothing more): nothing is written after the limiter answered.

// Integers as their decimal text where the reply may hold one near 2^53:
// node-redis decodes `number * 10 + byte - 48`, which rounds once the sum
// passes 2^53, so the integers within 57 of 2^53 - 1 (windows and stamps the
// contract carries exactly) would come back one off. Only then: the text
// costs more to decode.
const EXACT_INTEGERS = { 58: String }; // RESP_TYPES.NUMBER (':')

function commandOptions(deadline: CallDeadline, exact: boolean) {
  const timeout = Math.max(1, Math.ceil(deadline.at - performance.now()));
  return exact ? { timeout, typeMapping: EXACT_INTEGERS } : { timeout };
}

export class NodeRedisTransport implements Transport {
  readonly library = 'node-redis' as const;
  readonly cluster: boolean;

  constructor(private readonly client: any) {
    this.cluster = typeof client.nodeClient === 'function' && 'masters' in client;
  }

  nodeOf(key: string): string {
    if (!this.cluster) return '';
    return this.client.slots?.[keySlot(key)]?.master?.address ?? '';
  }

  send(argv: readonly string[], options: SendOptions): Promise<unknown> {
    const sendOptions = commandOptions(options.deadline, options.exactIntegers === true);
    if (this.cluster) return this.client.sendCommand(options.key, options.readonly, argv, sendOptions);
    return this.client.sendCommand(argv, sendOptions);
  }

  async wait(key: string, replicas: number, timeoutMs: number, deadline: CallDeadline): Promise<number> {
    const argv = ['WAIT', String(replicas), String(timeoutMs)];
    let connection = this.client;
    // Not cluster.sendCommand: node-redis fans WAIT out to every shard (its
    // command tips); it belongs on the connection of the key's primary.
    if (this.cluster) connection = await this.client.nodeClient(this.client.slots[keySlot(key)].master);
    return Number(await connection.sendCommand(argv, commandOptions(deadline, false)));
  }
}
