// Load for `dsv4 serve`: N concurrent streams (N = 1, 2, 4, 8) and a resumed long prompt.
//   node bench/serve_bench.mjs --port P [--tokens 64] [--long 2000] [--key K]
// Prints, per N: mean time to first token, mean per-stream decode tokens/s (after the first
// token) and aggregate tokens/s (all tokens over the wall time); then the time to first token
// of a long prompt cold (no cache) and resumed (its state cached by a previous identical turn).
const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (i % 2 ? a : [...a, [x.replace(/^--/, ''), v[i + 1]]]), []));
const base = `http://127.0.0.1:${args.port}`;
const T = Number(args.tokens ?? 64), LONG = Number(args.long ?? 2000);
const headers = { 'Content-Type': 'application/json', ...(args.key ? { Authorization: `Bearer ${args.key}` } : {}) };

async function stream(body) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers, body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const dec = new TextDecoder();
  let buf = '', first = null, n = 0, cached = 0;
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) { n = j.usage.completion_tokens; cached = j.usage.prompt_tokens_details?.cached_tokens ?? 0; }
      else if (first === null && j.choices[0]?.token_ids?.length) first = performance.now();
    }
  }
  const t1 = performance.now();
  return { ttft: (first - t0) / 1000, total: (t1 - t0) / 1000, n, decode_tps: n > 1 ? (n - 1) / ((t1 - first) / 1000) : 0, cached };
}

const fmt = (x, d = 3) => x.toFixed(d);
// warm-up: the first request pages the weights in
await stream({ prompt: 'warm up', max_tokens: 8, temperature: 0, cache_prompt: false, return_token_ids: true });
console.log(`streams  ttft_s  per_stream_tok_s  aggregate_tok_s  (${T} tokens each, greedy, no cache)`);
for (const N of [1, 2, 4, 8]) {
  const t0 = performance.now();
  const rs = await Promise.all(Array.from({ length: N }, (_, i) =>
    stream({ prompt: `Benchmark stream ${N}.${i}: tell a story about number ${i}.`, max_tokens: T, temperature: 0, ignore_eos: true, cache_prompt: false, return_token_ids: true })));
  const wall = (performance.now() - t0) / 1000;
  const mean = (f) => rs.reduce((a, r) => a + f(r), 0) / N;
  console.log(`${String(N).padStart(7)}  ${fmt(mean((r) => r.ttft))}  ${fmt(mean((r) => r.decode_tps), 1).padStart(16)}  ${fmt(rs.reduce((a, r) => a + r.n, 0) / wall, 1).padStart(15)}`);
}
const long = Array.from({ length: LONG }, (_, i) => 1000 + ((i * 7919) % 100000));
const cold = await stream({ prompt: long, max_tokens: 4, temperature: 0, cache_prompt: false, return_token_ids: true });
await stream({ prompt: long, max_tokens: 4, temperature: 0, return_token_ids: true });
const warm = await stream({ prompt: [...long, 5, 6, 7], max_tokens: 4, temperature: 0, return_token_ids: true });
console.log(`long prompt ${LONG} tokens: cold ttft ${fmt(cold.ttft)} s; resumed ttft ${fmt(warm.ttft)} s (${warm.cached} tokens from the cache)`);
