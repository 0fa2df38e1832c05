// Client checks for `dsv4 serve` with the official openai SDK, against a live server on
// loopback (v4-tiny-v: real vocabulary, random weights). Usage:
//   node check.mjs --port P --key K
// Prints one line per check ("ok ..." / "FAIL ...") and ends with "N passed, M failed".
import OpenAI from 'openai';

const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (i % 2 ? a : [...a, [x.replace(/^--/, ''), v[i + 1]]]), []));
const base = `http://127.0.0.1:${args.port}`;
const key = args.key;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;

let passed = 0, failed = 0;
function check(cond, what, detail) {
  if (cond) { passed++; console.log(`ok   ${what}`); }
  else { failed++; console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 400) : ''}`); }
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

async function post(path, body, raw) {
  const r = await fetch(base + path, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` }, body: raw ?? JSON.stringify(body) });
  let j = null;
  try { j = await r.json(); } catch { /* not JSON: the checks below catch it */ }
  return { status: r.status, json: j };
}
async function metric(name) {
  const t = await (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${key}` } })).text();
  const m = t.match(new RegExp(`^${name} ([0-9.e+]+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

// one completion, non-streamed or streamed, reduced to what must agree
async function complete(params, stream) {
  if (!stream) {
    const r = await client.completions.create({ model, ...params });
    const c = r.choices[0];
    return { text: c.text, ids: c.token_ids, lp: c.logprobs?.token_logprobs, toks: c.logprobs?.tokens, finish: c.finish_reason, usage: r.usage };
  }
  const s = await client.completions.create({ model, ...params, stream: true, stream_options: { include_usage: true } });
  const out = { text: '', ids: [], lp: params.logprobs != null ? [] : undefined, toks: params.logprobs != null ? [] : undefined, finish: null, usage: null, ids_const: true };
  let id = null;
  for await (const ch of s) {
    if (id === null) id = ch.id;
    out.ids_const &&= ch.id === id;
    if (ch.usage) out.usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    out.text += c.text;
    if (c.token_ids) out.ids.push(...c.token_ids);
    if (c.logprobs) { out.lp.push(...c.logprobs.token_logprobs); out.toks.push(...c.logprobs.tokens); }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

async function chat(params, stream) {
  if (!stream) {
    const r = await client.chat.completions.create({ model, ...params });
    const c = r.choices[0];
    return { text: c.message.content, lp: c.logprobs?.content?.map((x) => x.logprob), toks: c.logprobs?.content?.map((x) => x.token), finish: c.finish_reason, usage: r.usage };
  }
  const s = await client.chat.completions.create({ model, ...params, stream: true, stream_options: { include_usage: true } });
  const out = { text: '', lp: params.logprobs ? [] : undefined, toks: params.logprobs ? [] : undefined, finish: null, usage: null, first_role: null, ids_const: true };
  let id = null, n = 0;
  for await (const ch of s) {
    if (id === null) id = ch.id;
    out.ids_const &&= ch.id === id;
    if (ch.usage) out.usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    if (n++ === 0) out.first_role = c.delta.role;
    out.text += c.delta.content ?? '';
    if (c.logprobs) { out.lp.push(...c.logprobs.content.map((x) => x.logprob)); out.toks.push(...c.logprobs.content.map((x) => x.token)); }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

const prompts = ['The capital of France is', 'def fibonacci(n):', '你好，世界！今天', 'Once upon a time in a land far away, there lived a',
  '1, 2, 3, 4,', 'SELECT * FROM', 'Ünïcödé and émojis 🎉 are', 'In 1905 Einstein published'];

// ---- stream == non-stream, greedy and seeded, with logprobs that concatenate to the text
for (const [name, extra] of [['greedy', { temperature: 0 }], ['seeded', { temperature: 1, top_p: 0.9, seed: 4242 }]]) {
  const p = { prompt: prompts[0], max_tokens: 12, logprobs: 3, return_token_ids: true, ...extra };
  const a = await complete(p, false), b = await complete(p, true);
  check(a.ids.length === 12 && same(a.ids, b.ids) && a.text === b.text && same(a.lp, b.lp), `completions ${name}: stream == non-stream (tokens, text, logprobs)`, { a, b });
  check(a.toks.join('') === a.text && b.toks.join('') === b.text, `completions ${name}: logprobs tokens concatenate to the text`, { toks: a.toks, text: a.text });
  check(b.ids_const && b.usage?.completion_tokens === 12 && b.finish === 'length', `completions ${name}: constant id, usage chunk, finish`, b);
}
{
  const p = { messages: [{ role: 'user', content: 'Say something.' }], max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 2 };
  const a = await chat(p, false), b = await chat(p, true);
  check(a.text === b.text && same(a.lp, b.lp) && a.lp.length === 10, 'chat: stream == non-stream (text, logprobs)', { a, b });
  check(a.toks.join('') === a.text, 'chat: logprobs tokens concatenate to the content', a);
  check(b.first_role === 'assistant' && b.ids_const && b.usage?.completion_tokens === 10, 'chat: first delta carries the role, constant id, usage', b);
}

// ---- stop strings that span two or three tokens: stream == non-stream over many seeds (the
// same tokens, text, logprobs, finish, and as many token ids as usage counts)
{
  let bad = [], n = 0;
  for (let seed = 1; seed <= 24; seed++) {
    const base = { prompt: prompts[seed % prompts.length], max_tokens: 24, temperature: 1, seed, logprobs: 1, return_token_ids: true, cache_prompt: false };
    const g = await complete(base, false);
    const t = g.toks.map((x) => Array.from(x));
    const i = t.findIndex((x, k) => k + 2 < t.length && x.length > 0 && t[k + 1].length > 0 && t[k + 2].length > 0 && k >= 2);
    if (i < 0) continue;
    const mid = seed % 2 ? '' : t[i + 1].join('') + (t[i + 2][0] ?? '');
    const stop = t[i][t[i].length - 1] + (mid || t[i + 1][0]);
    const p = { ...base, stop: [stop, '\n\n'] };
    const a = await complete(p, false), b = await complete(p, true);
    n++;
    if (!(same(a.ids, b.ids) && a.text === b.text && same(a.lp, b.lp) && a.finish === b.finish && a.finish === 'stop' &&
      a.ids.length === a.usage.completion_tokens && b.ids.length === b.usage.completion_tokens && !a.text.includes(stop)))
      bad.push({ seed, stop, a, b });
  }
  check(n >= 16 && bad.length === 0, `stop strings across token boundaries: stream == non-stream (${n} seeds)`, bad[0] ?? n);
}
{
  let bad = [], n = 0;
  for (let seed = 1; seed <= 8; seed++) {
    const base = { messages: [{ role: 'user', content: `Tell me something, ${seed}.` }], max_tokens: 20, temperature: 1, seed, logprobs: true, cache_prompt: false };
    const g = await chat(base, false);
    const t = g.toks.map((x) => Array.from(x));
    const i = t.findIndex((x, k) => k >= 2 && k + 1 < t.length && x.length > 0 && t[k + 1].length > 0);
    if (i < 0) continue;
    const stop = t[i][t[i].length - 1] + t[i + 1][0];
    const a = await chat({ ...base, stop }, false), b = await chat({ ...base, stop }, true);
    n++;
    if (!(a.text === b.text && same(a.lp, b.lp) && a.finish === 'stop' && b.finish === 'stop' && a.lp.length === a.usage.completion_tokens &&
      b.lp.length === b.usage.completion_tokens)) bad.push({ seed, stop, a, b });
  }
  check(n >= 6 && bad.length === 0, `chat: stop strings across token boundaries, stream == non-stream (${n} seeds)`, bad[0] ?? n);
}

// ---- thinking mode: reasoning_content, stream == non-stream; tools render and are accepted
{
  const p = { messages: [{ role: 'user', content: 'Think first.' }], max_tokens: 8, temperature: 0, reasoning_effort: 'high' };
  const a = await client.chat.completions.create({ model, ...p });
  const s = await client.chat.completions.create({ model, ...p, stream: true });
  let reasoning = '', content = '';
  for await (const ch of s) { reasoning += ch.choices[0]?.delta?.reasoning_content ?? ''; content += ch.choices[0]?.delta?.content ?? ''; }
  const m = a.choices[0].message;
  check(typeof m.reasoning_content === 'string' && m.reasoning_content.length > 0 && m.reasoning_content === reasoning && (m.content ?? '') === content,
    'thinking: reasoning_content, stream == non-stream', { m, reasoning, content });
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const withTools = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, max_tokens: 4, temperature: 0 });
  const without = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Paris?' }], max_tokens: 4, temperature: 0 });
  const none = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'none', max_tokens: 4, temperature: 0 });
  check(withTools.usage.prompt_tokens > without.usage.prompt_tokens + 50 && none.usage.prompt_tokens === without.usage.prompt_tokens,
    'tools are rendered into the prompt (tool_choice none leaves them out)', [withTools.usage, without.usage, none.usage]);
}

// ---- teacher forcing: a forced DSML continuation comes back as tool_calls (stream and not), and
// forced tokens carry the logprobs the model gives them
{
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } } } }];
  // the tags of the model's family: V4 (0731) writes <｜DSML｜tool_calls>, V4.1 <｜DSML｜ calls>
  const v4 = (await client.models.retrieve(model)).family === 'deepseek_v4';
  const [C, I, P] = v4 ? ['tool_calls', 'invoke', 'parameter'] : [' calls', ' invoke', ' parameter'];
  const dsml = `Let me check.\n\n<｜DSML｜${C}>\n<｜DSML｜${I} name="get_weather">\n<｜DSML｜${P} name="city" string="true">Paris</｜DSML｜${P}>\n` +
    `<｜DSML｜${P} name="days" string="false">2</｜DSML｜${P}>\n</｜DSML｜${I}>\n</｜DSML｜${C}><｜end▁of▁sentence｜>`;
  const forced = (await post('/tokenize', { prompt: dsml })).json.tokens;
  const p = { messages: [{ role: 'user', content: 'Weather in Paris for two days?' }], tools, forced_tokens: forced, logprobs: true };
  const a = await client.chat.completions.create({ model, ...p });
  const m = a.choices[0].message, tc = m.tool_calls?.[0];
  check(a.choices[0].finish_reason === 'tool_calls' && m.content === 'Let me check.' && tc?.type === 'function' && tc.function.name === 'get_weather' &&
    same(JSON.parse(tc.function.arguments), { city: 'Paris', days: 2 }) && a.usage.completion_tokens === forced.length &&
    a.choices[0].logprobs.content.length === forced.length && a.choices[0].logprobs.content.every((x) => x.logprob < 0),
    'forced DSML continuation -> tool_calls, content, teacher-forced logprobs', a.choices[0]);
  const s = await client.chat.completions.create({ model, ...p, stream: true });
  let content = '', calls = [], finish = null, lps = [];
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    content += c.delta.content ?? '';
    for (const t of c.delta.tool_calls ?? []) {
      if (t.id) calls[t.index] = { id: t.id, function: { name: t.function.name, arguments: '' } };
      calls[t.index].function.arguments += t.function.arguments ?? '';
    }
    if (c.logprobs) lps.push(...c.logprobs.content.map((x) => x.logprob));
    if (c.finish_reason) finish = c.finish_reason;
  }
  check(finish === 'tool_calls' && content === m.content && calls.length === 1 && /^call_/.test(calls[0].id) && calls[0].function.name === 'get_weather' &&
    calls[0].function.arguments === tc.function.arguments && same(lps, a.choices[0].logprobs.content.map((x) => x.logprob)),
    'forced DSML continuation streamed: same tool call, content and logprobs', { content, calls, finish });
  const g = await complete({ prompt: prompts[2], max_tokens: 6, temperature: 0, logprobs: 2, return_token_ids: true }, false);
  const f = await complete({ prompt: prompts[2], forced_tokens: g.ids, logprobs: 2, return_token_ids: true }, false);
  check(same(f.ids, g.ids) && same(f.lp, g.lp) && f.text === g.text, 'forcing the greedy tokens gives their greedy logprobs', { f, g });
}

