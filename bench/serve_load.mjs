// Load generator for kvq serve (or any OpenAI-compatible server): streaming
// completions at fixed concurrency levels, bounded by a request count and a
// time limit per level, loopback only. Prints one markdown row per level:
// generated tokens/s, time to first token (TTFT) and inter-token latency
// p50/p99, and (from kvq's /metrics, sampled every 100 ms) the most requests
// that ran at once and the preemptions. Inter-token latency is per request:
// (last token - first token) / (tokens - 1), vLLM's TPOT. Timing single SSE
// chunks instead would be wrong: several tokens can arrive in one socket
// read and look like 0 ms.
//
//   node bench/serve_load.mjs --url http://127.0.0.1:PORT --model NAME
//        [--concurrency 1,8,32] [--requests N|auto|N1,N2,N3] [--seconds 120]
//        [--prompt-tokens 2048 | 2048-4096] [--max-tokens 64] [--api-key KEY]
//        [--label f16] [--vocab 8192] [--seed 1] [--json results.jsonl] [--no-header]
//   node bench/serve_load.mjs --summarize results.jsonl [--baseline f16]
//
// --requests auto = max(8, 2 x concurrency) per level; a list gives each level
// its own count (one per --concurrency level). Prompts are random
// token ids (the completions API accepts them), so each has exactly the
// drawn length (uniform in the --prompt-tokens range) and no two share a
// prefix; the same --seed gives every run the same prompts. Generation
// ignores EOS so every request produces --max-tokens tokens. A request still
// running at a level's time limit is aborted and counted as failed. One
// short unmeasured request warms the server up first. No
// dependencies beyond Node 20's fetch.
import { appendFileSync, readFileSync } from 'node:fs';

function parseArgs(argv) {
  const args = { concurrency: '1,8,32', requests: 'auto', seconds: 120, 'prompt-tokens': '2048',
    'max-tokens': 64, 'api-key': '', label: '', vocab: 8192, seed: 1, json: '', summarize: '',
    baseline: 'f16', 'no-header': false };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (key === 'no-header') { args[key] = true; --i; continue; }
    if (!(key in args) && key !== 'url' && key !== 'model') throw new Error(`unknown option ${argv[i]}`);
    args[key] = argv[i + 1];
  }
  if (args.summarize) return args;
  if (!args.url || !args.model) throw new Error('--url and --model are required');
  const host = new URL(args.url).hostname;
  if (!['127.0.0.1', 'localhost', '::1', '[::1]'].includes(host)) {
    throw new Error(`loopback only: ${host} is not a loopback address`);
  }
  const [lo, hi = lo] = String(args['prompt-tokens']).split('-').map(Number);
  if (!(lo >= 1 && hi >= lo)) throw new Error(`--prompt-tokens: ${args['prompt-tokens']} is not N or A-B`);
  args.promptMin = lo;
  args.promptMax = hi;
  return args;
}

// xorshift32: reproducible prompts without a dependency.
function makeRandom(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    return x;
  };
}

function percentile(values, p) {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank];
}

// kvq's gauges and counters, or null for a server without them.
async function readMetrics(url) {
  try {
    const text = await (await fetch(url + '/metrics')).text();
    const value = (name) => {
      const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
      return m ? Number(m[1]) : NaN;
    };
    return { running: value('kvq_num_requests_running'), blocksUsed: value('kvq_kv_blocks_used'),
      blocksTotal: value('kvq_kv_blocks_total'), preemptions: value('kvq_num_preemptions_total') };
  } catch {
    return null;
  }
}

// One streaming request; returns its timings (ms) or an error/status.
async function oneRequest(args, prompt, deadline) {
  const start = performance.now();
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), Math.max(1, deadline - Date.now()));
  try {
    const res = await fetch(args.url + '/v1/completions', {
      method: 'POST',
      signal: controller.signal,
      headers: { 'Content-Type': 'application/json',
        ...(args['api-key'] ? { Authorization: `Bearer ${args['api-key']}` } : {}) },
      body: JSON.stringify({ model: args.model, prompt, max_tokens: Number(args['max-tokens']),
        temperature: 0, stream: true, ignore_eos: true }),
    });
    if (res.status !== 200) {
      await res.text();
      return { status: res.status };
    }
    const decoder = new TextDecoder();
    let buffer = '';
    const arrivals = [];
    let tokens = 0;
    for await (const bytes of res.body) {
      buffer += decoder.decode(bytes, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) return { status: 500 };
        if (chunk.choices?.length && chunk.choices[0].text) arrivals.push(performance.now());
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
      }
    }
    return { status: 200, start, arrivals, tokens, promptTokens: prompt.length, end: performance.now() };
  } catch (e) {
    return { status: e.name === 'AbortError' ? 'timeout' : 'error' };
  } finally {
    clearTimeout(timer);
  }
}

