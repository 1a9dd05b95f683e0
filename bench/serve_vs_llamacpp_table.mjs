// The tables of bench/serve_vs_llamacpp.sh from its cell files (OUT/SERVER-cC.json):
// one row per (concurrency, server), then issue 20's target ratios in output
// tokens/s per level, each marked met or not met.
//
//   node bench/serve_vs_llamacpp_table.mjs OUT
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const dir = process.argv[2];
if (!dir) throw new Error('usage: serve_vs_llamacpp_table.mjs OUT');
const cells = readdirSync(dir).filter((f) => /-c\d+\.json$/.test(f))
  .map((f) => JSON.parse(readFileSync(join(dir, f), 'utf8')));
if (existsSync(join(dir, 'setup.txt'))) console.log(readFileSync(join(dir, 'setup.txt'), 'utf8').trim());
const f = (v, d = 1) => (Number.isFinite(v) ? v.toFixed(d) : 'n/a');
const levels = [...new Set(cells.map((c) => c.concurrency))].sort((a, b) => a - b);
const order = ['llama-f16', 'kvq-f16', 'kvq-int4', 'kvq-kivi2'];
const rank = (l) => (order.includes(l) ? order.indexOf(l) : order.length);
const find = (label, c) => cells.find((r) => r.label === label && r.concurrency === c);

console.log('\n| concurrency | server | requests ok / errors | output tok/s | requests/s | ' +
  'TTFT p50 / p99 ms | TPOT p50 / p99 ms | most running | peak RSS MiB | load before -> after |');
console.log('| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |');
for (const c of levels) {
  for (const r of cells.filter((x) => x.concurrency === c).sort((a, b) => rank(a.label) - rank(b.label))) {
    console.log(`| ${c} | ${r.label} | ${r.done} / ${r.refused + r.failed} | ${f(r.tokensPerSecond, 1)} | ` +
      `${f(r.requestsPerSecond, 3)} | ${f(r.ttftP50, 0)} / ${f(r.ttftP99, 0)} | ` +
      `${f(r.itlP50, 1)} / ${f(r.itlP99, 1)} | ${r.label.startsWith('kvq') ? r.maxRunning : 'n/a'} | ` +
      `${f(r.peakRssMiB, 0)} | ${r.loadBefore} -> ${r.loadAfter} |`);
  }
}

const targets = [['kvq-f16', 'llama-f16', 1.5], ['kvq-int4', 'kvq-f16', 1.8], ['kvq-kivi2', 'kvq-f16', 2.5]];
console.log('\nTargets (output tokens/s at the same KV memory):\n');
console.log(`| concurrency | ${targets.map(([a, b, t]) => `${a} / ${b} (target >= ${t})`).join(' | ')} |`);
console.log(`| ---: | ${targets.map(() => '---').join(' | ')} |`);
for (const c of levels) {
  const row = targets.map(([a, b, t]) => {
    const x = find(a, c), y = find(b, c);
    if (!x || !y) return 'not run';
    const ratio = x.tokensPerSecond / y.tokensPerSecond;
    return `${f(ratio, 2)}x ${ratio >= t ? 'met' : 'NOT met'}`;
  });
  console.log(`| ${c} | ${row.join(' | ')} |`);
}