// ---- a list of prompts (evaluation harnesses score batches): one choice each, as if sent alone
{
  const list = [prompts[0], prompts[4], prompts[6]];
  const p = { max_tokens: 5, temperature: 0, logprobs: 1, return_token_ids: true, cache_prompt: false };
  const r = await client.completions.create({ model, prompt: list, ...p });
  const alone = [];
  for (const pr of list) alone.push(await complete({ prompt: pr, ...p }, false));
  check(r.choices.length === 3 && r.choices.every((c, i) => c.index === i && same(c.token_ids, alone[i].ids) && same(c.logprobs.token_logprobs, alone[i].lp)) &&
    r.usage.completion_tokens === 15 && r.usage.prompt_tokens === alone.reduce((a, x) => a + x.usage.prompt_tokens, 0),
    'a list of prompts: one choice each, equal to each alone; usage summed', { r, alone });
  const ids = (await post('/tokenize', { prompt: 'Two prompts as ids' })).json.tokens;
  const sc = await client.completions.create({ model, prompt: [ids, ids.slice(0, 2)], max_tokens: 0, echo: true, logprobs: 0 });
  check(sc.choices.length === 2 && sc.choices[0].logprobs.token_logprobs.length === ids.length && sc.choices[1].logprobs.token_logprobs.length === 2 &&
    sc.choices[1].logprobs.token_logprobs[1] === sc.choices[0].logprobs.token_logprobs[1], 'batched scoring of id lists (echo, max_tokens 0)', sc.choices);
}

