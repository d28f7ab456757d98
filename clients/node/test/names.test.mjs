// names.tsv is the package's column of the names table in docs/clients.md
// (one row per concept, every public name of every entry point). Checked both
// ways against the built declarations (TypeScript's own compiler reads
// dist/*.d.ts): every name in the file exists (an export, a member of an
// exported class or interface, or a string literal of the union its concept
// names), and every export of every entry point, value or type, is in the
// file. A renamed option, a new export or a stale row fails here.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { describe, test } from 'node:test';
import ts from 'typescript';
import { packageDir } from './harness.mjs';

const require = createRequire(import.meta.url);
const ENTRIES = { xcloak: 'index', 'xcloak/ioredis': 'ioredis', 'xcloak/express': 'express', 'xcloak/fastify': 'fastify', 'xcloak/rate-limiter-flexible': 'rate-limiter-flexible', 'xcloak/express-rate-limit': 'express-rate-limit' };
/** The union type a string literal row belongs to, by its concept's prefix. */
const LITERAL_TYPES = { Via: 'Via', ErrorPolicy: 'ErrorPolicy', Fallback: 'Fallback', Style: 'HeaderStyle' };

const [header, ...lines] = readFileSync(path.join(packageDir, 'names.tsv'), 'utf8').trimEnd().split('\n');
const rows = lines.map((line) => {
  const [concept, name, note, ...rest] = line.split('\t');
  return { concept, name, note, rest };
});

const file = (entry) => path.join(packageDir, 'dist', `${ENTRIES[entry]}.d.ts`);
const program = ts.createProgram(Object.keys(ENTRIES).map(file), { strict: true, skipLibCheck: true, types: ['node'], module: ts.ModuleKind.Node16, moduleResolution: ts.ModuleResolutionKind.Node16 });
const checker = program.getTypeChecker();
const exportsOf = new Map(
  Object.keys(ENTRIES).map((entry) => {
    const source = program.getSourceFile(file(entry));
    const symbols = checker.getExportsOfModule(checker.getSymbolAtLocation(source));
    return [entry, new Map(symbols.map((s) => [s.name, s.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(s) : s]))];
  }),
);

/** `xcloak/express.rateLimit` -> ['xcloak/express', 'rateLimit']; `Limiter.allow` -> ['xcloak', 'Limiter.allow']. */
function split(name) {
  const match = /^(xcloak\/[a-z-]+)\.(.+)$/.exec(name);
  return match ? [match[1], match[2]] : ['xcloak', name];
}

function unionHas(typeName, literal) {
  const symbol = exportsOf.get('xcloak').get(typeName);
  const type = checker.getDeclaredTypeOfSymbol(symbol);
  return (type.isUnion() ? type.types : [type]).some((t) => t.isStringLiteral() && t.value === literal);
}

function exists(concept, name) {
  const literal = /^'([a-z]+)'$/.exec(name);
  if (literal) return unionHas(LITERAL_TYPES[concept.split('.')[0]], literal[1]);
  const [entry, path_] = split(name);
  const [exported, member] = path_.split('.');
  const symbol = exportsOf.get(entry)?.get(exported);
  if (!symbol) return false;
  if (member === undefined) return true;
  const type = checker.getDeclaredTypeOfSymbol(symbol);
  return checker.getPropertyOfType(type, member) !== undefined;
}

describe('names.tsv: the public surface, both ways', () => {
  test('the format of docs/clients.md\'s names table: a header, three fields a line, each concept once', () => {
    assert.equal(header, 'concept\tname\tnote');
    for (const row of rows) {
      assert.deepEqual(row.rest, [], row.concept);
      assert.ok(row.concept && row.name && row.note !== undefined, JSON.stringify(row));
    }
    const concepts = rows.map((r) => r.concept);
    assert.deepEqual(concepts.filter((c, i) => concepts.indexOf(c) !== i), [], 'each concept once');
    for (const row of rows.filter((r) => r.name === '-')) assert.ok(row.note.length > 0, `${row.concept}: '-' needs a note`);
  });

  test('every name in the file exists in the package', () => {
    const missing = [];
    for (const row of rows) {
      if (row.name === '-') continue;
      for (const name of row.name.split(', ')) if (!exists(row.concept, name)) missing.push(`${row.concept}: ${name}`);
    }
    assert.deepEqual(missing, []);
    // The decisions of names.md, held here too: the old names are gone.
    assert.ok(!exists('option.on_error', 'LimiterOptions.errorPolicy'));
    assert.ok(exists('option.on_error', 'LimiterOptions.onError') && exists('option.replica_reads', 'LimiterOptions.replicaReads'));
  });

  test('every export of every entry point, value or type, is in the file; every value export is there at run time', () => {
    const listed = new Set(
      rows
        .flatMap((r) => r.name.split(', '))
        .map(split)
        .map(([entry, name]) => `${entry}:${name.split('.')[0]}`),
    );
    const unlisted = [];
    for (const [entry, symbols] of exportsOf) {
      const runtime = require(path.join(packageDir, 'dist', `${ENTRIES[entry]}.js`));
      for (const [name, symbol] of symbols) {
        if (!listed.has(`${entry}:${name}`)) unlisted.push(`${entry}: ${name}`);
        if (symbol.flags & ts.SymbolFlags.Value && !(symbol.flags & ts.SymbolFlags.Interface)) assert.ok(name in runtime, `${entry}: ${name} at run time`);
      }
      for (const name of Object.keys(runtime)) if (name !== '__esModule') assert.ok(symbols.has(name), `${entry}: ${name} declared`);
    }
    assert.deepEqual(unlisted, []);
  });
});
