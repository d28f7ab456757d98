// Builds the package into dist/: embeds lua/*.lua (src/lua.generated.ts),
// compiles src/ with tsc (CommonJS + .d.ts), then writes one ESM wrapper per
// entry point (index.mjs + index.d.mts re-export the CommonJS build), so
// `import` and `require` load the same module instance: one XcloakError
// class, whatever mix of the two an app uses.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const lua = (name) => readFileSync(join(root, 'lua', name), 'utf8');
writeFileSync(
  join(root, 'src/lua.generated.ts'),
  '// Written by scripts/build.mjs from lua/ (copies of src/lua/ of the xcloak repository). Do not edit.\n' +
    `export const ALLOW_LUA = ${JSON.stringify(lua('xcloak_allow.lua'))};\n` +
    `export const PEEK_LUA = ${JSON.stringify(lua('xcloak_peek.lua'))};\n` +
    `export const REFUND_LUA = ${JSON.stringify(lua('xcloak_refund.lua'))};\n`,
);

rmSync(join(root, 'dist'), { recursive: true, force: true });
execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(root, 'tsconfig.json')], { stdio: 'inherit' });

const require = createRequire(import.meta.url);
const entries = ['index', 'ioredis', 'express', 'fastify', 'rate-limiter-flexible', 'express-rate-limit'];
for (const entry of entries) {
  const names = Object.keys(require(join(root, 'dist', `${entry}.js`))).filter((n) => n !== '__esModule' && n !== 'default');
  const lines = [
    `// ESM entry of dist/${entry}.js (written by scripts/build.mjs): the same module instance for import and require.`,
    `import cjs from './${entry}.js';`,
    ...names.map((n) => `export const ${n} = cjs.${n};`),
    '',
  ];
  writeFileSync(join(root, 'dist', `${entry}.mjs`), lines.join('\n'));
  writeFileSync(join(root, 'dist', `${entry}.d.mts`), `export * from './${entry}.js';\n`);
}