// ---- seeded sampling is reproducible; another seed differs
{
  const p = { prompt: prompts[3], max_tokens: 10, temperature: 1, return_token_ids: true };
  const a = await complete({ ...p, seed: 1 }, false), b = await complete({ ...p, seed: 1 }, false), c = await complete({ ...p, seed: 2 }, false);
  check(same(a.ids, b.ids) && !same(a.ids, c.ids), 'seed: same seed same tokens, other seed other tokens', { a: a.ids, b: b.ids, c: c.ids });
}

// ---- concurrent == solo: 8 requests (4 lanes: some wait and join later), greedy and seeded
{
  const reqs = prompts.map((pr, i) => ({ prompt: pr.repeat(1 + (i % 3) * 4), max_tokens: 8 + i, logprobs: 1, return_token_ids: true, cache_prompt: false,
    ...(i % 2 ? { temperature: 0.9, seed: 100 + i } : { temperature: 0 }) }));
  const solo = [];
  for (const r of reqs) solo.push(await complete(r, false));
  const conc = await Promise.all(reqs.map((r, i) => complete(r, i % 2 === 1)));
  const bad = conc.map((c, i) => (same(c.ids, solo[i].ids) && same(c.lp, solo[i].lp) && c.text === solo[i].text ? -1 : i)).filter((i) => i >= 0);
  check(bad.length === 0, 'concurrent == solo for 8 requests over 4 lanes (tokens, logprobs, text)', { bad, conc: conc[bad[0]], solo: solo[bad[0]] });
}

