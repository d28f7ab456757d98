// ioredis: where XCLOAK commands' keys are, which of them only read, and that
// an ALLOW or REFUND that may have reached the server is never sent again.
//
//   import Redis from 'ioredis';
//   import { install } from 'xcloak/ioredis';
//   install();                          // once, before the first call; a Limiter does it itself
//   const cluster = new Redis.Cluster([{ host, port }], { scaleReads: 'slave' });
//   await cluster.call('xcloak.allow', 'rl:user:42', 60000, 100, 'DETAILS');
//
// Routing. ioredis finds a command's keys, and whether it is read-only, only in
// the fixed table of @ioredis/commands. A module command is missing there, so a
// Cluster sends it to a random primary (two calls in three come back MOVED), a
// pipeline or auto-pipeline returns those MOVED errors to the caller,
// `keyPrefix` is not applied to its key and `scaleReads` never sends
// XCLOAK.PEEK to a replica. ioredis has no public hook for this (`defineCommand`
// is for Lua scripts), so `install` wraps the three lookups of that table that
// ioredis calls (`exists`, `hasFlag`, `getKeyIndexes`): for the names in
// XCLOAK_COMMANDS they answer from this file, for every other command they ask
// the original. Every path of ioredis goes through them: `Command` (routing and
// keyPrefix), `Pipeline`, auto-pipelining and the `scaleReads` choice.
//
// No re-send. ioredis sends a command again in three cases where it may
// already have run (read in ioredis 6.0.0's source, proven by test/faults):
//   - `autoResendUnfulfilledCommands` (default true): on reconnect, every
//     command written but unanswered when the connection closed is written again
//     (an `ioredis` `commandTimeout` rejects the caller but leaves the command
//     queued for that re-send);
//   - Cluster `retryDelayOnFailover` (default 100 ms): a command rejected with
//     "Connection is closed." (which includes the written, unanswered ones when
//     a node's connection ends) is sent again to the cluster;
//   - Cluster pipelines: the same, for a whole pipeline.
// `maxRetriesPerRequest` itself re-sends nothing: it only bounds how many
// reconnections a queued command waits through. `install` wraps
// `Redis.prototype.sendCommand` (which every one of those paths calls, a
// Cluster's node connections included) so that XCLOAK.ALLOW, XCLOAK.REFUND and
// EVALSHA/EVAL of the bundled writing scripts are written at most once unless
// the server answered the previous write with an error reply (MOVED, ASK,
// TRYAGAIN, CLUSTERDOWN, NOSCRIPT: nothing ran, so ioredis' redirections still
// work). A refused re-send rejects with XcloakNotResentError, which a Limiter
// answers with its error policy. Other commands are untouched.
//
// That reaches inside ioredis, so `install` accepts only the versions it was
// tested with (TESTED below) and throws on others, then checks that the lookups
// really changed.

import * as path from 'node:path';
import { SCRIPTS } from './scripts.js';
import { keySlot } from './slot.js';
import type { SendOptions, Transport } from './transport.js';

/**
 * Every xcloak command: the position of its key (1 = the first argument, as in
 * COMMAND INFO) and whether it only reads (then `scaleReads` may send it to a
 * replica). Add a command here and ioredis routes it.
 */
export const XCLOAK_COMMANDS: Readonly<Record<string, { readonly key: number; readonly readonly: boolean }>> = {
  'xcloak.allow': { key: 1, readonly: false },
  'xcloak.peek': { key: 1, readonly: true },
  'xcloak.refund': { key: 1, readonly: false },
  'xcloak.convert': { key: 1, readonly: false },
};

/** Versions this file was tested with (clients/node/test.sh runs the suite on them). */
export const TESTED: Readonly<Record<string, readonly string[]>> = {
  ioredis: ['6.0.0'],
  '@ioredis/commands': ['2.0.0'],
};

