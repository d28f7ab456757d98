// The packed tarball as a new user meets it: a plain `npm pack` builds dist/
// (the prepack script), and the tarball installs into a fresh CommonJS
// TypeScript project ("module": "commonjs", node10 resolution: typesVersions
// finds every entry point) and a fresh ESM one (TypeScript "nodenext", and
// plain .mjs), from the local npm cache, compiles with tsc and makes a call
// against a live server. TypeScript refuses what is no client
// (`new Limiter(42)`, a @ts-expect-error that tsc checks). The README's first
// example runs as written. The Lua copies are byte-identical to src/lua/.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { SCRIPTS } from 'xcloak';
import { Server, packageDir, repoDir, stopAll } from './harness.mjs';

const ENTRIES = ['xcloak', 'xcloak/ioredis', 'xcloak/express', 'xcloak/fastify', 'xcloak/rate-limiter-flexible', 'xcloak/express-rate-limit'];
const lock = JSON.parse(readFileSync(path.join(packageDir, 'package-lock.json'), 'utf8')).packages;
/** The versions this package is tested with, as a user would install them. */
const pinned = (name) => `${name}@${lock[`node_modules/${name}`].version}`;
const PEERS = ['ioredis', 'redis', 'express', 'fastify', 'rate-limiter-flexible', 'express-rate-limit', 'typescript', '@types/node', '@types/express'].map(pinned);

let tmp;
let tarball;
let files;
let server;

before(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'xcloak-node-package-'));
  const out = execFileSync('npm', ['pack', '--json', '--pack-destination', tmp], { cwd: packageDir, encoding: 'utf8' });
  const [{ filename, files: packed }] = JSON.parse(out);
  tarball = path.join(tmp, filename);
  files = packed.map((f) => f.path);
  server = await Server.start();
});
after(async () => {
  rmSync(tmp, { recursive: true, force: true });
  await stopAll();
});

/** A fresh project in `name` with the tarball and the peers installed (from the npm cache where it has them). */
function project(name, packageJson) {
  const dir = path.join(tmp, name);
  execFileSync('mkdir', ['-p', dir]);
  writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name, private: true, ...packageJson }));
  execFileSync('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error', tarball, ...PEERS], { cwd: dir, encoding: 'utf8' });
  return dir;
}

function tsc(dir, installed = dir) {
  try {
    execFileSync(process.execPath, [path.join(installed, 'node_modules/typescript/bin/tsc'), '-p', dir], { cwd: dir, encoding: 'utf8' });
  } catch (error) {
    assert.fail(`tsc in ${path.basename(dir)}:\n${error.stdout}${error.stderr}`);
  }
}

const run = (dir, file) =>
  execFileSync(process.execPath, [file], { cwd: dir, encoding: 'utf8', env: { ...process.env, REDIS_URL: server.url, CHECK_KEY: `package:${path.basename(dir)}:${file}` } });