// ---- resumed == fresh: a next turn resumes from the cached state
{
  const tok = (await post('/tokenize', { prompt: 'A long story begins here. '.repeat(12) })).json.tokens;
  const t1 = await complete({ prompt: tok, max_tokens: 6, temperature: 0, return_token_ids: true }, false);
  const next = [...tok, ...t1.ids.slice(0, 5), ...(await post('/tokenize', { prompt: ' And then?' })).json.tokens];
  for (const [name, extra] of [['greedy', { temperature: 0 }], ['seeded', { temperature: 1, seed: 9 }]]) {
    const p = { prompt: next, max_tokens: 8, logprobs: 2, return_token_ids: true, ...extra };
    const resumed = await complete(p, false);
    const fresh = await complete({ ...p, cache_prompt: false }, false);
    check(resumed.usage.prompt_tokens_details.cached_tokens >= tok.length && fresh.usage.prompt_tokens_details.cached_tokens === 0,
      `resume ${name}: usage reports cached prompt tokens`, { resumed: resumed.usage, fresh: fresh.usage });
    check(same(resumed.ids, fresh.ids) && same(resumed.lp, fresh.lp), `resume ${name}: resumed == fresh`, { resumed, fresh });
  }
  const msgs = [{ role: 'user', content: 'Tell me about the sea.' }];
  const c1 = await chat({ messages: msgs, max_tokens: 6, temperature: 0 }, false);
  const msgs2 = [...msgs, { role: 'assistant', content: c1.text }, { role: 'user', content: 'More.' }];
  const r2 = await chat({ messages: msgs2, max_tokens: 6, temperature: 0, logprobs: true }, false);
  const f2 = await chat({ messages: msgs2, max_tokens: 6, temperature: 0, logprobs: true, cache_prompt: false }, false);
  check(r2.usage.prompt_tokens_details.cached_tokens > 0 && r2.text === f2.text && same(r2.lp, f2.lp), 'chat second turn: cached and == fresh', { r2, f2 });
}