export interface InstallOptions {
  /** A folder from which `ioredis` resolves (default: the copy the app loaded, else the one resolved from here). */
  readonly from?: string;
  /** Install into an untested version anyway (a warning instead of the error). The self-check still runs. */
  readonly allowUntested?: boolean;
}

/** A write was refused a second time: it may have run already (see the top of this file). */
export class XcloakNotResentError extends Error {
  override readonly name = 'XcloakNotResentError';
  constructor(command: string) {
    super(
      `${command} was not sent again: the connection closed after it was written, so it may have run on the server ` +
        '(xcloak never re-sends an ALLOW or REFUND that may have been applied)',
    );
  }
}

const INSTALLED = Symbol.for('xcloak.ioredis.installed');
const GUARD = Symbol.for('xcloak.ioredis.guard');

interface GuardState {
  written: boolean;
  cancelled: boolean;
}

// Loose shapes of ioredis internals this file touches (ioredis 6.0.0).
interface IoCommand {
  name: string;
  args: unknown[];
  promise: Promise<unknown>;
  reject: ((error: Error) => void) & { [GUARD]?: true };
  [GUARD]?: GuardState;
}
interface IoStream {
  isPipeline?: boolean;
  write(data: string): void;
}
type SendCommand = (this: { commandQueue: { peekBack(): { command: unknown } | undefined } }, command: IoCommand, stream?: IoStream) => unknown;
interface CommandsModule {
  exists(name: string, options?: unknown): boolean;
  hasFlag(name: string, flag: string, options?: unknown): boolean;
  getKeyIndexes(name: string, args: unknown[], options?: unknown): number[];
  [INSTALLED]?: true;
}

/** What `install` found: the ioredis module, its folder and its Command class. */
export interface IoredisModule {
  readonly dir: string;
  readonly version: string;
  readonly Redis: new (...args: any[]) => any;
  readonly Cluster: new (...args: any[]) => any;
  readonly Command: new (name: string, args: unknown[], options?: Record<string, unknown>) => any;
}

const installedModules = new Map<string, IoredisModule>();

function spec(name: unknown) {
  const lower = String(name).toLowerCase();
  return Object.prototype.hasOwnProperty.call(XCLOAK_COMMANDS, lower) ? XCLOAK_COMMANDS[lower] : undefined;
}

function packageDir(name: string, fromDir: string): string {
  return path.dirname(require.resolve(`${name}/package.json`, { paths: [fromDir] }));
}

function checkVersion(name: string, dir: string, allowUntested: boolean): string {
  const { version } = require(path.join(dir, 'package.json')) as { version: string };
  const tested = TESTED[name] ?? [];
  if (!tested.includes(version)) {
    const message =
      `xcloak/ioredis: ${name} ${version} is not a tested version (tested: ${tested.join(', ')}). ` +
      'This helper wraps functions inside it: test it with this version, then add the version to TESTED.';
    if (!allowUntested) throw new Error(message);
    process.emitWarning(message, { code: 'XCLOAK_IOREDIS_UNTESTED' });
  }
  return version;
}

/** Whether a command is one ioredis must never write twice: ALLOW, REFUND, or the bundled script of either. */
function isGuarded(command: IoCommand): boolean {
  const name = String(command.name).toLowerCase();
  if (name === 'xcloak.allow' || name === 'xcloak.refund') return true;
  if (name === 'evalsha' || name === 'eval') {
    const first = String(command.args[0]);
    return name === 'evalsha'
      ? first === SCRIPTS.allow.sha || first === SCRIPTS.refund.sha
      : first === SCRIPTS.allow.text || first === SCRIPTS.refund.text;
  }
  return false;
}

function isReply(error: unknown): boolean {
  return error instanceof Error && error.name === 'ReplyError';
}

