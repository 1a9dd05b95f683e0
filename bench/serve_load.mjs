// Load generator for kvq serve (or any OpenAI-compatible server): streaming
// completions at fixed concurrency levels, bounded by a request count and a
// time limit per level, loopback only. Prints one markdown row per level:
// generated tokens/s, time to first token (TTFT) and inter-token latency
// p50/p99. Inter-token latency is per request: (last token - first token) /
// (tokens - 1), vLLM's TPOT. Timing single SSE chunks instead would be
// wrong: several tokens can arrive in one socket read and look like 0 ms.
//
//   node bench/serve_load.mjs --url http://127.0.0.1:PORT --model NAME
//        [--concurrency 1,8,32] [--requests 32] [--seconds 120]
//        [--prompt-tokens 2048] [--max-tokens 64] [--api-key KEY] [--label f16]
//
// Prompts are random token ids (the completions API accepts them), so each
// has exactly --prompt-tokens tokens and no two share a prefix. Generation
// ignores EOS so every request produces --max-tokens tokens. No dependencies
// beyond Node 20's fetch.

function parseArgs(argv) {
  const args = { concurrency: '1,8,32', requests: 32, seconds: 120, 'prompt-tokens': 2048,
    'max-tokens': 64, 'api-key': '', label: '', vocab: 8192, seed: 1 };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in args) && key !== 'url' && key !== 'model') throw new Error(`unknown option ${argv[i]}`);
    args[key] = argv[i + 1];
  }
  if (!args.url || !args.model) throw new Error('--url and --model are required');
  const host = new URL(args.url).hostname;
  if (!['127.0.0.1', 'localhost', '::1', '[::1]'].includes(host)) {
    throw new Error(`loopback only: ${host} is not a loopback address`);
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
    return { status: 200, start, arrivals, tokens, end: performance.now() };
  } catch (e) {
    return { status: e.name === 'AbortError' ? 'timeout' : 'error' };
  } finally {
    clearTimeout(timer);
  }
}

async function runLevel(args, concurrency, random) {
  const total = Number(args.requests);
  const deadline = Date.now() + Number(args.seconds) * 1000;
  const promptTokens = Number(args['prompt-tokens']);
  const prompts = Array.from({ length: total }, () =>
    Array.from({ length: promptTokens }, () => random() % Number(args.vocab)));
  let next = 0;
  const results = [];
  const begin = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < total && Date.now() < deadline) {
      results.push(await oneRequest(args, prompts[next++], deadline));
    }
  }));
  const seconds = (performance.now() - begin) / 1000;
  const ok = results.filter((r) => r.status === 200);
  const ttft = ok.filter((r) => r.arrivals.length).map((r) => r.arrivals[0] - r.start);
  const itl = ok.filter((r) => r.arrivals.length > 1 && r.tokens > 1)
    .map((r) => (r.arrivals.at(-1) - r.arrivals[0]) / (r.tokens - 1));
  const tokens = ok.reduce((s, r) => s + r.tokens, 0);
  const refused = results.filter((r) => r.status === 429 || r.status === 503).length;
  return { concurrency, done: ok.length, refused, failed: results.length - ok.length - refused,
    seconds, tokens, ttft, itl };
}

const args = parseArgs(process.argv.slice(2));
const random = makeRandom(Number(args.seed));
console.log(`| label | concurrency | requests ok / refused / failed | prompt tokens | generated tok/s | TTFT p50 ms | TTFT p99 ms | ITL (TPOT) p50 ms | ITL (TPOT) p99 ms |`);
console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
for (const level of String(args.concurrency).split(',').map(Number)) {
  const r = await runLevel(args, level, random);
  const f = (v) => (Number.isFinite(v) ? v.toFixed(1) : 'n/a');
  console.log(`| ${args.label} | ${level} | ${r.done} / ${r.refused} / ${r.failed} | ${args['prompt-tokens']} | ` +
    `${(r.tokens / r.seconds).toFixed(2)} | ${f(percentile(r.ttft, 50))} | ${f(percentile(r.ttft, 99))} | ` +
    `${f(percentile(r.itl, 50))} | ${f(percentile(r.itl, 99))} |`);
}