// ---- echo with prompt logprobs (scoring), stop strings, tokenize/detokenize, metrics
{
  const r = await client.completions.create({ model, prompt: 'Scoring this text', max_tokens: 0, echo: true, logprobs: 1 });
  const lp = r.choices[0].logprobs;
  check(r.choices[0].text === 'Scoring this text' && lp.token_logprobs[0] === null && lp.token_logprobs.slice(1).every((x) => x < 0) && lp.tokens.join('') === 'Scoring this text' &&
    lp.top_logprobs.slice(1).every((m, i) => m && Object.values(m).length === 1 && Object.values(m)[0] >= lp.token_logprobs[i + 1]),
    'echo + logprobs + max_tokens 0 scores the prompt', r.choices[0]);
  const es = await complete({ prompt: 'Scoring this text', max_tokens: 0, echo: true, logprobs: 1 }, true);
  check(es.text === 'Scoring this text' && same(es.lp, lp.token_logprobs) && same(es.toks, lp.tokens), 'echo scoring streamed == not streamed', { es, lp });
  const g = await complete({ prompt: prompts[1], max_tokens: 12, temperature: 0, return_token_ids: true }, false);
  const stop = g.text.slice(4, 7);
  if (stop.length === 3 && g.text.indexOf(stop) >= 0) {
    const cut = g.text.slice(0, g.text.indexOf(stop));
    const s1 = await complete({ prompt: prompts[1], max_tokens: 12, temperature: 0, stop: [stop] }, false);
    const s2 = await complete({ prompt: prompts[1], max_tokens: 12, temperature: 0, stop: stop }, true);
    check(s1.text === cut && s2.text === cut && s1.finish === 'stop' && s2.finish === 'stop', 'stop string cuts the text (stream and not)', { cut, s1: s1.text, s2: s2.text });
  } else {
    check(false, 'stop string test needs a 3-char piece of text', g.text);
  }
  const t = await post('/tokenize', { prompt: 'héllo wörld' });
  const d = await post('/detokenize', { tokens: t.json.tokens });
  check(t.status === 200 && d.json.prompt === 'héllo wörld' && t.json.count === t.json.tokens.length, 'tokenize/detokenize round trip', { t: t.json, d: d.json });
  check((await metric('dsv4_generated_tokens_total')) > 0 && (await metric('dsv4_cached_prompt_tokens_total')) > 0, '/metrics counts tokens');
  const n = await metric('dsv4_request_duration_seconds_count'), inf = await metric('dsv4_time_to_first_token_seconds_bucket\\{le="\\+Inf"\\}');
  check(n > 10 && inf > 10 && inf <= n, '/metrics latency histograms', { n, inf });
}