function guardSendCommand(original: SendCommand): SendCommand {
  return function guardedSendCommand(this: any, command: IoCommand, stream?: IoStream) {
    if (!command || !isGuarded(command)) return original.call(this, command, stream);
    let state = command[GUARD];
    if (!state) {
      state = { written: false, cancelled: false };
      command[GUARD] = state;
    }
    if (state.written || state.cancelled) {
      // A pipeline's writer counts one write per command before it flushes.
      if (stream && stream.isPipeline) stream.write('');
      command.reject(new XcloakNotResentError(String(command.name).toUpperCase()));
      return command.promise;
    }
    // An error reply proves nothing ran: the next send (a redirection) may go.
    // Wrapped again after a Pipeline's initPromise() replaced `reject`.
    if (!command.reject[GUARD]) {
      const reject = command.reject;
      const wrapped = Object.assign(
        (error: Error) => {
          if (isReply(error)) state.written = false;
          reject.call(command, error);
        },
        { [GUARD]: true as const },
      );
      command.reject = wrapped;
    }
    const result = original.call(this, command, stream);
    const last = this.commandQueue?.peekBack?.();
    if (last && last.command === command) state.written = true;
    return result;
  };
}

/** Marks a command created by a Limiter so that, once its deadline passed unwritten, it is never written. */
export function cancelIfUnwritten(command: IoCommand): void {
  let state = command[GUARD];
  if (!state) {
    state = { written: false, cancelled: false };
    command[GUARD] = state;
  }
  if (!state.written) state.cancelled = true;
}

/** Finds the folder of the ioredis copy `client` (a Redis or Cluster) was made by, among the modules loaded. */
export function ioredisDirOf(client: object): string | undefined {
  const constructor = Object.getPrototypeOf(client)?.constructor;
  for (const [file, module] of Object.entries(require.cache)) {
    if (!module || !/[\\/]ioredis[\\/]built[\\/](Redis|cluster[\\/]index)\.js$/.test(file)) continue;
    const exported = (module.exports as { default?: unknown })?.default;
    if (exported === constructor || (typeof exported === 'function' && client instanceof (exported as any))) {
      return file.slice(0, file.lastIndexOf(`${path.sep}built${path.sep}`));
    }
  }
  return undefined;
}

function resolveDir(from: string | undefined): string {
  if (from) return packageDir('ioredis', from);
  for (const candidate of [process.cwd(), __dirname]) {
    try {
      return packageDir('ioredis', candidate);
    } catch {
      // try the next
    }
  }
  throw new Error("xcloak/ioredis: cannot resolve 'ioredis' (install it, or pass install({ from }))");
}

/**
 * Installs the routing of XCLOAK_COMMANDS and the no-re-send guard into the
 * ioredis found from `options.from` (default: resolved from the app's folder,
 * then from this package). Idempotent. Throws on an untested ioredis.
 */
export function install(options: InstallOptions = {}): IoredisModule {
  const ioredisDir = resolveDir(options.from);
  return installInto(ioredisDir, options.allowUntested ?? false);
}

/** `install` into a given ioredis folder (a Limiter passes the copy its client came from). */
export function installInto(ioredisDir: string, allowUntested = false): IoredisModule {
  const known = installedModules.get(ioredisDir);
  if (known) return known;
  const commandsDir = packageDir('@ioredis/commands', ioredisDir);
  const version = checkVersion('ioredis', ioredisDir, allowUntested);
  checkVersion('@ioredis/commands', commandsDir, allowUntested);

  // The same module instances ioredis uses (resolved from ioredis's folder).
  const commands = require(commandsDir) as CommandsModule;
  if (!commands[INSTALLED]) {
    const { exists, hasFlag, getKeyIndexes } = commands;
    commands.exists = (name, opts) => spec(name) !== undefined || exists(name, opts);
    commands.hasFlag = (name, flag, opts) => {
      const command = spec(name);
      if (command === undefined) return hasFlag(name, flag, opts);
      return flag === (command.readonly ? 'readonly' : 'write');
    };
    commands.getKeyIndexes = (name, args, opts) => {
      const command = spec(name);
      if (command === undefined) return getKeyIndexes(name, args, opts);
      return args.length >= command.key ? [command.key - 1] : [];
    };
    commands[INSTALLED] = true;
  }
  const ioredis = require(ioredisDir) as { Redis: any; Cluster: any; Command: any };
  const proto = ioredis.Redis.prototype as { sendCommand: SendCommand; [INSTALLED]?: true };
  if (!proto[INSTALLED]) {
    proto.sendCommand = guardSendCommand(proto.sendCommand);
    proto[INSTALLED] = true;
  }

  // Fail now, not with MOVED later, if ioredis stopped reading the table
  // through these exports.
  const probe = new ioredis.Command('xcloak.peek', ['k', 1, 1], { keyPrefix: 'p:' });
  if (probe.getKeys()[0] !== 'p:k' || probe.args[0] !== 'p:k') {
    throw new Error('xcloak/ioredis: ioredis did not take the XCLOAK key positions; this version is not supported');
  }
  const module: IoredisModule = { dir: ioredisDir, version, Redis: ioredis.Redis, Cluster: ioredis.Cluster, Command: ioredis.Command };
  installedModules.set(ioredisDir, module);
  return module;
}

