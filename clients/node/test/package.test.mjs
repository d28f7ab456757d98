// The packed tarball (npm pack), installed into a project of its own: every
// entry point loads by `require` and by `import` as the same module instance,
// TypeScript finds the declarations both ways (node16 resolution), the Lua
// copies ship, and the copies are byte-identical to the one source in src/lua/.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { SCRIPTS } from 'xcloak';
import { packageDir, repoDir } from './harness.mjs';

const ENTRIES = ['xcloak', 'xcloak/ioredis', 'xcloak/express', 'xcloak/fastify', 'xcloak/rate-limiter-flexible', 'xcloak/express-rate-limit'];
let project;
let files;

before(() => {
  project = mkdtempSync(path.join(os.tmpdir(), 'xcloak-node-package-'));
  const out = execFileSync('npm', ['pack', '--json', '--pack-destination', project], { cwd: packageDir, encoding: 'utf8' });
  const [{ filename, files: packed }] = JSON.parse(out);
  files = packed.map((f) => f.path);
  mkdirSync(path.join(project, 'node_modules/xcloak'), { recursive: true });
  execFileSync('tar', ['xzf', path.join(project, filename), '-C', path.join(project, 'node_modules/xcloak'), '--strip-components=1']);
  // The peers from this package's own node_modules (resolved through the symlinks' real paths).
  for (const peer of ['ioredis', 'redis', 'rate-limiter-flexible', 'express-rate-limit', 'fastify', 'express', 'typescript', '@types']) {
    symlinkSync(path.join(packageDir, 'node_modules', peer), path.join(project, 'node_modules', peer));
  }
  writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true }));
});
after(() => rmSync(project, { recursive: true, force: true }));

const run = (file, source) => {
  writeFileSync(path.join(project, file), source);
  return execFileSync(process.execPath, [file], { cwd: project, encoding: 'utf8' });
};

