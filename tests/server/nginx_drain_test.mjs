// Scale-out on an existing engine: two `kvq serve` replicas behind Debian's
// nginx, configured by deploy/nginx/nginx.conf itself (only its three
// loopback ports replaced), with a fixed number of completions (streaming
// and not, completions and chat) sent through nginx at some concurrency.
// Replica A gets SIGTERM while one of its streams is open, after a quarter
// of the requests are done. Asserted:
//   - every request got a complete 200 answer: a JSON body, or a stream
//     with finish_reason "length", max_tokens tokens in its usage and
//     [DONE], no error event;
//   - A finished the stream it was sending when the signal came, drained
//     and exited 0 without cancelling anything;
//   - both replicas served requests.
// Only ordering is assumed (the signal is sent while the client holds an
// open stream from A), never how long anything takes; timeouts are for a
// hung process only.
//
//   node nginx_drain_test.mjs KVQ MODEL_DIR NGINX_CONF NGINX_BINARY
//        [--break drain|retry|kill] [--requests N] [--concurrency C]
//
// --break shows the test failing: `drain` starts A with --shutdown-timeout 0
// (running requests are cancelled at once), `retry` replaces the config's
// proxy_next_upstream by nginx's default (error timeout: no POST is sent
// again, so a draining replica's 503 reaches the client), `kill` sends
// SIGKILL instead of SIGTERM. Exit code 77 (ctest's skip) without nginx.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const positional = [];
const options = { break: '', requests: '64', concurrency: '8' };
for (let i = 2; i < process.argv.length; ++i) {
  const a = process.argv[i];
  if (a.startsWith('--')) {
    const key = a.slice(2);
    if (!(key in options)) throw new Error(`unknown option ${a}`);
    options[key] = process.argv[++i];
  } else {
    positional.push(a);
  }
}
const [kvq, modelDir, nginxConf, nginx] = positional;
if (!kvq || !modelDir || !nginxConf || !nginx) {
  console.error('usage: node nginx_drain_test.mjs KVQ MODEL_DIR NGINX_CONF NGINX_BINARY [--break drain|retry|kill]');
  process.exit(2);
}
if (!existsSync(nginx)) {
  console.log(`SKIP: nginx not found (${nginx}); scripts/setup.sh installs Debian's nginx`);
  process.exit(77);
}
if (!['', 'drain', 'retry', 'kill'].includes(options.break)) throw new Error(`--break ${options.break}?`);
const REQUESTS = Number(options.requests);
const CONCURRENCY = Number(options.concurrency);
// Long streams keep A busy after the signal, so its drain has work to finish.
const STREAM_TOKENS = 128;
const WHOLE_TOKENS = 48;
const MODEL = 'kvq-tiny';

const work = mkdtempSync(path.join(os.tmpdir(), 'kvq-nginx-'));
const children = [];
let failures = 0;
function check(ok, message) {
  if (!ok) {
    ++failures;
    console.log(`FAIL: ${message}`);
  }
}
function cleanup() {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  rmSync(work, { recursive: true, force: true });
}
// A hung process must not hang ctest: everything ends well before this.
const watchdog = setTimeout(() => {
  console.log('FAIL: the test did not finish in 300 s');
  cleanup();
  process.exit(1);
}, 300000);

function startReplica(name, shutdownTimeout = 60) {
  const args = ['serve', '-m', modelDir, '--served-model-name', MODEL, '--port', '0', '-t', '1',
    '--max-model-len', '256', '--max-num-seqs', '4', '--shutdown-timeout', String(shutdownTimeout)];
  const child = spawn(kvq, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  const replica = { name, child, stderr: '', exited: once(child, 'exit') };
  child.stderr.on('data', (d) => { replica.stderr += d; });
  let stdout = '';
  replica.ready = new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => {
      stdout += d;
      const m = stdout.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    child.on('exit', (code) => reject(new Error(`${name} exited (${code}) before listening:\n${replica.stderr}`)));
  });
  return replica;
}

