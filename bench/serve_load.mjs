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
//        [--prompt-tokens 2048 | 2048-4096] [--max-tokens 64 | 64-512] [--api-key KEY]
//        [--label f16] [--vocab 8192] [--seed 1] [--json results.jsonl] [--no-header]
//        [--corpus-ids FILE] [--shared-prefix N:T]
//   node bench/serve_load.mjs --summarize results.jsonl [--baseline f16]
//
// --requests auto = max(8, 2 x concurrency) per level; a list gives each level
// its own count (one per --concurrency level). Prompts are token ids (the
// completions API of kvq and of llama-server accepts them), so each has
// exactly the drawn length (uniform in the --prompt-tokens range): random ids
// below --vocab, or with --corpus-ids (whitespace-separated ids, e.g. `kvq
// tokenize MODEL - --ids-only < .deps/corpus/test.txt`) windows of real text
// at random offsets. --max-tokens A-B draws each request's output length.
// --shared-prefix N:T puts one of N "system prompts" of T tokens (drawn
// once, chosen at random per request) before each prompt, whose own length
// is then the --prompt-tokens draw: the mix prefix caching is for. The same
// --seed gives every run the same requests. Generation ignores EOS so every
// request produces its drawn tokens. A request still running at a level's
// time limit is aborted and counted as failed. One short unmeasured request
// warms the server up first. From kvq's /metrics the rows also show the
// prefix-cache hit rate and the most KV blocks sharing saved at once. No
// dependencies beyond Node 20.
import { appendFileSync, readFileSync } from 'node:fs';
import http from 'node:http';

function parseArgs(argv) {
  const args = { concurrency: '1,8,32', requests: 'auto', seconds: 120, 'prompt-tokens': '2048',
    'max-tokens': 64, 'api-key': '', label: '', vocab: 8192, seed: 1, json: '', summarize: '',
    baseline: 'f16', 'no-header': false, 'corpus-ids': '', 'shared-prefix': '' };
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
  const [mlo, mhi = mlo] = String(args['max-tokens']).split('-').map(Number);
  if (!(mlo >= 1 && mhi >= mlo)) throw new Error(`--max-tokens: ${args['max-tokens']} is not N or A-B`);
  args.maxMin = mlo;
  args.maxMax = mhi;
  args.sharedCount = 0;
  args.sharedTokens = 0;
  if (args['shared-prefix']) {
    const [n, t] = String(args['shared-prefix']).split(':').map(Number);
    if (!(n >= 1 && t >= 1)) throw new Error(`--shared-prefix: ${args['shared-prefix']} is not N:T`);
    args.sharedCount = n;
    args.sharedTokens = t;
  }
  if (args['corpus-ids']) {
    args.corpus = readFileSync(args['corpus-ids'], 'utf8').trim().split(/\s+/).map(Number);
    if (args.corpus.length < 2 * (hi + args.sharedTokens) || args.corpus.some((v) => !(v >= 0))) {
      throw new Error(`--corpus-ids ${args['corpus-ids']}: too short or not token ids`);
    }
  }
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
      blocksTotal: value('kvq_kv_blocks_total'), preemptions: value('kvq_num_preemptions_total'),
      blocksSaved: value('kvq_kv_blocks_saved_by_sharing'),
      prefixQueries: value('kvq_prefix_cache_queries_total'),
      prefixHits: value('kvq_prefix_cache_hits_total'), blockBytes: value('kvq_kv_block_bytes') };
  } catch {
    return null;
  }
}

// POSTs `body` and resolves with the response stream. node:http, not fetch:
// fetch (undici) fails a request whose response headers take more than 300 s,
// and a server that holds queued requests before answering (llama-server
// replies when a slot takes the request) legitimately takes longer at high
// concurrency; the level's own time limit (`signal`) is the only timeout here.
// One connection per request: reusing keep-alive connections races with
// servers that close them after a few requests or seconds idle (cpp-httplib,
// llama-server's HTTP layer, has both limits): the client then sees "socket
// hang up" (8 of 32 requests to llama-server at concurrency 16, session 11).
const noKeepAlive = new http.Agent({ keepAlive: false });
function post(url, headers, body, signal) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', signal, agent: noKeepAlive,
      headers: { ...headers, 'Content-Length': Buffer.byteLength(body) } }, resolve);
    req.on('error', reject);
    req.end(body);
  });
}