/** TypeScript that both projects compile: every entry point, the real client types accepted, anything else refused. */
const TYPED = `
const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const limiter = new Limiter(redis, { onError: 'raise', timeout: 5000 });
void new Limiter(new Redis.Cluster([{ host: '127.0.0.1', port: 7000 }], { lazyConnect: true }));
void new Limiter(createClient());
void new Limiter(createCluster({ rootNodes: [] }));
// Types only (never called: at run time the refusals would throw XcloakError, code 'ARGUMENT').
export function refused(): void {
  // @ts-expect-error: a number is no client
  void new Limiter(42);
  // @ts-expect-error: nor is a URL
  void new Limiter('redis://127.0.0.1:6379');
  // @ts-expect-error: onError is 'raise' | 'allow' | 'deny'
  void new Limiter(redis, { onError: 'open' });
  // @ts-expect-error: the old name is gone
  void new Limiter(redis, { errorPolicy: 'deny' });
  // @ts-expect-error: tiers, not teirs
  void limiter.allow('k', 60_000, 10, { teirs: [[3_600_000, 100]] });
  // @ts-expect-error: blockCache is a number of entries
  void new Limiter(redis, { blockCache: '100' });
  // @ts-expect-error: stats is read-only (a getter)
  limiter.stats = { cacheHits: 0, cacheEntries: 0 };
  const fields: Record<string, string> = headers({} as Decision, { style: 'both' });
  void fields;
}
void expressRateLimit({ limiter, limits: [{ name: 'ip', window: 60_000, limit: 100 }] });
void fastifyRateLimit({ limiter, limits: { window: 60_000, limit: 100 } });
void new RateLimiterXcloak({ limiter, points: 10, duration: 60 });
void new XcloakStore({ limiter });
void xcloakCommand;
const saved: Stats = new Limiter(redis, { blockCache: 100 }).stats;
const via: Decision['via'] = 'cache';
void [saved.cacheHits, saved.cacheEntries, via];
async function main(): Promise<void> {
  const d: Decision = await limiter.allow(process.env.CHECK_KEY ?? 'package:check', 60_000, 10, { cost: 2, tiers: [[3_600_000, 100]], stamp: true });
  console.log(JSON.stringify({ allowed: d.allowed, remaining: d.remaining, via: d.via, stamp: typeof d.stamp }));
  redis.disconnect();
}
void main();
`;
const EXPECTED = { allowed: true, remaining: 8, via: 'command', stamp: 'number' };

