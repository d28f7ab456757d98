// ioredis (5 and 6), through its public API only: a subclass of its exported
// `Command` class, sent with `sendCommand` (ioredis' own `Script` does the
// same to turn EVAL into EVALSHA). The subclass does the three things a module
// command needs that ioredis can't know from its fixed command table:
//
// - Routing. ioredis finds a command's keys in @ioredis/commands, where a
//   module command is missing: a Cluster sends it to a random primary (two in
//   three come back MOVED), `keyPrefix` is not applied and `scaleReads` never
//   sends XCLOAK.PEEK to a replica. The subclass answers `getKeys()` (which
//   `getSlot()` and a cluster pipeline read) with the call's key, the client's
//   `keyPrefix` put on by this file, and sets `readOnly` for a peek where the
//   limiter reads from replicas.
// - No re-send. ioredis writes a command again where it may already have run:
//   `autoResendUnfulfilledCommands` (default true) after a reconnect (even one
//   its own `commandTimeout` rejected), a Cluster's `retryDelayOnFailover` for
//   a command rejected with "Connection is closed.", and a cluster pipeline.
//   Every write goes through `toWritable`, so the subclass lets an ALLOW,
//   REFUND or EVALSHA/EVAL of a writing script be written once, and again only
//   after the server answered that write with an error reply (MOVED, ASK,
//   TRYAGAIN, CLUSTERDOWN, NOSCRIPT: nothing ran). A refused write rejects
//   with XcloakNotResentError (an outage for the policy) and writes a PING in
//   its place, so that the connection's replies stay in step.
// - Cancellation. A command still in ioredis' offline queue when the limiter's
//   deadline passes is never written: its first write is refused the same way.
//
// The version of the ioredis copy a client was made by is checked when a
// Limiter is built: majors 5 and 6 (SUPPORTED_IOREDIS; the suite runs on
// 5.11.1 and 6.0.0), anything else throws there, never at a call.

import * as path from 'node:path';
import { argumentError } from './validate.js';
import { keySlot } from './slot.js';
import { SCRIPTS } from './scripts.js';
import type { SendOptions, Transport } from './transport.js';

/** The ioredis majors this package works with (test.sh runs the transport suites on 5.11.1 and 6.0.0). */
export const SUPPORTED_IOREDIS: readonly number[] = [5, 6];

/** An ioredis `Redis` or `Cluster` (ioredis 5 or 6), as a Limiter uses it. */
export interface IoredisClient {
  readonly isCluster: boolean;
  readonly options: object;
  sendCommand(...args: any[]): unknown;
  duplicate(...args: any[]): unknown;
}

/** A write was refused a second time: it may have run already (see the top of this file). */
export class XcloakNotResentError extends Error {
  override readonly name = 'XcloakNotResentError';
  constructor(command: string) {
    super(
      `${command} was not sent again: the connection closed after it was written, or the limiter's deadline passed before it was, ` +
        'so it may have run on the server (xcloak never re-sends an ALLOW or REFUND that may have been applied)',
    );
  }
}

/** What ioredis writes in place of a refused command: one request, one reply, nothing applied. */
const PING = '*1\r\n$4\r\nPING\r\n';

/** The part of ioredis' public Command this file uses. */
interface IoCommand {
  readonly name: string;
  readonly args: unknown[];
  readonly promise: Promise<unknown>;
  reject: (error: Error) => void;
  getKeys(): Array<string | Buffer>;
  toWritable(socket: object): string | Buffer;
}
type CommandClass = new (name: string, args: unknown[], options?: Record<string, unknown>) => IoCommand;

/** An xcloak command for ioredis: routed by its key, never written twice when it writes. */
export interface XcloakIoCommand extends IoCommand {
  /** Refuses the command's first write if it has not happened yet (the limiter's deadline passed). */
  cancelIfUnwritten(): void;
}
type XcloakCommandClass = new (name: string, args: string[], key: string | undefined, readOnly: boolean, guarded: boolean) => XcloakIoCommand;

/** What was found of the ioredis copy a client was made by. */
export interface IoredisModule {
  readonly dir: string;
  readonly version: string;
  readonly XcloakCommand: XcloakCommandClass;
}

function isReply(error: unknown): boolean {
  return error instanceof Error && error.name === 'ReplyError';
}

