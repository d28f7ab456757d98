// Memory per entry of the block cache: the V8 heap used (after a full GC)
// by a cache holding N rejected keys, minus the heap before, divided by N.
// Each key is 24 bytes (`rl:http:` + 16 hex digits) and is held by the cache
// only; each entry is recorded from a decoded server reply, as the Limiter
// records it (the Decision's tier states are kept, the rest is copied), at a
// fractional monotonic time, as performance.now() reads.
//
//   node --expose-gc bench/memory.mjs [--entries 100000] [--json]   (--json: {"no_tiers": B, "two_tiers": B})
import { BlockCache } from '../dist/block-cache.js';
import { decisionFromReply } from '../dist/index.js';

if (typeof globalThis.gc !== 'function') {
  console.error('run with node --expose-gc');
  process.exit(2);
}
const i = process.argv.indexOf('--entries');
const N = i > 0 ? Number(process.argv[i + 1]) : 100_000;

function heap() {
  for (let k = 0; k < 3; k++) globalThis.gc();
  return process.memoryUsage().heapUsed;
}

function measure(tiers) {
  const replyTiers = [[60000, 10, 0, 59000, 60000], ...tiers.map(([w, l]) => [w, l, l - 10, 0, w])];
  const before = heap();
  const cache = new BlockCache(N, () => 0);
  for (let n = 0; n < N; n++) {
    const key = `rl:http:${n.toString(16).padStart(16, '0')}`;
    const spec = { key, window: 60000, limit: 10, cost: 1, tiers: tiers.length ? tiers : undefined };
    const reply = tiers.length ? [0, 10, 0, 59000, 60000, replyTiers] : [0, 10, 0, 59000, 60000];
    // sent_at as performance.now() gives it: a fractional number of ms.
    cache.record(spec, n + 0.123, decisionFromReply(reply, spec, 'command'));
  }
  const after = heap();
  if (cache.size !== N) throw new Error(`${cache.size} entries, not ${N}`);
  return (after - before) / N;
}

if (process.argv.includes('--json')) {
  console.log(JSON.stringify({ entries: N, no_tiers: measure([]), two_tiers: measure([[3_600_000, 100], [86_400_000, 1000]]) }));
  process.exit(0);
}
console.log(`block cache memory per entry, Node ${process.versions.node}, ${N} entries, keys of 24 bytes (heapUsed after gc):`);
console.log(`  no tiers: ${measure([]).toFixed(0)} B`);
console.log(`  2 tiers after the positional pair (3 tier states held): ${measure([[3_600_000, 100], [86_400_000, 1000]]).toFixed(0)} B`);