// ---- constrained decoding: response_format and forced tool calls. The random-weight model's
// replies still parse and validate; a constraint keeps stream == non-stream, concurrent == solo
// and drafted == plain.
{
  const schema = { type: 'object', properties: { a: { type: 'integer' }, b: { enum: ['x', 'y'] }, c: { type: 'array', items: { type: 'boolean' }, maxItems: 3 } },
    required: ['a', 'b', 'c'], additionalProperties: false };
  const valid = (v) => v && typeof v === 'object' && Number.isInteger(v.a) && ['x', 'y'].includes(v.b) && Array.isArray(v.c) && v.c.length <= 3 &&
    v.c.every((x) => typeof x === 'boolean') && Object.keys(v).length === 3;
  const rf = { type: 'json_schema', json_schema: { name: 'abc', strict: true, schema } };
  const runs = [];
  for (let seed = 1; seed <= 6; seed++) {
    const p = { messages: [{ role: 'user', content: `Give me a, b and c (${seed}).` }], response_format: rf, max_tokens: 300, temperature: 1, seed, logprobs: true, cache_prompt: false };
    const a = await chat(p, false), b = await chat(p, true), d = await chat({ ...p, draft: 4 }, false);
    let v = null;
    try { v = JSON.parse(a.text); } catch { /* checked below */ }
    runs.push({ p, a, ok: a.finish === 'stop' && valid(v) && a.text === b.text && same(a.lp, b.lp) && b.finish === 'stop' && a.text === d.text && same(a.lp, d.lp) });
  }
  check(runs.every((r) => r.ok), 'json_schema (strict): every reply validates; stream == non-stream == drafted (6 seeds)', runs.find((r) => !r.ok));
  const conc = await Promise.all(runs.map((r, i) => chat(r.p, i % 2 === 1)));
  check(conc.every((c, i) => c.text === runs[i].a.text && same(c.lp, runs[i].a.lp)), 'json_schema: concurrent == solo', conc);
  const o = await chat({ messages: [{ role: 'user', content: 'An object, please.' }], response_format: { type: 'json_object' }, max_tokens: 40, temperature: 0, seed: 2 }, false);
  check(/^\s*\{/.test(o.text) && (o.finish === 'length' || typeof JSON.parse(o.text) === 'object'), 'json_object: the reply is (the start of) a JSON object', o);
  const t = await chat({ messages: [{ role: 'user', content: 'Plain text.' }], response_format: { type: 'text' }, max_tokens: 6, temperature: 0 }, false);
  const t0 = await chat({ messages: [{ role: 'user', content: 'Plain text.' }], max_tokens: 6, temperature: 0 }, false);
  check(t.text === t0.text, 'response_format text: as without it', { t, t0 });

  const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, days: { type: 'integer' } }, required: ['city', 'days'] } } },
    { type: 'function', function: { name: 'set_alarm', parameters: { type: 'object', properties: { on: { type: 'boolean' } }, required: ['on'] } } },
  ];
  const msgs = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const named = await client.chat.completions.create({ model, messages: msgs, tools, tool_choice: { type: 'function', function: { name: 'set_alarm' } }, max_tokens: 400, temperature: 1, seed: 5 });
  const nc = named.choices[0].message.tool_calls ?? [];
  check(named.choices[0].finish_reason === 'tool_calls' && nc.length === 1 && nc[0].function.name === 'set_alarm' && typeof JSON.parse(nc[0].function.arguments).on === 'boolean',
    'tool_choice named: one call of that function, arguments valid', named.choices[0]);
  let bad = [];
  for (let seed = 1; seed <= 4; seed++) {
    const r = await client.chat.completions.create({ model, messages: msgs, tools, tool_choice: 'required', max_tokens: 600, temperature: 1, seed });
    const c = r.choices[0], calls = c.message.tool_calls ?? [];
    const ok = c.finish_reason === 'tool_calls' && calls.length >= 1 && calls.every((x) => {
      const a = JSON.parse(x.function.arguments);
      return x.function.name === 'get_weather' ? ['Paris', 'Oslo'].includes(a.city) && Number.isInteger(a.days) : x.function.name === 'set_alarm' && typeof a.on === 'boolean';
    });
    if (!ok) bad.push(c);
  }
  check(bad.length === 0, 'tool_choice required: a call of the given tools, arguments follow their schemas (4 seeds)', bad[0]);
  const auto = await chat({ messages: msgs, tools, tool_choice: 'auto', max_tokens: 6, temperature: 0 }, false);
  const dflt = await chat({ messages: msgs, tools, max_tokens: 6, temperature: 0 }, false);
  check(auto.text === dflt.text, 'tool_choice auto: unconstrained, as without it', { auto, dflt });
}