function subclass(Command: CommandClass): XcloakCommandClass {
  return class XcloakCommand extends Command {
    private readonly routeKey: string | undefined;
    private readonly guarded: boolean;
    private written = false;
    private cancelled = false;
    private ownReject: ((error: Error) => void) | undefined;

    constructor(name: string, args: string[], key: string | undefined, readOnly: boolean, guarded: boolean) {
      super(name, args, { readOnly, replyEncoding: 'utf8' });
      this.routeKey = key;
      this.guarded = guarded;
    }

    override getKeys(): Array<string | Buffer> {
      return this.routeKey === undefined ? super.getKeys() : [this.routeKey];
    }

    override toWritable(socket: object): string | Buffer {
      if (!this.guarded) return super.toWritable(socket);
      if (this.written || this.cancelled) {
        this.reject(new XcloakNotResentError(this.name.toUpperCase()));
        return PING;
      }
      // Wrapped again whenever ioredis replaced `reject` (a Cluster does, to
      // follow redirections): an error reply proves nothing ran.
      if (this.reject !== this.ownReject) {
        const inner = this.reject;
        this.ownReject = (error: Error) => {
          if (isReply(error)) this.written = false;
          inner.call(this, error);
        };
        this.reject = this.ownReject;
      }
      this.written = true;
      return super.toWritable(socket);
    }

    cancelIfUnwritten(): void {
      if (!this.written) this.cancelled = true;
    }
  };
}

const byConstructor = new WeakMap<object, IoredisModule>();

/** The folder of the ioredis copy that defined `client`'s class, among the modules loaded (ioredis is CommonJS). */
function ioredisDirOf(client: object): string | undefined {
  const constructor = Object.getPrototypeOf(client)?.constructor;
  for (const [file, module] of Object.entries(require.cache)) {
    if (!module || !/[\\/]built[\\/](Redis|cluster[\\/]index)\.js$/.test(file)) continue;
    const exported = (module.exports as { default?: unknown })?.default;
    if (exported === constructor || (typeof exported === 'function' && client instanceof (exported as any))) {
      return file.slice(0, file.lastIndexOf(`${path.sep}built${path.sep}`));
    }
  }
  return undefined;
}

/** Finds the ioredis copy `client` was made by and checks its version: throws on an unsupported one. */
export function ioredisOf(client: object): IoredisModule {
  const constructor = Object.getPrototypeOf(client)?.constructor as object | undefined;
  const known = constructor && byConstructor.get(constructor);
  if (known) return known;
  const dir = ioredisDirOf(client);
  if (!dir) throw argumentError('client looks like an ioredis client, but no loaded ioredis module made it');
  const { name, version } = require(path.join(dir, 'package.json')) as { name: string; version: string };
  const major = Number(version.split('.')[0]);
  if (name !== 'ioredis' || !SUPPORTED_IOREDIS.includes(major)) {
    throw argumentError(`ioredis ${version} (${dir}) is not supported: xcloak works with ioredis ${SUPPORTED_IOREDIS.map((m) => `${m}.x`).join(' and ')}`);
  }
  const { Command } = require(dir) as { Command?: CommandClass };
  if (typeof Command !== 'function' || typeof Command.prototype.toWritable !== 'function' || typeof Command.prototype.getKeys !== 'function') {
    throw argumentError(`ioredis ${version} (${dir}) has no public Command class with getKeys and toWritable: not supported`);
  }
  const module: IoredisModule = { dir, version, XcloakCommand: subclass(Command) };
  if (constructor) byConstructor.set(constructor, module);
  return module;
}

/** Whether a command writes (ALLOW, REFUND, CONVERT, or the bundled script of either): then it is written at most once. */
function writes(argv: readonly string[]): boolean {
  const name = argv[0]!.toLowerCase();
  if (name === 'xcloak.allow' || name === 'xcloak.refund' || name === 'xcloak.convert') return true;
  if (name === 'evalsha') return argv[1] === SCRIPTS.allow.sha || argv[1] === SCRIPTS.refund.sha;
  if (name === 'eval') return argv[1] === SCRIPTS.allow.text || argv[1] === SCRIPTS.refund.text;
  return false;
}

/** Where the key is in `argv`: after `EVAL[SHA][_RO] script numkeys`, else the first argument. */
function keyIndex(argv: readonly string[]): number {
  return argv[0]!.toUpperCase().startsWith('EVAL') ? 3 : 1;
}

