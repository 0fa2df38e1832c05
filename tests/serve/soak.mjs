// A soak of `dsv4 serve`: rounds of N concurrent streams (a quarter of them dropped by the
// client mid-stream, a few non-streamed), with the server's resident memory sampled after each
// round. After a warm-up, memory must stay flat: a leak per request shows as steady growth.
//   node soak.mjs --port P --key K --pid PID [--streams 16] [--seconds 20]
// Prints one line per check ("ok ..." / "FAIL ...") and ends with "N passed, M failed".
import fs from 'node:fs';

const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (i % 2 ? a : [...a, [x.replace(/^--/, ''), v[i + 1]]]), []));
const base = `http://127.0.0.1:${args.port}`;
const headers = { Authorization: `Bearer ${args.key}`, 'Content-Type': 'application/json' };
const N = Number(args.streams ?? 16), seconds = Number(args.seconds ?? 20);
let passed = 0, failed = 0;
function check(cond, what, detail) {
  if (cond) { passed++; console.log(`ok   ${what}`); }
  else { failed++; console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 600) : ''}`); }
}
const rssKiB = () => Number(fs.readFileSync(`/proc/${args.pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+)/m)[1]);

// One stream; drop: abort after the first few events. Returns the events read and whether it ended with [DONE].
async function stream(i, drop) {
  const ac = new AbortController();
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers, signal: ac.signal,
    body: JSON.stringify({ prompt: `Soak ${i} `.repeat(1 + (i % 5)), max_tokens: 24 + (i % 8), temperature: 0.8, seed: i, logprobs: 2, cache_prompt: false, stream: true }) });
  if (r.status !== 200) return { status: r.status, done: false };
  const rd = r.body.getReader(), dec = new TextDecoder();
  let text = '', events = 0;
  for (;;) {
    const { value, done } = await rd.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
    events = text.split('\n\n').length - 1;
    if (drop && events >= 3) { ac.abort(); break; }
  }
  return { status: 200, done: text.includes('data: [DONE]'), events };
}
async function whole(i) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers,
    body: JSON.stringify({ messages: [{ role: 'user', content: `Round ${i}` }], max_tokens: 16, temperature: 0, logprobs: true, cache_prompt: false }) });
  return r.status;
}

const samples = [];
let rounds = 0, bad = 0, dropped = 0;
const t0 = Date.now();
while ((Date.now() - t0) / 1000 < seconds) {
  const jobs = [];
  for (let i = 0; i < N; i++) {
    const k = rounds * N + i;
    if (i % 8 === 7) jobs.push(whole(k).then((s) => (s === 200 ? 0 : 1)));
    else if (i % 4 === 3) { dropped++; jobs.push(stream(k, true).then((r) => (r.status === 200 ? 0 : 1)).catch(() => 0)); }
    else jobs.push(stream(k, false).then((r) => (r.done ? 0 : 1)));
  }
  bad += (await Promise.all(jobs)).reduce((a, x) => a + x, 0);
  rounds++;
  await new Promise((r) => setTimeout(r, 100));
  samples.push(rssKiB());
}
const warm = Math.min(3, samples.length - 1);
const after = samples.slice(warm), first = after[0], last = after[after.length - 1], peak = Math.max(...after);
check(rounds >= 6 && bad === 0, `${rounds} rounds of ${N} concurrent requests (${dropped} streams dropped by the client) all served`, { rounds, bad });
// growth after the warm-up: under 8 MiB in all, and no steady climb (the last third's mean within
// 4 MiB of the first third's)
const third = Math.max(1, Math.floor(after.length / 3));
const mean = (a) => a.reduce((x, y) => x + y, 0) / a.length;
const climb = mean(after.slice(-third)) - mean(after.slice(0, third));
check(peak - first < 8192 && climb < 4096, `RSS flat over the soak (first ${first} KiB, last ${last} KiB, peak ${peak} KiB)`, samples);
const lanes = await (await fetch(`${base}/metrics`, { headers })).text();
check(/^dsv4_lanes_busy 0$/m.test(lanes) && /^dsv4_queue_length 0$/m.test(lanes), 'every lane and queue slot free after the soak');

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