/** The Limiter's transport over an ioredis `Redis` or `Cluster` (installs the routing and the guard first). */
export class IoredisTransport implements Transport {
  readonly library = 'ioredis' as const;
  readonly cluster: boolean;
  private readonly module: IoredisModule;
  /** The client's own `keyPrefix`: ioredis puts it on every key, the limiter's `prefix` included. */
  private readonly keyPrefix: string;
  private readonly autoPipelining: boolean;
  /** ioredis decodes integers near 2^53 one off unless `stringNumbers` (see `exact`). */
  private readonly stringNumbers: boolean;
  private exactClient: any;

  constructor(private readonly client: any, options: InstallOptions = {}) {
    const dir = options.from ? packageDir('ioredis', options.from) : (ioredisDirOf(client) ?? resolveDir(undefined));
    this.module = installInto(dir, options.allowUntested ?? false);
    if (!(client instanceof this.module.Redis) && !(client instanceof this.module.Cluster)) {
      throw new Error(
        `xcloak: this ioredis client was not made by the ioredis in ${dir}; pass { ioredis: { from } } naming the folder its ioredis resolves from`,
      );
    }
    this.cluster = client.isCluster === true;
    this.keyPrefix = typeof client.options?.keyPrefix === 'string' ? client.options.keyPrefix : '';
    this.autoPipelining = client.options?.enableAutoPipelining === true;
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
    const [name, ...args] = argv as [string, ...string[]];
    const client = options.exactIntegers ? this.exact() : this.client;
    // With auto-pipelining on, `call` puts the command in the current
    // auto-pipeline (the guard still refuses a re-send); else the limiter's
    // own Command, which its deadline can cancel while it is still unwritten.
    // Lowercase: the Cluster's read-only check (scaleReads) looks names up case-sensitively.
    if (this.autoPipelining) return client.call(name.toLowerCase(), ...args);
    const command = new this.module.Command(name, args, {
      keyPrefix: this.keyPrefix || undefined,
      readOnly: options.readonly,
      replyEncoding: 'utf8',
    });
    options.deadline.onExpire(() => cancelIfUnwritten(command));
    return client.sendCommand(command) as Promise<unknown>;
  }

  async wait(key: string, replicas: number, timeoutMs: number, _deadline?: unknown, exactIntegers?: boolean): Promise<number> {
    const command = new this.module.Command('WAIT', [String(replicas), String(timeoutMs)], { replyEncoding: 'utf8' });
    const client = exactIntegers ? this.exact() : this.client;
    let connection = client;
    if (this.cluster) {
      const nodeKey = this.nodeOf(key);
      connection = client.connectionPool?.getInstanceByKey?.(nodeKey);
      if (!connection) throw new Error(`no connection to ${nodeKey || "the key's node"} for WAIT`);
    }
    return Number(await connection.sendCommand(command));
  }
}