function keyPrefixOf(client: any): string {
  return typeof client.options?.keyPrefix === 'string' ? client.options.keyPrefix : '';
}

/**
 * An XCLOAK command for your own ioredis calls, routed and guarded as the
 * Limiter's are: `await cluster.sendCommand(xcloakCommand(cluster, ['XCLOAK.ALLOW', 'user:42', 60000, 100, 'DETAILS']))`,
 * or `pipeline.sendCommand(...)`. The client's `keyPrefix` goes on the key;
 * `XCLOAK.PEEK` may go to a replica (scaleReads); ALLOW, REFUND and CONVERT
 * are never written twice.
 */
export function xcloakCommand(client: IoredisClient, argv: readonly (string | number)[]): XcloakIoCommand {
  const module = ioredisOf(client);
  const args = argv.map(String);
  if (args.length < 2 || !/^xcloak\./i.test(args[0]!)) throw argumentError('xcloakCommand needs an XCLOAK.* command and its key');
  const key = keyPrefixOf(client) + args[1]!;
  args[1] = key;
  return new module.XcloakCommand(args[0]!, args.slice(1), key, args[0]!.toLowerCase() === 'xcloak.peek', writes(args));
}

/** The Limiter's transport over an ioredis `Redis` or `Cluster`. */
export class IoredisTransport implements Transport {
  readonly library = 'ioredis' as const;
  readonly cluster: boolean;
  readonly module: IoredisModule;
  /** The client's own `keyPrefix`: ioredis puts it on every key, the limiter's `prefix` included. */
  private readonly keyPrefix: string;
  /** ioredis decodes integers near 2^53 one off unless `stringNumbers` (see `exact`). */
  private readonly stringNumbers: boolean;
  private exactClient: any;

  constructor(private readonly client: any) {
    this.module = ioredisOf(client);
    this.cluster = client.isCluster === true;
    this.keyPrefix = keyPrefixOf(client);
    this.stringNumbers = (this.cluster ? client.options?.redisOptions?.stringNumbers : client.options?.stringNumbers) === true;
  }

  /**
   * The connection for a call whose reply may hold an integer near 2^53 (a
   * window or NOW of 2^52 and more): ioredis reads an integer as
   * `n * 10 + byte - 48`, which rounds past 2^53, so those replies go on a
   * duplicate of the client with `stringNumbers` (made on first use, closed
   * with the client), which reads them as exact text.
   */
  private exact(): any {
    if (this.stringNumbers) return this.client;
    if (!this.exactClient) {
      const exact = this.cluster ? this.client.duplicate([], { redisOptions: { stringNumbers: true } }) : this.client.duplicate({ stringNumbers: true });
      exact.on('error', () => {}); // each call's own promise reports its failure
      this.client.once('end', () => exact.disconnect());
      this.exactClient = exact;
    }
    return this.exactClient;
  }

  nodeOf(key: string): string {
    if (!this.cluster) return '';
    const nodes = this.client.slots?.[keySlot(this.keyPrefix + key)];
    return Array.isArray(nodes) && typeof nodes[0] === 'string' ? nodes[0] : '';
  }

  send(argv: readonly string[], options: SendOptions): Promise<unknown> {
    const client = options.exactIntegers ? this.exact() : this.client;
    const args = argv.slice(1);
    const at = keyIndex(argv) - 1;
    const key = this.keyPrefix + options.key;
    if (this.keyPrefix && at < args.length) args[at] = key;
    const command = new this.module.XcloakCommand(argv[0]!, args, key, options.readonly, writes(argv));
    options.deadline.onExpire(() => command.cancelIfUnwritten());
    return client.sendCommand(command) as Promise<unknown>;
  }

  async wait(key: string, replicas: number, timeoutMs: number, _deadline?: unknown, exactIntegers?: boolean): Promise<number> {
    // Routed by the key's slot: the connection of its primary, the one the write went on.
    const command = new this.module.XcloakCommand('WAIT', [String(replicas), String(timeoutMs)], this.cluster ? this.keyPrefix + key : undefined, false, false);
    const client = exactIntegers ? this.exact() : this.client;
    return Number(await client.sendCommand(command));
  }
}
