// Opening and closing the clients the suites drive, the same way for ioredis
// and node-redis (library defaults unless a test passes options).
// XCLOAK_TEST_IOREDIS names the ioredis package the suites drive: `ioredis`
// (6.0.0, the default) or `ioredis5` (5.11.1, an npm alias in
// devDependencies); test.sh runs the transport suites on both.
import { createRequire } from 'node:module';
import { createClient, createCluster } from 'redis';

const require = createRequire(import.meta.url);
export const IOREDIS_PACKAGE = process.env.XCLOAK_TEST_IOREDIS || 'ioredis';
/** The ioredis under test: its Redis class (Redis.Cluster too) and its version. */
export const Redis = require(IOREDIS_PACKAGE).default;
export const IOREDIS_VERSION = require(`${IOREDIS_PACKAGE}/package.json`).version;

export const LIBRARIES = ['ioredis', 'node-redis'];

export async function connect(library, port, options = {}) {
  if (library === 'ioredis') {
    const client = new Redis({ port, host: '127.0.0.1', ...options });
    client.on('error', () => {});
    await new Promise((resolve, reject) => {
      client.once('ready', resolve);
      setTimeout(() => reject(new Error(`ioredis did not connect to ${port}`)), 5000).unref();
    });
    return client;
  }
  const client = createClient({ url: `redis://127.0.0.1:${port}`, ...options });
  client.on('error', () => {});
  await client.connect();
  return client;
}

export async function connectCluster(library, seedPort, options = {}) {
  if (library === 'ioredis') {
    const { redisOptions, ...rest } = options;
    const cluster = new Redis.Cluster([{ host: '127.0.0.1', port: seedPort }], { redisOptions, ...rest });
    cluster.on('error', () => {});
    await new Promise((resolve, reject) => {
      cluster.once('ready', resolve);
      setTimeout(() => reject(new Error('ioredis Cluster not ready')), 10000).unref();
    });
    return cluster;
  }
  const cluster = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${seedPort}` }], ...options });
  cluster.on('error', () => {});
  await cluster.connect();
  return cluster;
}

/** Closes without waiting on a server that may be paused or gone. */
export async function close(client) {
  try {
    if (typeof client.isCluster === 'boolean') client.disconnect();
    else await client.destroy();
  } catch {
    // already closed
  }
}

/** A raw command through the library (not the Limiter). */
export function raw(client, argv) {
  if (typeof client.isCluster === 'boolean') return client.call(...argv);
  if ('masters' in client) return client.sendCommand(argv[1], false, argv); // a node-redis cluster routes by the key
  return client.sendCommand(argv);
}