// ---- details clients rely on: tool calls stream their name, then argument fragments, and no
// chunk carries an empty content string; a call cut by max_tokens comes back as far as it
// parsed (finish length); text_offset counts characters; created times are real
async function rawStream(body) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, ...body, stream: true }) });
  const t = await r.text();
  return t.split('\n').filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]').map((l) => JSON.parse(l.slice(6)));
}
{
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, days: { type: 'integer' } }, required: ['city', 'days'] } } }];
  const p = { messages: [{ role: 'user', content: 'Weather?' }], tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 1, seed: 3 };
  // the cut: the first token count whose text has begun the "days" parameter (a seeded draw
  // does not depend on max_tokens, so the cut reply is a prefix of the whole one)
  const whole = await client.chat.completions.create({ model, ...p, max_tokens: 400, return_token_ids: true });
  const ids = whole.choices[0].token_ids;
  let lo = 1, hi = ids.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((await post('/detokenize', { tokens: ids.slice(0, mid) })).json.prompt.includes('name="days"')) hi = mid; else lo = mid + 1;
  }
  for (const [what, max_tokens, finish] of [['whole', 400, 'tool_calls'], ['cut by max_tokens', lo + 1, 'length']]) {
    const a = await client.chat.completions.create({ model, ...p, max_tokens });
    const chunks = await rawStream({ ...p, max_tokens });
    const deltas = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
    const args = deltas.map((d) => d.function.arguments).join('');
    const tc = a.choices[0].message.tool_calls?.[0];
    const emptyContent = chunks.filter((c) => c.choices[0]?.delta && 'content' in c.choices[0].delta && !c.choices[0].delta.content).length;
    check(tc && a.choices[0].finish_reason === finish && chunks.at(-1).choices[0].finish_reason === finish && deltas.length >= 3 &&
      /^call_/.test(deltas[0].id) && deltas[0].function.name === 'get_weather' && deltas[0].function.arguments === '' &&
      deltas.slice(1).every((d) => d.index === 0 && !d.id && !d.function.name) && args === tc.function.arguments && emptyContent === 0,
      `tool call streamed (${what}): the name, then argument fragments equal to the whole reply's; no empty content`, { a: a.choices[0], deltas, emptyContent });
    if (finish === 'length') {
      const w = JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments), c = JSON.parse(tc.function.arguments);
      check(same(c, { city: w.city }), 'a call cut by max_tokens keeps the parameters complete so far', { tc, w });
    }
  }
  const plain = await rawStream({ messages: [{ role: 'user', content: 'Hello there.' }], max_tokens: 12, temperature: 0 });
  check(plain.every((c) => !c.choices[0]?.delta || !('content' in c.choices[0].delta) || c.choices[0].delta.content.length > 0) && plain[0].choices[0].delta.role === 'assistant',
    'chat stream: no empty content deltas', plain.map((c) => c.choices[0]?.delta));

  const r = await client.completions.create({ model, prompt: 'Ünïcödé 🎉 日本', max_tokens: 8, echo: true, logprobs: 0, temperature: 0 });
  const lp = r.choices[0].logprobs;
  let at = 0, offs = [];
  for (const t of lp.tokens) { offs.push(at); at += Array.from(t).length; }
  check(same(lp.text_offset, offs) && Array.from(r.choices[0].text).length === at, 'text_offset counts characters (code points), echo included', { lp, offs });
  const now = Date.now() / 1000;
  const m = (await client.models.list()).data[0];
  check(m.created > now - 86400 && m.created <= now + 5 && Math.abs(r.created - now) < 60, 'created: real times (the model: when the server started)', { m, created: r.created });
  const o = await fetch(`${base}/v1/chat/completions`, { method: 'OPTIONS', headers: { Origin: 'http://app.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization,content-type' } });
  const g = await fetch(`${base}/v1/models`, { headers: { Origin: 'http://app.example', Authorization: `Bearer ${key}` } });
  check(o.status === 204 && o.headers.get('access-control-allow-origin') === '*' && /authorization/i.test(o.headers.get('access-control-allow-headers')) &&
    /POST/.test(o.headers.get('access-control-allow-methods')) && g.status === 200 && g.headers.get('access-control-allow-origin') === '*',
    'CORS by default: preflight answered (no key needed), any origin allowed', { o: o.status, g: g.status });
}