describe('the npm pack tarball', () => {
  test('a plain npm pack ships dist/ (JS, .d.ts, ESM wrappers), lua/ and the README, and nothing of the tests', () => {
    for (const f of ['README.md', 'package.json', 'lua/xcloak_allow.lua', 'lua/xcloak_peek.lua', 'lua/xcloak_refund.lua']) assert.ok(files.includes(f), f);
    for (const entry of ['index', 'ioredis', 'express', 'fastify', 'rate-limiter-flexible', 'express-rate-limit']) {
      for (const ext of ['.js', '.d.ts', '.mjs', '.d.mts']) assert.ok(files.includes(`dist/${entry}${ext}`), `dist/${entry}${ext}`);
    }
    // The block cache: no entry point of its own; index.d.ts imports its Stats.
    for (const f of ['dist/block-cache.js', 'dist/block-cache.d.ts']) assert.ok(files.includes(f), f);
    assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('src/') || f.startsWith('node_modules/')), files.join(' '));
  });

  test('a fresh CommonJS TypeScript project (module commonjs, node10 resolution): install, tsc, one call', async () => {
    const dir = project('app', {});
    writeFileSync(
      path.join(dir, 'tsconfig.json'),
      JSON.stringify({ compilerOptions: { module: 'commonjs', moduleResolution: 'node10', target: 'ES2022', strict: true, esModuleInterop: true, skipLibCheck: false, outDir: 'out', types: ['node'] }, files: ['index.ts'] }),
    );
    writeFileSync(
      path.join(dir, 'index.ts'),
      `import Redis from 'ioredis';\nimport { createClient, createCluster } from 'redis';\nimport { Limiter, headers, type Decision, type Stats } from 'xcloak';\n` +
        `import { rateLimit as expressRateLimit } from 'xcloak/express';\nimport { rateLimit as fastifyRateLimit } from 'xcloak/fastify';\n` +
        `import { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';\nimport { XcloakStore } from 'xcloak/express-rate-limit';\nimport { xcloakCommand } from 'xcloak/ioredis';\n${TYPED}`,
    );
    tsc(dir);
    assert.match(readFileSync(path.join(dir, 'out/index.js'), 'utf8'), /require\("xcloak\/express"\)/, 'CommonJS output');
    assert.deepEqual(JSON.parse(run(dir, 'out/index.js')), EXPECTED);
  });

  test('a fresh ESM project: TypeScript (nodenext) and plain .mjs, every entry point the same instance by import and require', async () => {
    // A package of its own ("type": "module") inside the first one, whose node_modules it resolves from.
    const dir = path.join(tmp, 'app', 'esm');
    execFileSync('mkdir', ['-p', dir]);
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'esm', private: true, type: 'module' }));
    writeFileSync(
      path.join(dir, 'tsconfig.json'),
      JSON.stringify({ compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext', target: 'ES2022', strict: true, skipLibCheck: false, outDir: 'out', types: ['node'] }, files: ['index.ts'] }),
    );
    writeFileSync(
      path.join(dir, 'index.ts'),
      `import { Redis } from 'ioredis';\nimport { createClient, createCluster } from 'redis';\nimport { Limiter, headers, type Decision, type Stats } from 'xcloak';\n` +
        `import { rateLimit as expressRateLimit } from 'xcloak/express';\nimport { rateLimit as fastifyRateLimit } from 'xcloak/fastify';\n` +
        `import { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';\nimport { XcloakStore } from 'xcloak/express-rate-limit';\nimport { xcloakCommand } from 'xcloak/ioredis';\n${TYPED}`,
    );
    tsc(dir, path.join(tmp, 'app'));
    assert.match(readFileSync(path.join(dir, 'out/index.js'), 'utf8'), /^import .* from 'xcloak\/express';$/m, 'ESM output');
    assert.deepEqual(JSON.parse(run(dir, 'out/index.js')), EXPECTED);
    writeFileSync(
      path.join(dir, 'same.mjs'),
      `import { createRequire } from 'node:module';\n${ENTRIES.map((e, i) => `import * as m${i} from ${JSON.stringify(e)};`).join('\n')}\n` +
        `const require = createRequire(import.meta.url);\n` +
        `console.log(JSON.stringify([${ENTRIES.map((e, i) => `Object.keys(m${i}).length > 0 && Object.entries(m${i}).every(([k, v]) => require(${JSON.stringify(e)})[k] === v)`).join(', ')}]));\n`,
    );
    assert.deepEqual(JSON.parse(run(dir, 'same.mjs')), ENTRIES.map(() => true));
  });

  test("the README's first example runs as written (its own file, in a fresh ESM project)", async () => {
    const readme = readFileSync(path.join(packageDir, 'README.md'), 'utf8');
    const first = /```js\n([\s\S]*?)```/.exec(readme)[1];
    const dir = path.join(tmp, 'app', 'esm');
    writeFileSync(path.join(dir, 'example.mjs'), first);
    await server.admin.flushall();
    const out = run(dir, 'example.mjs').trim().split('\n');
    assert.equal(out.length, 6, out.join('\n'));
    assert.deepEqual(out.map((line) => line.split(' ')[1]), ['allowed', 'allowed', 'allowed', 'allowed', 'allowed', 'rejected']);
    assert.match(out[5], /"Retry-After":"(59|60)"/);
    assert.equal(await server.admin.zcard('user:42'), 5);
  });

  test('the Lua copies are byte-identical to src/lua/, in lua/, in the tarball and embedded in the build', () => {
    const sources = readdirSync(path.join(repoDir, 'src/lua')).filter((f) => f.endsWith('.lua')).sort();
    assert.deepEqual(sources, ['xcloak_allow.lua', 'xcloak_peek.lua', 'xcloak_refund.lua']);
    const embedded = Object.fromEntries(Object.values(SCRIPTS).map((s) => [s.file, s.text]));
    for (const file of sources) {
      const source = readFileSync(path.join(repoDir, 'src/lua', file));
      assert.ok(source.equals(readFileSync(path.join(packageDir, 'lua', file))), `lua/${file} differs: run scripts/sync-lua.sh`);
      assert.ok(source.equals(readFileSync(path.join(tmp, 'app/node_modules/xcloak/lua', file))), `the tarball's lua/${file}`);
      assert.ok(source.equals(Buffer.from(embedded[file])), `the build's embedded ${file}`);
    }
  });
});