async function freePort() {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

// The example config with its ports replaced; each must occur exactly once,
// so a changed example fails here instead of testing something else.
function nginxConfig(portA, portB, listen) {
  let text = readFileSync(nginxConf, 'utf8');
  const replace = (from, to) => {
    const count = text.split(from).length - 1;
    if (count !== 1) throw new Error(`${nginxConf}: expected '${from}' once, found ${count}`);
    text = text.replace(from, to);
  };
  replace('server 127.0.0.1:8001 ', `server 127.0.0.1:${portA} `);
  replace('server 127.0.0.1:8002 ', `server 127.0.0.1:${portB} `);
  replace('listen 127.0.0.1:8080;', `listen 127.0.0.1:${listen};`);
  if (options.break === 'retry') replace('proxy_next_upstream error http_503 non_idempotent;', 'proxy_next_upstream error timeout;');
  return text;
}

// nginx in the foreground, one process (no master: nothing is left behind
// if the test dies), its files in a temporary prefix.
async function startNginx(portA, portB) {
  const prefix = path.join(work, 'nginx');
  mkdirSync(prefix, { recursive: true });
  chmodSync(work, 0o755);
  for (let attempt = 0; attempt < 5; ++attempt) {
    const port = await freePort();
    writeFileSync(path.join(prefix, 'nginx.conf'), nginxConfig(portA, portB, port));
    const child = spawn(nginx, ['-p', prefix, '-c', path.join(prefix, 'nginx.conf'),
      '-e', path.join(prefix, 'error.log'), '-g', 'daemon off; master_process off;'],
    { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(child);
    let stderr = '';
    child.stderr.on('data', (d) => { stderr += d; });
    const exited = once(child, 'exit');
    const base = `http://127.0.0.1:${port}`;
    for (let i = 0; i < 600; ++i) {  // 60 s
      if (child.exitCode !== null) break;
      try {
        if ((await fetch(base + '/health')).status === 200) return { child, base, exited, prefix };
      } catch { /* not listening yet */ }
      await new Promise((r) => setTimeout(r, 100));
    }
    if (child.exitCode === null) child.kill('SIGKILL');
    await exited;
    const log = readFileSync(path.join(prefix, 'error.log'), 'utf8');
    if (!/Address already in use/.test(log + stderr)) throw new Error(`nginx did not start:\n${stderr}\n${log}`);
  }
  throw new Error('nginx found no free port in 5 attempts');
}

// The parts of a server-sent-event stream: its JSON events and whether
// [DONE] ended it.
async function readStream(res, onEvent) {
  const decoder = new TextDecoder();
  let buffer = '';
  let done = false;
  for await (const bytes of res.body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith('data: ')) continue;  // ": keep-alive" comments
      if (done) throw new Error('an event after [DONE]');
      if (event === 'data: [DONE]') { done = true; continue; }
      onEvent(JSON.parse(event.slice(6)));
    }
  }
  return done && buffer === '';
}

// One request through nginx; resolves to { ok, why, served, tries }.
async function request(base, i, onFirstText) {
  const chat = i % 4 >= 2;
  const stream = i % 2 === 0;
  const maxTokens = stream ? STREAM_TOKENS : WHOLE_TOKENS;
  const body = { model: MODEL, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream,
    ...(stream ? { stream_options: { include_usage: true } } : {}),
    ...(chat ? { messages: [{ role: 'user', content: `Tell story ${i}` }] } : { prompt: `Once upon a time ${i}` }) };
  const kind = `${stream ? 'streaming ' : ''}${chat ? 'chat' : 'completion'} #${i}`;
  let res;
  try {
    res = await fetch(`${base}/v1/${chat ? 'chat/completions' : 'completions'}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  } catch (e) {
    return { ok: false, why: `${kind}: ${e.cause?.code ?? e.message}` };
  }
  const tries = (res.headers.get('x-kvq-upstream') ?? '').split(',').map((s) => s.trim()).filter(Boolean);
  const result = { ok: false, served: tries.at(-1), tries: tries.length };
  if (res.status !== 200) return { ...result, why: `${kind}: HTTP ${res.status} via ${tries}: ${await res.text()}` };
  try {
    if (!stream) {
      const j = await res.json();
      const choice = j.choices?.[0];
      const text = chat ? choice?.message?.content : choice?.text;
      if (choice?.finish_reason !== 'length' || j.usage?.completion_tokens !== maxTokens || !text) {
        return { ...result, why: `${kind}: incomplete answer ${JSON.stringify(j).slice(0, 300)}` };
      }
      return { ...result, ok: true };
    }
    let finish = null;
    let usage = null;
    let error = null;
    let texts = 0;
    const complete = await readStream(res, (event) => {
      if (event.error) error = event.error;
      if (event.usage) usage = event.usage;
      const choice = event.choices?.[0];
      if (!choice) return;
      if (choice.finish_reason) finish = choice.finish_reason;
      if ((chat ? choice.delta?.content : choice.text) && texts++ === 0) onFirstText(result.served);
    });
    if (!complete || error || finish !== 'length' || usage?.completion_tokens !== maxTokens) {
      return { ...result, why: `${kind}: stream incomplete (done ${complete}, finish ${finish}, ` +
        `tokens ${usage?.completion_tokens}, error ${JSON.stringify(error)})` };
    }
    return { ...result, ok: true };
  } catch (e) {
    return { ...result, why: `${kind}: ${e.cause?.code ?? e.message} while reading` };
  }
}

const started = performance.now();
try {
  const a = startReplica('A', options.break === 'drain' ? 0 : 60);
  const b = startReplica('B');
  const [portA, portB] = await Promise.all([a.ready, b.ready]);
  const addressA = `127.0.0.1:${portA}`;
  const proxy = await startNginx(portA, portB);

  // A quarter of the requests done, then SIGTERM to A as soon as the client
  // reads the first text of a stream that A serves: A has that stream (and
  // whatever else it runs or queues) to finish while new requests arrive.
  let completed = 0;
  let signalled = false;
  let signalledDuring = -1;
  const onFirstText = (i) => (served) => {
    if (signalled || served !== addressA || completed < REQUESTS / 4) return;
    signalled = true;
    signalledDuring = i;
    a.child.kill(options.break === 'kill' ? 'SIGKILL' : 'SIGTERM');
  };
  const results = new Array(REQUESTS);
  let next = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < REQUESTS) {
      const i = next++;
      results[i] = await request(proxy.base, i, onFirstText(i));
      ++completed;
    }
  }));

  const failed = results.filter((r) => !r.ok);
  for (const r of failed.slice(0, 10)) console.log(`  ${r.why}`);
  check(failed.length === 0, `${failed.length} of ${REQUESTS} requests without a complete 200 answer`);
  check(signalled, 'A never had a stream open after a quarter of the requests: no SIGTERM sent');
  if (signalled) check(results[signalledDuring].ok, 'the stream A was sending at SIGTERM did not complete');
  const byA = results.filter((r) => r.ok && r.served === addressA).length;
  const byB = results.filter((r) => r.ok && r.served === `127.0.0.1:${portB}`).length;
  check(byA > 0 && byB > 0, `both replicas serve requests (A ${byA}, B ${byB})`);

  if (signalled) {
    const [code, signal] = await a.exited;
    check(code === 0, `A exited with ${code ?? signal} after the signal:\n${a.stderr}`);
    const drain = a.stderr.match(/SIGTERM: draining (\d+) open requests/);
    check(drain !== null && /kvq serve: stopped/.test(a.stderr), `A did not drain:\n${a.stderr}`);
    check(!/cancelling/.test(a.stderr), `A cancelled requests instead of finishing them:\n${a.stderr}`);
    const retried = results.filter((r) => r.tries > 1).length;
    console.log(`requests: ${REQUESTS} (concurrency ${CONCURRENCY}), served by A ${byA}, by B ${byB}, ` +
      `retried by nginx ${retried}; A had ${drain ? drain[1] : '?'} open requests at SIGTERM`);
  }
  b.child.kill('SIGTERM');
  const [codeB] = await b.exited;
  check(codeB === 0, `B exited with ${codeB}`);
  proxy.child.kill('SIGTERM');
  await proxy.exited;
} catch (e) {
  check(false, e.stack ?? String(e));
}
clearTimeout(watchdog);
cleanup();
console.log(`${failures === 0 ? 'PASS' : 'FAIL'} in ${((performance.now() - started) / 1000).toFixed(1)} s`);
process.exit(failures === 0 ? 0 : 1);