async function runLevel(args, concurrency, total, random) {
  const deadline = Date.now() + Number(args.seconds) * 1000;
  const span = args.promptMax - args.promptMin + 1;
  const prompts = Array.from({ length: total }, () =>
    Array.from({ length: args.promptMin + (random() % span) }, () => random() % Number(args.vocab)));
  const before = await readMetrics(args.url);
  let maxRunning = 0;
  let maxBlocks = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const m = await readMetrics(args.url);
      if (m) {
        maxRunning = Math.max(maxRunning, m.running || 0);
        maxBlocks = Math.max(maxBlocks, m.blocksUsed || 0);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  let next = 0;
  const results = [];
  const begin = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < total && Date.now() < deadline) {
      results.push(await oneRequest(args, prompts[next++], deadline));
    }
  }));
  const seconds = (performance.now() - begin) / 1000;
  sampling = false;
  await sampler;
  const after = await readMetrics(args.url);
  const ok = results.filter((r) => r.status === 200);
  const ttft = ok.filter((r) => r.arrivals.length).map((r) => r.arrivals[0] - r.start);
  const itl = ok.filter((r) => r.arrivals.length > 1 && r.tokens > 1)
    .map((r) => (r.arrivals.at(-1) - r.arrivals[0]) / (r.tokens - 1));
  const tokens = ok.reduce((s, r) => s + r.tokens, 0);
  const refused = results.filter((r) => r.status === 429 || r.status === 503).length;
  const promptTokens = prompts.slice(0, results.length).reduce((s, p) => s + p.length, 0);
  const promptDone = ok.reduce((s, r) => s + r.promptTokens, 0);
  return { label: args.label, concurrency, requests: total, done: ok.length, refused,
    failed: results.length - ok.length - refused, seconds, tokens, promptTokens,
    tokensPerSecond: tokens / seconds, totalTokensPerSecond: (tokens + promptDone) / seconds,
    ttftP50: percentile(ttft, 50), ttftP99: percentile(ttft, 99),
    itlP50: percentile(itl, 50), itlP99: percentile(itl, 99),
    maxRunning, maxBlocksUsed: maxBlocks, blocksTotal: after ? after.blocksTotal : NaN,
    preemptions: before && after ? after.preemptions - before.preemptions : NaN };
}

const f = (v, digits = 1) => (Number.isFinite(v) ? v.toFixed(digits) : 'n/a');

// Throughput and latency of every label against the baseline label, per
// concurrency level, from the JSON lines of one run.
function summarize(file, baseline) {
  const rows = readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const labels = [...new Set(rows.map((r) => r.label))];
  const levels = [...new Set(rows.map((r) => r.concurrency))].sort((a, b) => a - b);
  const find = (label, c) => rows.find((r) => r.label === label && r.concurrency === c);
  // One table: a row per level, a cell per label from cell(row, baseline row).
  const table = (title, cell) => {
    console.log(`\n${title}:\n`);
    console.log(`| concurrency | ${labels.join(' | ')} |`);
    console.log(`| ---: | ${labels.map(() => '---:').join(' | ')} |`);
    for (const c of levels) {
      const base = find(baseline, c);
      console.log(`| ${c} | ${labels.map((label) => {
        const r = find(label, c);
        return r ? cell(r, base) : 'n/a';
      }).join(' | ')} |`);
    }
  };
  const ratio = (v, b) => (Number.isFinite(v) && Number.isFinite(b) && b > 0 ? ` (${(v / b).toFixed(2)}x)` : '');
  table(`Generated tokens/s (ratio vs ${baseline}, same run), most requests running at once`,
    (r, base) => `${f(r.tokensPerSecond, 2)}${ratio(r.tokensPerSecond, base?.tokensPerSecond)}, ` +
      `${r.maxRunning} running`);
  table(`Prompt + generated tokens/s (ratio vs ${baseline}): the work a cache type cannot ` +
    'speed up (prefill) included',
    (r, base) => `${f(r.totalTokensPerSecond, 1)}${ratio(r.totalTokensPerSecond, base?.totalTokensPerSecond)}`);
  table(`TTFT p50 / ITL (TPOT) p50 in ms (ratio vs ${baseline}; lower is better)`,
    (r, base) => `${f(r.ttftP50)}${ratio(r.ttftP50, base?.ttftP50)} / ${f(r.itlP50)}${ratio(r.itlP50, base?.itlP50)}`);
}

const args = parseArgs(process.argv.slice(2));
if (args.summarize) {
  summarize(args.summarize, args.baseline);
  process.exit(0);
}
const random = makeRandom(Number(args.seed));
// One short unmeasured request first: the first one maps the weights in and
// fills the caches, which would otherwise land in the first level's figures.
const warm = await oneRequest({ ...args, 'max-tokens': 2 }, [1, 2, 3, 4, 5, 6, 7, 8], Date.now() + 600000);
if (warm.status !== 200) throw new Error(`the warm-up request failed (${warm.status})`);
if (!args['no-header']) {
  console.log('| label | concurrency | requests ok / refused / failed | prompt tokens | generated tok/s | ' +
    'prompt + generated tok/s | TTFT p50 ms | TTFT p99 ms | ITL (TPOT) p50 ms | ITL (TPOT) p99 ms | max running | ' +
    'max KV blocks used / total | preemptions |');
  console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
}
const levels = String(args.concurrency).split(',').map(Number);
const counts = String(args.requests).split(',');
if (counts.length !== 1 && counts.length !== levels.length) {
  throw new Error(`--requests ${args.requests}: give one count, auto, or one count per concurrency level`);
}
for (const [i, level] of levels.entries()) {
  const count = counts.length === 1 ? counts[0] : counts[i];
  const total = count === 'auto' ? Math.max(8, 2 * level) : Number(count);
  if (!(Number.isInteger(total) && total >= 1)) throw new Error(`--requests: ${count} is not a count`);
  const r = await runLevel(args, level, total, random);
  if (args.json) appendFileSync(args.json, JSON.stringify(r) + '\n');
  const prompt = args.promptMin === args.promptMax ? `${args.promptMin}` : `${args.promptMin}-${args.promptMax}`;
  console.log(`| ${args.label} | ${level} | ${r.done} / ${r.refused} / ${r.failed} | ${prompt} | ` +
    `${f(r.tokensPerSecond, 2)} | ${f(r.totalTokensPerSecond, 1)} | ${f(r.ttftP50)} | ${f(r.ttftP99)} | ${f(r.itlP50)} | ${f(r.itlP99)} | ` +
    `${r.maxRunning} | ${r.maxBlocksUsed} / ${f(r.blocksTotal, 0)} | ${f(r.preemptions, 0)} |`);
}
