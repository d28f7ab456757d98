// Real redis-server processes on loopback for the suite: standalone servers
// with or without the module, primary + replica, 3+3 clusters (the module on
// every node or only on some), pause/resume (SIGSTOP/SIGCONT), MONITOR, and a
// TCP proxy whose connections a test can cut. Ports come from this package's
// slice (22000-22499, cluster bus = port + 10000), each checked free.
// Everything started here is stopped by `stopAll()` (the suites call it in
// `after`) and on process exit.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, existsSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import Redis from 'ioredis';

const here = path.dirname(fileURLToPath(import.meta.url));
export const packageDir = path.join(here, '..');
export const repoDir = process.env.XCLOAK_REPO || path.join(packageDir, '../..');
export const MODULE = process.env.XCLOAK_MODULE || path.join(repoDir, 'target/release/libxcloak.so');
export const SERVER = process.env.XCLOAK_SERVER || 'redis-server';
export const VECTORS = JSON.parse(readFileSync(path.join(repoDir, 'clients/conformance/vectors.json'), 'utf8'));

/** The server binary's major version (`redis-server --version`: "v=7.0.15"; Valkey answers the same way). */
export const SERVER_MAJOR = Number(/v=(\d+)/.exec(spawnSync(SERVER, ['--version'], { encoding: 'utf8' }).stdout ?? '')?.[1] ?? 0);

const PORT_LO = 22000;
const PORT_HI = 22499;
const started = new Set();
const taken = new Set();

