// Real clients, unmodified, against `dsv4 serve` on loopback (v4-tiny-v: real vocabulary, random
// weights): the Vercel AI SDK (its OpenAI-compatible provider over chat completions, and the
// default OpenAI provider, which calls the Responses API), LangChain JS's ChatOpenAI, and the
// openai SDK's responses.create. Each: generate, stream, forced tool calls, structured output,
// abort. Usage:
//   node clients.mjs --port P --key K
// Prints one line per check ("ok ..." / "FAIL ...") and ends with "N passed, M failed".
import OpenAI from 'openai';

globalThis.AI_SDK_LOG_WARNINGS = false; // the SDK's notes (a deprecation, "seed" on the Responses API) are not results
import { generateText, streamText, generateObject, tool, jsonSchema } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createOpenAI } from '@ai-sdk/openai';
import { ChatOpenAI } from '@langchain/openai';

const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (i % 2 ? a : [...a, [x.replace(/^--/, ''), v[i + 1]]]), []));
const base = `http://127.0.0.1:${args.port}`;
const key = args.key;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;

let passed = 0, failed = 0;
async function check(what, fn) {
  let ok = false, detail;
  try { [ok, detail] = await fn(); } catch (e) { detail = String(e?.stack ?? e); }
  if (ok) { passed++; console.log(`ok   ${what}`); }
  else { failed++; console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 600) : ''}`); }
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
async function metric(name) {
  const t = await (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${key}` } })).text();
  const m = t.match(new RegExp(`^${name} ([0-9.e+]+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}
async function lanesIdle(ms) {
  for (const end = Date.now() + ms; Date.now() < end; await new Promise((r) => setTimeout(r, 50)))
    if ((await metric('dsv4_lanes_busy')) === 0 && (await metric('dsv4_queue_length')) === 0) return true;
  return false;
}

// a tool whose arguments the random-weight model can finish: an enum and a boolean
const weatherSchema = { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, rain: { type: 'boolean' } }, required: ['city', 'rain'], additionalProperties: false };
const validWeather = (a) => a && ['Paris', 'Oslo'].includes(a.city) && typeof a.rain === 'boolean';
const objSchema = { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'string', enum: ['x', 'y'] }, c: { type: 'array', items: { type: 'boolean' }, maxItems: 3 } }, required: ['a', 'b', 'c'], additionalProperties: false };
const validObj = (v) => v && Number.isInteger(v.a) && ['x', 'y'].includes(v.b) && Array.isArray(v.c) && v.c.length <= 3 && v.c.every((x) => typeof x === 'boolean');

// ---- the Vercel AI SDK, OpenAI-compatible provider (chat completions)
const compat = createOpenAICompatible({ name: 'dsv4', baseURL: `${base}/v1`, apiKey: key, supportsStructuredOutputs: true, includeUsage: true });
const vercelTools = { get_weather: tool({ description: 'Weather for a city', inputSchema: jsonSchema(weatherSchema) }) };
for (const [name, m] of [['openai-compatible', compat.chatModel(model)], ['openai (Responses API)', createOpenAI({ baseURL: `${base}/v1`, apiKey: key })(model)]]) {
  await check(`Vercel ${name}: generateText and streamText agree`, async () => {
    const p = { model: m, prompt: 'Say hello.', maxOutputTokens: 10, temperature: 0, maxRetries: 0 };
    const a = await generateText(p);
    const s = streamText(p);
    let text = '';
    for await (const t of s.textStream) text += t;
    const u = await s.usage;
    return [a.text.length > 0 && a.text === text && a.usage.outputTokens === 10 && u.outputTokens === 10 && a.finishReason === 'length', { a: a.text, text, u: a.usage }];
  });
  for (const choice of ['required', { type: 'tool', toolName: 'get_weather' }]) {
    await check(`Vercel ${name}: toolChoice ${JSON.stringify(choice)} gives a valid call (generate and stream)`, async () => {
      // greedy: the Responses API has no seed, so only greedy replies repeat there
      const p = { model: m, prompt: 'What is the weather in Paris?', tools: vercelTools, toolChoice: choice, maxOutputTokens: 400, temperature: 0, maxRetries: 0 };
      const a = await generateText(p);
      const s = streamText(p);
      const calls = await s.toolCalls;
      const c = a.toolCalls[0];
      return [a.toolCalls.length >= 1 && c.toolName === 'get_weather' && validWeather(c.input) && a.finishReason === 'tool-calls' &&
        calls.length === a.toolCalls.length && same(calls[0].input, c.input), { a: a.toolCalls, finish: a.finishReason, calls }];
    });
  }
  await check(`Vercel ${name}: generateObject validates`, async () => {
    const r = await generateObject({ model: m, schema: jsonSchema(objSchema), schemaName: 'abc', prompt: 'Give a, b and c.', maxOutputTokens: 300, temperature: 0, maxRetries: 0 });
    return [validObj(r.object), r.object];
  });
  await check(`Vercel ${name}: an aborted stream frees its lane`, async () => {
    const ac = new AbortController();
    const s = streamText({ model: m, prompt: 'Go on and on.', maxOutputTokens: 4000, abortSignal: ac.signal, maxRetries: 0, providerOptions: {} });
    let n = 0;
    try { for await (const t of s.textStream) { if (t && ++n === 3) ac.abort(); } } catch { /* the abort */ }
    return [n >= 3 && (await lanesIdle(5000)), { n }];
  });
}

// ---- LangChain JS ChatOpenAI (chat completions)
{
  const lc = new ChatOpenAI({ model, apiKey: key, configuration: { baseURL: `${base}/v1` }, temperature: 0, maxTokens: 10, maxRetries: 0 });
  await check('LangChain: invoke and stream agree', async () => {
    const a = await lc.invoke('Say hello.');
    let text = '';
    for await (const ch of await lc.stream('Say hello.')) text += ch.content;
    return [typeof a.content === 'string' && a.content.length > 0 && a.content === text && a.usage_metadata?.output_tokens === 10, { a: a.content, text }];
  });
  await check('LangChain: bindTools with tool_choice required gives a valid call', async () => {
    const big = new ChatOpenAI({ model, apiKey: key, configuration: { baseURL: `${base}/v1` }, temperature: 1, maxTokens: 400, maxRetries: 0 })
      .bindTools([{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: weatherSchema } }], { tool_choice: 'required' });
    const r = await big.invoke('What is the weather in Oslo?');
    return [r.tool_calls?.length >= 1 && r.tool_calls[0].name === 'get_weather' && validWeather(r.tool_calls[0].args), r.tool_calls];
  });
  await check('LangChain: withStructuredOutput (json_schema, strict) validates', async () => {
    const big = new ChatOpenAI({ model, apiKey: key, configuration: { baseURL: `${base}/v1` }, temperature: 1, maxTokens: 300, maxRetries: 0 });
    const r = await big.withStructuredOutput(objSchema, { name: 'abc', method: 'jsonSchema', strict: true }).invoke('Give a, b and c.');
    return [validObj(r), r];
  });
  await check('LangChain: an aborted stream frees its lane', async () => {
    const ac = new AbortController();
    const long = new ChatOpenAI({ model, apiKey: key, configuration: { baseURL: `${base}/v1` }, maxTokens: 4000, maxRetries: 0 });
    let n = 0;
    try { for await (const ch of await long.stream('Go on.', { signal: ac.signal })) { if (ch.content && ++n === 3) ac.abort(); } } catch { /* the abort */ }
    return [n >= 3 && (await lanesIdle(5000)), { n }];
  });
}

// ---- the openai SDK's Responses API: whole and streamed, a tool round trip, structured output
{
  await check('responses.create: output_text, usage; streamed events give the same text', async () => {
    const p = { model, input: 'Say hello.', instructions: 'Be brief.', max_output_tokens: 12, temperature: 0 };
    const a = await client.responses.create(p);
    const s = await client.responses.create({ ...p, stream: true });
    let text = '', types = [], done = null, seqOk = true, n = 0;
    for await (const e of s) {
      seqOk &&= e.sequence_number === n++;
      types.push(e.type);
      if (e.type === 'response.output_text.delta') text += e.delta;
      if (e.type === 'response.incomplete' || e.type === 'response.completed') done = e.response;
    }
    const want = ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added', 'response.output_text.delta'];
    return [a.output_text.length > 0 && a.output_text === text && a.status === 'incomplete' && a.incomplete_details?.reason === 'max_output_tokens' &&
      a.usage.output_tokens === 12 && a.usage.input_tokens > 0 && seqOk && same(types.slice(0, 5), want) &&
      same(types.slice(-4), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.incomplete']) &&
      done?.output?.[0]?.content?.[0]?.text === text && done.usage.output_tokens === 12, { a: a.output_text, text, types }];
  });
  await check('responses.create: tool_choice required, then the function_call_output round trip', async () => {
    const tools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city', parameters: weatherSchema, strict: true }];
    const input = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const p = { model, input, tools, tool_choice: 'required', max_output_tokens: 400, temperature: 1, seed: 11 };
    const a = await client.responses.create(p);
    const call = a.output.find((x) => x.type === 'function_call');
    const s = await client.responses.create({ ...p, stream: true });
    let args = '', added = null, argsDone = null;
    for await (const e of s) {
      if (e.type === 'response.output_item.added' && e.item.type === 'function_call' && !added) added = e.item;
      if (e.type === 'response.function_call_arguments.delta' && e.item_id === added?.id) args += e.delta;
      if (e.type === 'response.function_call_arguments.done' && !argsDone) argsDone = e;
    }
    const next = await client.responses.create({ model, tools, max_output_tokens: 6, temperature: 0,
      input: [...input, call, { type: 'function_call_output', call_id: call.call_id, output: '{"sunny": true}' }] });
    return [a.status === 'completed' && call && call.name === 'get_weather' && validWeather(JSON.parse(call.arguments)) && /^call_/.test(call.call_id) &&
      added?.name === 'get_weather' && args === call.arguments && argsDone?.arguments === call.arguments &&
      next.usage.input_tokens > a.usage.input_tokens && typeof next.output_text === 'string', { a: a.output, args, next: next.output }];
  });
  await check('responses.create: reasoning gives a reasoning item (whole == streamed), its tokens counted', async () => {
    const p = { model, input: 'Think first.', reasoning: { effort: 'high' }, max_output_tokens: 6, temperature: 0 };
    const a = await client.responses.create(p);
    let thought = '';
    for await (const e of await client.responses.create({ ...p, stream: true })) if (e.type === 'response.reasoning_text.delta') thought += e.delta;
    const r = a.output[0];
    return [r?.type === 'reasoning' && r.content[0].text.length > 0 && r.content[0].text === thought &&
      a.usage.output_tokens_details.reasoning_tokens === 6 && a.reasoning?.effort === 'high', { out: a.output, usage: a.usage, thought }];
  });
  await check('responses.create: text.format json_schema validates', async () => {
    const r = await client.responses.create({ model, input: 'Give a, b and c.', text: { format: { type: 'json_schema', name: 'abc', schema: objSchema, strict: true } }, max_output_tokens: 300, temperature: 1, seed: 5 });
    return [r.status === 'completed' && validObj(JSON.parse(r.output_text)), r.output_text];
  });
  await check('responses.create: refusals are 400s naming the field', async () => {
    const bad = [[{ previous_response_id: 'resp_x' }, 'previous_response_id'], [{ tools: [{ type: 'web_search' }] }, 'tools[0].type'],
      [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AA==' }] }] }, 'input[0].content[0]'],
      [{ text: { format: { type: 'bogus' } } }, 'text.format']];
    const got = [];
    for (const [extra, param] of bad) {
      try { await client.responses.create({ model, input: 'x', ...extra }); got.push(['no error', param]); } catch (e) { got.push([e.status, e.param ?? e.error?.param, param]); }
    }
    return [got.every((g) => g[0] === 400 && g[1] === g[2]), got];
  });
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