// One streaming request; returns its timings (ms) or an error/status.
async function oneRequest(args, prompt, deadline, maxTokens = Number(args.maxMax)) {
  const start = performance.now();
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), Math.max(1, deadline - Date.now()));
  try {
    const res = await post(args.url + '/v1/completions',
      { 'Content-Type': 'application/json',
        ...(args['api-key'] ? { Authorization: `Bearer ${args['api-key']}` } : {}) },
      JSON.stringify({ model: args.model, prompt, max_tokens: maxTokens,
        temperature: 0, stream: true, ignore_eos: true }),
      controller.signal);
    res.setEncoding('utf8');
    if (res.statusCode !== 200) {
      let text = '';
      for await (const piece of res) text += piece;
      return { status: res.statusCode, reason: text.slice(0, 200) };
    }
    let buffer = '';
    const arrivals = [];
    let tokens = 0;
    for await (const piece of res) {
      buffer += piece;
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) return { status: 500, reason: JSON.stringify(chunk.error).slice(0, 200) };
        if (chunk.choices?.length && chunk.choices[0].text) arrivals.push(performance.now());
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
      }
    }
    // A server that sends no usage: count the text events (one per token
    // unless text is held back, e.g. incomplete UTF-8).
    if (!tokens) tokens = arrivals.length;
    return { status: 200, start, arrivals, tokens, promptTokens: prompt.length, end: performance.now() };
  } catch (e) {
    if (controller.signal.aborted) return { status: 'timeout' };
    return { status: 'error', reason: `${e.code || e.name}: ${e.message}`.slice(0, 200) };
  } finally {
    clearTimeout(timer);
  }
}

// `length` token ids: a window of the corpus, or random ids.
function drawTokens(args, random, length) {
  if (!args.corpus) return Array.from({ length }, () => random() % Number(args.vocab));
  const at = random() % (args.corpus.length - length);
  return args.corpus.slice(at, at + length);
}

// The requests of one level: [prompt ids, max_tokens] each.
function drawRequests(args, total, random, systems) {
  const span = args.promptMax - args.promptMin + 1;
  const outSpan = args.maxMax - args.maxMin + 1;
  return Array.from({ length: total }, () => {
    const own = drawTokens(args, random, args.promptMin + (random() % span));
    const prompt = systems.length ? systems[random() % systems.length].concat(own) : own;
    return [prompt, args.maxMin + (random() % outSpan)];
  });
}