describe('the npm pack tarball', () => {
  test('ships dist/ (JS, .d.ts, ESM wrappers), lua/ and the README, and nothing of the tests', () => {
    for (const f of ['README.md', 'package.json', 'lua/xcloak_allow.lua', 'lua/xcloak_peek.lua', 'lua/xcloak_refund.lua']) assert.ok(files.includes(f), f);
    for (const entry of ['index', 'ioredis', 'express', 'fastify', 'rate-limiter-flexible', 'express-rate-limit']) {
      for (const ext of ['.js', '.d.ts', '.mjs', '.d.mts']) assert.ok(files.includes(`dist/${entry}${ext}`), `dist/${entry}${ext}`);
    }
    assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('src/') || f.startsWith('node_modules/')), files.join(' '));
  });

  test('require() of every entry point', () => {
    const out = run('cjs.cjs', `${ENTRIES.map((e, i) => `const m${i} = require(${JSON.stringify(e)});`).join('\n')}
console.log(JSON.stringify([typeof m0.Limiter, typeof m0.headers, typeof m1.install, typeof m2.rateLimit, typeof m3.rateLimit, typeof m4.RateLimiterXcloak, typeof m5.XcloakStore]));`);
    assert.deepEqual(JSON.parse(out), ['function', 'function', 'function', 'function', 'function', 'function', 'function']);
  });

  test('import of every entry point: the same instances as require (one XcloakError class, one Limiter)', () => {
    const out = run('esm.mjs', `import { createRequire } from 'node:module';
${ENTRIES.map((e, i) => `import * as m${i} from ${JSON.stringify(e)};`).join('\n')}
import { Limiter, XcloakError } from 'xcloak';
const require = createRequire(import.meta.url);
const cjs = require('xcloak');
console.log(JSON.stringify([cjs.Limiter === Limiter, cjs.XcloakError === XcloakError, typeof m4.RateLimiterXcloak, typeof m5.XcloakStore, typeof m2.rateLimit, typeof m1.install]));`);
    assert.deepEqual(JSON.parse(out), [true, true, 'function', 'function', 'function', 'function']);
  });

  test('TypeScript resolves the declarations for import (.mts) and require (.cts)', () => {
    const use = `const limiter = new Limiter({} as never, { errorPolicy: 'deny', timeout: 250 });
const d: Promise<Decision> = limiter.allow('k', 60_000, 10, { cost: 2, tiers: [[3_600_000, 100]], stamp: true });
void d;
const fields: Record<string, string> = headers({} as Decision, { style: 'both' });
void fields;
void rateLimit({ limiter, limits: [{ name: 'ip', window: 60_000, limit: 100 }] });
void new RateLimiterXcloak({ limiter, points: 10, duration: 60 });
void new XcloakStore({ limiter });
// @ts-expect-error: errorPolicy is 'raise' | 'allow' | 'deny'
void new Limiter({} as never, { errorPolicy: 'open' });
`;
    writeFileSync(
      path.join(project, 'use.mts'),
      `import { Limiter, headers, type Decision } from 'xcloak';\nimport { rateLimit } from 'xcloak/express';\nimport { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';\nimport { XcloakStore } from 'xcloak/express-rate-limit';\n${use}`,
    );
    writeFileSync(
      path.join(project, 'fastify.mts'),
      `import Fastify from 'fastify';\nimport { Redis } from 'ioredis';\nimport { Limiter } from 'xcloak';\nimport { rateLimit } from 'xcloak/fastify';\n` +
        `const app = Fastify();\nconst limiter = new Limiter(new Redis({ lazyConnect: true }));\n` +
        `app.addHook('onRequest', rateLimit({ limiter, limits: { window: 1000, limit: 5 } }));\n` +
        `app.get('/', { onRequest: rateLimit({ limiter, limits: { name: 'r', window: 1000, limit: 5, key: (request) => String(request.headers['x-user']) } }) }, async () => 'ok');\n`,
    );
    writeFileSync(
      path.join(project, 'express.mts'),
      `import express, { type Request } from 'express';\nimport { Redis } from 'ioredis';\nimport { Limiter } from 'xcloak';\nimport { rateLimit } from 'xcloak/express';\n` +
        `const app = express();\nconst limiter = new Limiter(new Redis({ lazyConnect: true }));\n` +
        `app.use(rateLimit({ limiter, limits: { window: 1000, limit: 5 } }));\n` +
        `app.post('/login', rateLimit<Request>({ limiter, limits: { name: 'account', window: 60_000, limit: 5, key: (req) => String(req.body.user) } }), (req, res) => { res.send('ok'); });\n`,
    );
    writeFileSync(
      path.join(project, 'use.cts'),
      `import { Limiter, headers, type Decision } from 'xcloak';\nimport { rateLimit } from 'xcloak/fastify';\nimport { RateLimiterXcloak } from 'xcloak/rate-limiter-flexible';\nimport { XcloakStore } from 'xcloak/express-rate-limit';\n${use}`,
    );
    writeFileSync(
      path.join(project, 'tsconfig.json'),
      JSON.stringify({ compilerOptions: { module: 'node16', moduleResolution: 'node16', strict: true, noEmit: true, types: ['node'], skipLibCheck: false, target: 'ES2022' }, files: ['use.mts', 'use.cts', 'fastify.mts', 'express.mts'] }),
    );
    try {
      execFileSync(process.execPath, [path.join(project, 'node_modules/typescript/bin/tsc'), '-p', project], { cwd: project, encoding: 'utf8' });
    } catch (error) {
      assert.fail(`tsc:\n${error.stdout}${error.stderr}`);
    }
  });

  test('the Lua copies are byte-identical to src/lua/, in lua/, in the tarball and embedded in the build', () => {
    const sources = readdirSync(path.join(repoDir, 'src/lua')).filter((f) => f.endsWith('.lua')).sort();
    assert.deepEqual(sources, ['xcloak_allow.lua', 'xcloak_peek.lua', 'xcloak_refund.lua']);
    const embedded = Object.fromEntries(Object.values(SCRIPTS).map((s) => [s.file, s.text]));
    for (const file of sources) {
      const source = readFileSync(path.join(repoDir, 'src/lua', file));
      assert.ok(source.equals(readFileSync(path.join(packageDir, 'lua', file))), `lua/${file} differs: run scripts/sync-lua.sh`);
      assert.ok(source.equals(readFileSync(path.join(project, 'node_modules/xcloak/lua', file))), `the tarball's lua/${file}`);
      assert.ok(source.equals(Buffer.from(embedded[file])), `the build's embedded ${file}`);
    }
  });
});
