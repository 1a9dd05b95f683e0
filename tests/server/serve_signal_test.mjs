// A supervisor may send SIGTERM the moment `kvq serve` prints its listening
// line (before the listener's loop runs, before any request). Each of
// ROUNDS servers gets SIGTERM from the stdout handler that sees the line and
// must drain and exit 0; one killed by the signal's default action, or one
// that never exits, fails the test. Half the rounds run -t 2, so OpenMP
// worker threads exist when the signal comes: if any thread left SIGTERM
// unblocked, the kernel could hand the signal to it and end the process.
//
//   node serve_signal_test.mjs KVQ MODEL_DIR [ROUNDS]
import { spawn } from 'node:child_process';
import { once } from 'node:events';

const [kvq, modelDir, rounds = '10'] = process.argv.slice(2);
if (!kvq || !modelDir) {
  console.error('usage: node serve_signal_test.mjs KVQ MODEL_DIR [ROUNDS]');
  process.exit(2);
}

async function round(i) {
  const threads = i % 2 === 0 ? '1' : '2';
  const child = spawn(kvq, ['serve', '-m', modelDir, '--port', '0', '-t', threads,
    '--max-model-len', '256'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  let stdout = '';
  let signalled = false;
  child.stdout.on('data', (d) => {
    stdout += d;
    if (!signalled && /listening on http:\/\/127\.0\.0\.1:\d+/.test(stdout)) {
      signalled = true;
      child.kill('SIGTERM');
    }
  });
  // A server that lost the signal would serve forever: 60 s is for a hang only.
  const timer = setTimeout(() => child.kill('SIGKILL'), 60000);
  const [code, signal] = await once(child, 'exit');
  clearTimeout(timer);
  const problems = [];
  if (!signalled) problems.push('no listening line');
  if (code !== 0) problems.push(`exit ${code ?? signal}`);
  if (!/SIGTERM: draining/.test(stderr)) problems.push('no drain');
  return problems.length ? `round ${i} (-t ${threads}): ${problems.join(', ')}\n${stderr}` : '';
}

const failed = [];
for (let i = 0; i < Number(rounds); ++i) {
  const problem = await round(i);
  if (problem) failed.push(problem);
}
for (const f of failed) console.log(`FAIL: ${f}`);
console.log(`${Number(rounds) - failed.length}/${rounds} servers drained and exited 0 after an immediate SIGTERM`);
process.exit(failed.length ? 1 : 0);