async function runLevel(args, concurrency, total, random, systems) {
  const deadline = Date.now() + Number(args.seconds) * 1000;
  const requests = drawRequests(args, total, random, systems);
  const prompts = requests.map((r) => r[0]);
  const before = await readMetrics(args.url);
  let maxRunning = 0;
  let maxBlocks = 0;
  let maxSaved = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const m = await readMetrics(args.url);
      if (m) {
        maxRunning = Math.max(maxRunning, m.running || 0);
        maxBlocks = Math.max(maxBlocks, m.blocksUsed || 0);
        maxSaved = Math.max(maxSaved, m.blocksSaved || 0);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  let next = 0;
  const results = [];
  const begin = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < total && Date.now() < deadline) {
      const [prompt, maxTokens] = requests[next++];
      results.push(await oneRequest(args, prompt, deadline, maxTokens));
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
  // Why requests did not succeed: "status: reason" -> count.
  const failures = {};
  for (const r of results.filter((x) => x.status !== 200)) {
    const key = `${r.status}${r.reason ? `: ${r.reason}` : ''}`;
    failures[key] = (failures[key] || 0) + 1;
  }
  const promptTokens = prompts.slice(0, results.length).reduce((s, p) => s + p.length, 0);
  const promptDone = ok.reduce((s, r) => s + r.promptTokens, 0);
  const delta = (key) => (before && after ? after[key] - before[key] : NaN);
  return { label: args.label, concurrency, requests: total, done: ok.length, refused,
    failed: results.length - ok.length - refused, failures, seconds, tokens, promptTokens,
    tokensPerSecond: tokens / seconds, totalTokensPerSecond: (tokens + promptDone) / seconds,
    requestsPerSecond: ok.length / seconds,
    prefixHitRate: delta('prefixHits') / delta('prefixQueries'),
    maxBlocksSaved: maxSaved, maxMiBSaved: after ? (maxSaved * after.blockBytes) / 2 ** 20 : NaN,
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
  if (rows.some((r) => Number.isFinite(r.prefixHitRate))) {
    table('Prefix cache: prompt tokens found cached (%), most KV MiB saved by sharing at once',
      (r) => `${f(100 * r.prefixHitRate, 1)} %, ${f(r.maxMiBSaved, 1)} MiB`);
  }
}

const args = parseArgs(process.argv.slice(2));
if (args.summarize) {
  summarize(args.summarize, args.baseline);
  process.exit(0);
}
const random = makeRandom(Number(args.seed));
// One short unmeasured request first: the first one maps the weights in and
// fills the caches, which would otherwise land in the first level's figures.
const warm = await oneRequest(args, [1, 2, 3, 4, 5, 6, 7, 8], Date.now() + 600000, 2);
if (warm.status !== 200) throw new Error(`the warm-up request failed (${warm.status}${warm.reason ? `: ${warm.reason}` : ""})`);
if (!args['no-header']) {
  console.log('| label | concurrency | requests ok / refused / failed | prompt tokens | generated tok/s | ' +
    'prompt + generated tok/s | requests/s | TTFT p50 ms | TTFT p99 ms | ITL (TPOT) p50 ms | ITL (TPOT) p99 ms | ' +
    'max running | max KV blocks used / total | preemptions | prefix hit % | max MiB saved by sharing |');
  console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
}
// The shared system prompts are drawn once, before every level's requests.
const systems = Array.from({ length: args.sharedCount }, () => drawTokens(args, random, args.sharedTokens));
const levels = String(args.concurrency).split(',').map(Number);
const counts = String(args.requests).split(',');
if (counts.length !== 1 && counts.length !== levels.length) {
  throw new Error(`--requests ${args.requests}: give one count, auto, or one count per concurrency level`);
}
for (const [i, level] of levels.entries()) {
  const count = counts.length === 1 ? counts[0] : counts[i];
  const total = count === 'auto' ? Math.max(8, 2 * level) : Number(count);
  if (!(Number.isInteger(total) && total >= 1)) throw new Error(`--requests: ${count} is not a count`);
  const r = await runLevel(args, level, total, random, systems);
  if (args.json) appendFileSync(args.json, JSON.stringify(r) + '\n');
  let prompt = args.promptMin === args.promptMax ? `${args.promptMin}` : `${args.promptMin}-${args.promptMax}`;
  if (args.sharedCount) prompt = `${args.sharedCount} x ${args.sharedTokens} shared + ${prompt}`;
  console.log(`| ${args.label} | ${level} | ${r.done} / ${r.refused} / ${r.failed} | ${prompt} | ` +
    `${f(r.tokensPerSecond, 2)} | ${f(r.totalTokensPerSecond, 1)} | ${f(r.requestsPerSecond, 3)} | ${f(r.ttftP50)} | ${f(r.ttftP99)} | ` +
    `${f(r.itlP50)} | ${f(r.itlP99)} | ${r.maxRunning} | ${r.maxBlocksUsed} / ${f(r.blocksTotal, 0)} | ` +
    `${f(r.preemptions, 0)} | ${f(100 * r.prefixHitRate, 1)} | ${f(r.maxMiBSaved, 1)} |`);
}