function portFree(port) {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/** A free port of this package's slice whose cluster bus port (+10000) is free too. */
export async function freePort() {
  for (let attempt = 0; attempt < 500; attempt++) {
    const port = PORT_LO + Math.floor(Math.random() * (PORT_HI - PORT_LO + 1));
    if (taken.has(port)) continue;
    if ((await portFree(port)) && (await portFree(port + 10000))) {
      taken.add(port);
      return port;
    }
  }
  throw new Error(`no free port in ${PORT_LO}..${PORT_HI}`);
}

export async function waitFor(what, check, ms = 20000) {
  const until = Date.now() + ms;
  for (;;) {
    try {
      if (await check()) return;
    } catch {
      // not yet
    }
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

/** One redis-server on 127.0.0.1. `module: false` starts it without xcloak (the fallback's server). */
export class Server {
  constructor(port, dir, args, module) {
    this.port = port;
    this.dir = dir;
    this.args = args;
    this.module = module;
    this.host = '127.0.0.1';
    this.address = `127.0.0.1:${port}`;
    this.url = `redis://127.0.0.1:${port}`;
  }

  static async start({ module = true, args = [] } = {}) {
    const port = await freePort();
    const dir = mkdtempSync(path.join(os.tmpdir(), `xcloak-node-${port}-`));
    const server = new Server(port, dir, args, module);
    await server.spawn();
    return server;
  }

  async spawn() {
    const argv = ['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir, '--save', '', '--appendonly', 'no', '--logfile', 'server.log', '--repl-diskless-sync-delay', '0'];
    if (this.module) argv.push('--loadmodule', MODULE);
    // MODULE LOAD at run time (the re-probe tests); the option exists from 7.0.
    if (SERVER_MAJOR >= 7) argv.push('--enable-module-command', 'yes');
    argv.push(...this.args);
    if (!existsSync(MODULE) && this.module) throw new Error(`the module is not built: ${MODULE} (make build)`);
    this.process = spawn(SERVER, argv, { stdio: 'ignore', cwd: this.dir });
    started.add(this);
    const exited = new Promise((resolve) => this.process.once('exit', resolve));
    this.exited = exited;
    await waitFor(`redis-server on ${this.port}`, async () => {
      if (this.process.exitCode !== null) throw new Error(`redis-server exited: ${this.log()}`);
      const c = await this.connectAdmin();
      try {
        return (await c.ping()) === 'PONG';
      } finally {
        c.disconnect();
      }
    });
    this.admin = await this.connectAdmin();
  }

  async connectAdmin() {
    const c = new Redis({ port: this.port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null });
    c.on('error', () => {});
    await c.connect();
    return c;
  }

  log() {
    try {
      return readFileSync(path.join(this.dir, 'server.log'), 'utf8').split('\n').slice(-30).join('\n');
    } catch {
      return '(no log)';
    }
  }

  /** `INFO section` as a map of fields. */
  async info(section) {
    const text = await this.admin.info(section);
    return Object.fromEntries(text.split('\r\n').filter((l) => l.includes(':')).map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 1)]));
  }

  /** How many times the server ran `command` (INFO commandstats), e.g. 'xcloak.allow', 'evalsha'. */
  async calls(command) {
    const stats = await this.info('commandstats');
    const line = stats[`cmdstat_${command.toLowerCase()}`];
    return line ? Number(/calls=(\d+)/.exec(line)[1]) : 0;
  }

  async errorCount(code) {
    const stats = await this.info('errorstats');
    const line = stats[`errorstat_${code}`];
    return line ? Number(/count=(\d+)/.exec(line)[1]) : 0;
  }

  async resetStats() {
    await this.admin.call('CONFIG', 'RESETSTAT');
  }

  async version() {
    const { redis_version: version } = await this.info('server');
    return version.split('.').map(Number);
  }

  pause() {
    this.process.kill('SIGSTOP');
  }

  resume() {
    this.process.kill('SIGCONT');
  }

  async stop() {
    if (!this.process || this.process.exitCode !== null) return;
    this.admin?.disconnect();
    this.process.kill('SIGCONT');
    this.process.kill('SIGKILL');
    await this.exited;
    started.delete(this);
  }

  /** Starts it again on the same port and folder (the module as before unless given). */
  async restart({ module = this.module } = {}) {
    await this.stop();
    this.module = module;
    await this.spawn();
  }

  async destroy() {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A Redis Cluster of `primaries` + `primaries * replicas` nodes; `module(i)` says whether node i loads xcloak. */
export class Cluster {
  static async start({ primaries = 3, replicas = 1, module = () => true } = {}) {
    const total = primaries * (1 + replicas);
    const nodes = [];
    for (let i = 0; i < total; i++) {
      nodes.push(
        await Server.start({
          module: module(i),
          args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '5000', '--repl-ping-replica-period', '1'],
        }),
      );
    }
    const cluster = new Cluster(nodes, primaries, replicas);
    const create = spawnSync(
      'redis-cli',
      ['--cluster', 'create', ...nodes.map((n) => n.address), '--cluster-replicas', String(replicas), '--cluster-yes'],
      { encoding: 'utf8' },
    );
    if (create.status !== 0) throw new Error(`redis-cli --cluster create failed:\n${create.stdout}\n${create.stderr}`);
    await cluster.waitReady();
    return cluster;
  }

  constructor(nodes, primaries, replicas) {
    this.nodes = nodes;
    this.primaryCount = primaries;
    this.replicasPerPrimary = replicas;
  }

  async waitReady() {
    for (const node of this.nodes) {
      await waitFor(`cluster node ${node.port} ready`, async () => {
        const info = Object.fromEntries(
          (await node.admin.call('CLUSTER', 'INFO')).split('\r\n').filter(Boolean).map((l) => l.split(':')),
        );
        if (info.cluster_state !== 'ok' || info.cluster_known_nodes !== String(this.nodes.length)) return false;
        const repl = await node.info('replication');
        if (repl.role === 'slave' && repl.master_link_status !== 'up') return false;
        // Every range lists its replicas (a client reading the map earlier has none to read from).
        const slots = await node.admin.call('CLUSTER', 'SLOTS');
        return slots.length > 0 && slots.every((range) => range.length >= 3 + this.replicasPerPrimary);
      }, 60000);
    }
  }

  async primaries() {
    const out = [];
    for (const node of this.nodes) if ((await node.info('replication')).role === 'master') out.push(node);
    return out;
  }

  async replicas() {
    const out = [];
    for (const node of this.nodes) if ((await node.info('replication')).role === 'slave') out.push(node);
    return out;
  }

  /** The node (a primary) that owns the slot of `key`. */
  async ownerOf(key) {
    const slot = await this.nodes[0].admin.call('CLUSTER', 'KEYSLOT', key);
    const ranges = await this.nodes[0].admin.call('CLUSTER', 'SLOTS');
    const range = ranges.find(([lo, hi]) => slot >= lo && slot <= hi);
    return this.nodes.find((n) => n.port === range[2][1]);
  }

  async sum(method, ...args) {
    let total = 0;
    for (const node of this.nodes) total += await node[method](...args);
    return total;
  }

  async resetStats() {
    for (const node of this.nodes) await node.resetStats();
  }

  /** Until every replica holds what its primary acknowledged so far (WAIT on each primary). */
  async waitReplicated() {
    for (const primary of await this.primaries()) await primary.admin.call('WAIT', String(this.replicasPerPrimary), '5000');
  }

  async destroy() {
    for (const node of this.nodes) await node.destroy();
  }
}

/** MONITOR on a server: every command it runs from a client, in order, as argv arrays. */
export class Monitor {
  static async start(server) {
    const monitor = new Monitor();
    monitor.connection = await server.admin.monitor();
    monitor.lines = [];
    monitor.connection.on('monitor', (time, args, source) => {
      if (source !== 'lua') monitor.lines.push({ args: args.map(String), source });
    });
    monitor.server = server;
    await monitor.barrier();
    return monitor;
  }

  /**
   * Waits until everything sent before now shows; returns the commands since
   * the previous barrier, minus the admin's and a new connection's handshake
   * (HELLO, INFO, CLIENT SETINFO, SELECT). With `sources`: `{ args, source }`
   * each, `source` the client's address (one per connection).
   */
  async barrier({ sources = false } = {}) {
    const token = `xcloak-barrier-${Math.random()}`;
    await this.server.admin.echo(token);
    await waitFor('the monitor barrier', () => this.lines.some((l) => l.args[0]?.toUpperCase() === 'ECHO' && l.args[1] === token), 10000);
    const end = this.lines.findIndex((l) => l.args[1] === token);
    const adminSource = this.lines[end].source;
    const handshake = new Set(['HELLO', 'INFO', 'CLIENT', 'SELECT']);
    const seen = this.lines
      .slice(0, end)
      .filter((l) => l.source !== adminSource && !handshake.has(l.args[0]?.toUpperCase()))
      .map((l) => (sources ? l : l.args));
    this.lines = this.lines.slice(end + 1);
    return seen;
  }

  stop() {
    this.connection.disconnect();
  }
}

/** A TCP proxy to `port`: connect clients to `proxy.port`; `cut()` destroys every connection it carries. */
export class Proxy {
  static async start(targetPort) {
    const proxy = new Proxy();
    proxy.sockets = new Set();
    proxy.server = net.createServer((client) => {
      const upstream = net.connect(targetPort, '127.0.0.1');
      proxy.sockets.add(client);
      proxy.sockets.add(upstream);
      client.pipe(upstream);
      upstream.pipe(client);
      const close = () => {
        client.destroy();
        upstream.destroy();
        proxy.sockets.delete(client);
        proxy.sockets.delete(upstream);
      };
      client.on('error', close).on('close', close);
      upstream.on('error', close).on('close', close);
    });
    proxy.port = await freePort();
    await new Promise((resolve) => proxy.server.listen(proxy.port, '127.0.0.1', resolve));
    return proxy;
  }

  cut() {
    for (const socket of this.sockets) socket.destroy();
    this.sockets.clear();
  }

  async stop() {
    this.cut();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

export async function stopAll() {
  for (const server of [...started]) await server.destroy();
}

process.on('exit', () => {
  for (const server of started) {
    try {
      server.process.kill('SIGCONT');
      server.process.kill('SIGKILL');
    } catch {
      // gone
    }
  }
});