// ---- bad inputs: 4xx with an OpenAI-style error body, and the server keeps serving
{
  const cases = [
    ['malformed JSON', '/v1/completions', null, '{"prompt": "x",', 400],
    ['not an object', '/v1/chat/completions', null, '[1,2]', 400],
    ['wrong type temperature', '/v1/completions', { model, prompt: 'x', temperature: 'hot' }, null, 400],
    ['wrong type messages', '/v1/chat/completions', { model, messages: 'hi' }, null, 400],
    ['empty messages', '/v1/chat/completions', { model, messages: [] }, null, 400],
    ['bad message role', '/v1/chat/completions', { model, messages: [{ role: 'wizard', content: 'x' }] }, null, 400],
    ['unknown model', '/v1/completions', { model: 'gpt-nope', prompt: 'x' }, null, 404],
    ['empty prompt', '/v1/completions', { model, prompt: '' }, null, 400],
    ['token id out of range', '/v1/completions', { model, prompt: [1, 99999999] }, null, 400],
    ['longer than the context', '/v1/completions', { model, prompt: 'x', max_tokens: 10000000 }, null, 400],
    ['prompt longer than the context', '/v1/completions', { model, prompt: Array.from({ length: 65537 }, () => 5), max_tokens: 1 }, null, 400],
    ['body over 16 MiB', '/v1/completions', null, JSON.stringify({ model, prompt: 'x'.repeat(17 << 20) }), 413],
    ['forced_tokens out of range', '/v1/completions', { model, prompt: 'x', forced_tokens: [1, -3] }, null, 400],
    ['a list of prompts streamed', '/v1/completions', { model, prompt: ['a', 'b'], stream: true }, null, 400],
    ['a list holding a bad prompt', '/v1/completions', { model, prompt: ['a', ''] }, null, 400],
    ['n = 2', '/v1/completions', { model, prompt: 'x', n: 2 }, null, 400],
    ['top_logprobs 50', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 50 }, null, 400],
    ['logit_bias key', '/v1/completions', { model, prompt: 'x', logit_bias: { abc: 1 } }, null, 400],
    ['stop type', '/v1/completions', { model, prompt: 'x', stop: 5 }, null, 400],
    ['unknown route', '/v1/nothing', { model }, null, 404],
    ['tool without a name', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: {} }] }, null, 400],
    ['tool parameters not an object', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }, null, 400],
    ['tool_choice names no tool', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }, null, 400],
    ['message content wrong type', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 5 }] }, null, 400],
    ['response_format type unknown', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], response_format: { type: 'bogus' } }, null, 400],
    ['response_format not an object', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], response_format: 'json' }, null, 400],
    ['json_schema without a schema', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'n' } } }, null, 400],
    ['strict json_schema outside the subset', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'n', strict: true, schema: { type: 'object', properties: { a: { type: 'integer', minimum: 3 } } } } } }, null, 400],
    ['best_of 2', '/v1/completions', { model, prompt: 'x', best_of: 2 }, null, 400],
    ['an image part', '/v1/chat/completions', { model, messages: [{ role: 'user', content: [{ type: 'text', text: 'x' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,AA==' } }] }] }, null, 400],
    ['tool_choice required without tools', '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], tool_choice: 'required' }, null, 400],
  ];
  for (const [name, path, body, raw, want] of cases) {
    const r = await post(path, body, raw);
    check(r.status === want && typeof r.json?.error?.message === 'string' && typeof r.json?.error?.type === 'string', `bad input: ${name} -> ${want}`, r);
  }
  const got = await client.models.retrieve(model);
  let missing = null;
  try { await client.models.retrieve('nope'); } catch (e) { missing = e; }
  check(got.id === model && missing instanceof OpenAI.NotFoundError, 'models.retrieve: the model, and 404 for another', { got, missing: String(missing) });
  const bad = await fetch(`${base}/v1/models`, { headers: { Authorization: 'Bearer wrong' } });
  check(bad.status === 401 && (await bad.json()).error?.code === 'invalid_api_key', 'wrong API key -> 401');
  let threw = null;
  try { await client.completions.create({ model: 'nope', prompt: 'x' }); } catch (e) { threw = e; }
  check(threw instanceof OpenAI.NotFoundError, 'the SDK raises NotFoundError for an unknown model', String(threw));
  const ok = await complete({ prompt: 'still alive', max_tokens: 2, temperature: 0 }, false);
  check(ok.finish === 'length', 'the server keeps serving after bad input');
}

// ---- disconnect frees the lane (streaming and not)
async function lanesIdle(ms) {
  for (const end = Date.now() + ms; Date.now() < end; await new Promise((r) => setTimeout(r, 50)))
    if ((await metric('dsv4_lanes_busy')) === 0 && (await metric('dsv4_queue_length')) === 0) return true;
  return false;
}
{
  const ac = new AbortController();
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, prompt: 'go on forever', max_tokens: 5000, stream: true, ignore_eos: true }) });
  const rd = r.body.getReader();
  await rd.read();
  await rd.read();
  const busy = await metric('dsv4_lanes_busy');
  ac.abort();
  check(busy >= 1 && (await lanesIdle(5000)), 'stream disconnect frees the lane', { busy });
  const ac2 = new AbortController();
  const p = fetch(`${base}/v1/completions`, { method: 'POST', signal: ac2.signal, headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, prompt: 'and on', max_tokens: 5000, ignore_eos: true }) }).catch(() => null);
  await new Promise((res) => setTimeout(res, 400));
  const busy2 = await metric('dsv4_lanes_busy');
  ac2.abort();
  await p;
  check(busy2 >= 1 && (await lanesIdle(5000)), 'non-stream disconnect frees the lane', { busy2 });
}

// ---- a full queue answers 503 (4 lanes + queue of 8: at most 12 of 16 simultaneous requests
// are taken, at least the 8 the queue holds)
{
  const ps = [];
  for (let i = 0; i < 16; i++) ps.push(post('/v1/completions', { model, prompt: `load ${i}`, max_tokens: 120, ignore_eos: true, cache_prompt: false }));
  const rs = await Promise.all(ps);
  const n503 = rs.filter((r) => r.status === 503 && r.json?.error).length, n200 = rs.filter((r) => r.status === 200).length;
  check(n503 >= 1 && n200 >= 8 && n503 + n200 === 16, 'full queue -> 503 with an error body', { n503, n200 });
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
