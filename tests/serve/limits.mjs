// Limits and hostile input for `dsv4 serve`, over raw sockets to a live server on loopback:
// idle connections (1,100 held open, then a fresh /health), a full server's 503, the idle
// timeout, clients that leave while queued or streaming (their slot and lane freed), framing
// and malformed requests (4xx, JSON bodies from the server's own checks, the server keeps
// serving), authentication, UTF-8 in replies, exact seeds and the scoring cap. The server runs
// with --lanes 1 --queue 2 --idle-timeout 2 --max-score-tokens 100 and its key in DSV4_API_KEY.
//   node limits.mjs --port P --key K --pid PID
// Prints one line per check ("ok ..." / "FAIL ...") and ends with "N passed, M failed".
import fs from 'node:fs';
import net from 'node:net';

const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (i % 2 ? a : [...a, [x.replace(/^--/, ''), v[i + 1]]]), []));
const port = Number(args.port), key = args.key, host = '127.0.0.1';
const base = `http://${host}:${port}`;
let passed = 0, failed = 0;
function check(cond, what, detail) {
  if (cond) { passed++; console.log(`ok   ${what}`); }
  else { failed++; console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 600) : ''}`); }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const auth = { Authorization: `Bearer ${key}` };
const utf8 = new TextDecoder('utf-8', { fatal: true });

// Sends bytes on a fresh socket and reads until the server closes it (or ms pass).
function raw(bytes, ms = 4000, localAddress = undefined) {
  return new Promise((resolve) => {
    const chunks = [];
    let done = false;
    const s = net.connect({ port, host, localAddress });
    const end = (why) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      const buf = Buffer.concat(chunks), text = buf.toString('latin1');
      const m = text.match(/^HTTP\/1\.[01] (\d{3})/);
      const sep = text.indexOf('\r\n\r\n');
      const body = sep >= 0 ? buf.subarray(sep + 4) : Buffer.alloc(0);
      let json = null, valid = true;
      try { json = JSON.parse(utf8.decode(body)); } catch { valid = false; }
      resolve({ status: m ? Number(m[1]) : 0, statusLines: (text.match(/HTTP\/1\.[01] \d{3}/g) ?? []).length, head: sep >= 0 ? text.slice(0, sep) : text, body, json, valid, why });
    };
    const timer = setTimeout(() => end('timeout'), ms);
    s.on('data', (d) => chunks.push(d));
    s.on('end', () => end('closed'));
    s.on('error', () => end('error'));
    s.on('connect', () => s.write(bytes));
  });
}
const post = (path, body, extra = '', ms = 4000) => raw(`POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\n` +
  `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n${extra}\r\n${body}`, ms);
async function health(ms = 5000) {
  try { const r = await fetch(`${base}/health`, { signal: AbortSignal.timeout(ms) }); return r.status; } catch (e) { return String(e.cause?.code ?? e.name); }
}
async function metric(name) {
  let t = '';
  try { t = await (await fetch(`${base}/metrics`, { headers: auth, signal: AbortSignal.timeout(5000) })).text(); } catch { return NaN; }
  const m = t.match(new RegExp(`^${name} ([0-9.e+]+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}
async function waitFor(cond, ms) {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(50)) if (await cond()) return true;
  return false;
}
const idle = async () => (await metric('dsv4_lanes_busy')) === 0 && (await metric('dsv4_queue_length')) === 0;

// Opens n sockets that send nothing; resolves once each has connected or failed.
async function openIdle(n) {
  const socks = [];
  let closedByServer = 0;
  await Promise.all(Array.from({ length: n }, () => new Promise((res) => {
    const s = net.connect(port, host);
    s.on('connect', res);
    s.on('error', res);
    s.on('close', () => closedByServer++);
    socks.push(s);
  })));
  return { socks, closed: () => closedByServer };
}

// ---- 1,100 idle connections from one client: the idlest are closed to make room; a fresh
// /health is answered at once
{
  const t0 = Date.now();
  const { socks, closed } = await openIdle(1100);
  await sleep(300);
  const h = await health();
  const ms = Date.now() - t0;
  const closedIdle = await metric('dsv4_http_connections_closed_idle_total');
  const open = await metric('dsv4_http_connections');
  check(h === 200 && ms < 8000, '/health answered with 1,100 idle connections open', { h, ms });
  check(closedIdle >= 1100 - 128 && open <= 130 && closed() >= 1100 - 128, 'one client holds at most --client-connections (128) open; the idlest are closed',
    { closedIdle, open, closed: closed() });
  for (const s of socks) s.destroy();
  await waitFor(async () => (await metric('dsv4_http_connections')) <= 2, 3000);
}

// ---- the idle timeout (--idle-timeout 2) closes a silent connection
{
  const t0 = Date.now();
  const r = await raw('', 6000);
  const ms = Date.now() - t0;
  check(r.why === 'closed' && ms >= 1500 && ms < 5000, 'a silent connection is closed after the idle timeout', { why: r.why, ms });
}

// ---- every connection busy (headers sent, body pending): a newcomer is told 503 at once,
// and the busy ones time out
{
  const socks = [];
  await Promise.all(Array.from({ length: 128 }, () => new Promise((res) => {
    const s = net.connect(port, host, () => { s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{`); setTimeout(res, 20); });
    s.on('error', res);
    socks.push(s);
  })));
  await sleep(200);
  const t0 = Date.now();
  const r = await raw('GET /health HTTP/1.1\r\nHost: x\r\n\r\n', 4000);
  check(r.status === 503 && r.json?.error && Date.now() - t0 < 2000, 'with every connection of a client busy, its next one gets 503 with a JSON body', r.head);
  const other = await raw('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 4000, '127.0.0.2');
  check(other.status === 200, 'meanwhile another client (from 127.0.0.2) is served', other.head || other.why);
  for (const s of socks) s.destroy();
  check(await waitFor(async () => (await health(1000)) === 200, 5000), '/health answered again once they leave');
}

// ---- clients that leave while queued give their slot back at once; one that leaves mid-stream
// frees the lane
{
  const long = (stream) => JSON.stringify({ prompt: 'keep going', max_tokens: 5000, ignore_eos: true, stream, cache_prompt: false });
  const a = new AbortController(), b = new AbortController(), c = new AbortController();
  const go = (ac, stream) => fetch(`${base}/v1/completions`, { method: 'POST', signal: ac.signal, headers: { ...auth, 'Content-Type': 'application/json' }, body: long(stream) });
  const ra = await go(a, true);
  const rd = ra.body.getReader();
  await rd.read();
  const pb = go(b, false).catch(() => null), pc = go(c, true).then((r) => r.body.getReader().read()).catch(() => null);
  const queued = await waitFor(async () => (await metric('dsv4_queue_length')) === 2, 3000);
  b.abort();
  c.abort();
  await pb; await pc;
  const t0 = Date.now();
  const freed = await waitFor(async () => (await metric('dsv4_queue_length')) === 0, 2000);
  const ms = Date.now() - t0, busy = await metric('dsv4_lanes_busy');
  check(queued && freed && busy === 1 && ms < 1000, 'queued clients that leave (streamed and not) free their queue slots while the lane is busy', { queued, freed, busy, ms });
  const pd = post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 1 }));
  const taken = await waitFor(async () => (await metric('dsv4_queue_length')) === 1, 2000);
  a.abort();
  const d = await pd;
  check(taken && d.status === 200, 'a new request takes a freed slot (queued, then answered; not 503)', { taken, status: d.status });
  check(await waitFor(idle, 3000), 'a client that leaves mid-stream frees its lane');
}

// ---- a list of prompts waits without spinning, both for queue room (1 lane, a queue of 2: the
// fourth prompt waits) and with some prompts ended while others run: the threads other than the
// lanes' (HTTP, waker) use a small fraction of the CPU the lanes use meanwhile
{
  const cpu = () => {
    const t = { lanes: 0, other: 0 };
    for (const id of fs.readdirSync(`/proc/${args.pid}/task`)) {
      const p = `/proc/${args.pid}/task/${id}`;
      try {
        const f = fs.readFileSync(`${p}/stat`, 'utf8').split(') ')[1].split(' ');
        t[fs.readFileSync(`${p}/comm`, 'utf8').trim() === 'dsv4-lanes' ? 'lanes' : 'other'] += (Number(f[11]) + Number(f[12])) / 100;
      } catch { /* a thread that ended */ }
    }
    return t;
  };
  const c0 = cpu();
  const r = await post('/v1/completions', JSON.stringify({ prompt: ['first', 'second', 'third', 'fourth'], max_tokens: 120, ignore_eos: true, cache_prompt: false }), '', 90000);
  const c1 = cpu(), lanes = c1.lanes - c0.lanes, other = c1.other - c0.other;
  check(r.status === 200 && r.json.choices.length === 4 && lanes > 0.2 && other < 0.08 * lanes,
    `a list of prompts waits without spinning (CPU: ${other.toFixed(2)} s outside the lanes, ${lanes.toFixed(2)} s in them)`, r.status);
}

// ---- framing: requests a proxy could read differently are refused with a JSON 400
{
  const body = JSON.stringify({ prompt: 'x', max_tokens: 1 });
  const head = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n`;
  const cases = [
    ['two different Content-Length headers', `${head}Content-Length: ${body.length}\r\nContent-Length: 5\r\n\r\n${body}`, 400],
    ['Content-Length with Transfer-Encoding', `${head}Content-Length: ${body.length}\r\nTransfer-Encoding: chunked\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`, 400],
    ['two Transfer-Encoding headers', `${head}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`, 400],
    ['Transfer-Encoding gzip', `${head}Transfer-Encoding: gzip\r\n\r\n${body}`, 400],
    ['Transfer-Encoding "chunked " (a space after)', `${head}Transfer-Encoding: chunked \r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`, 400],
    ['Transfer-Encoding gzip, chunked', `${head}Transfer-Encoding: gzip, chunked\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`, 400],
  ];
  for (const [name, bytes, want] of cases) {
    const r = await raw(bytes);
    check(r.status === want && r.statusLines === 1 && r.valid && typeof r.json?.error?.message === 'string', `framing: ${name} -> ${want} with a JSON body`, r.head + r.body.toString('latin1').slice(0, 200));
  }
  const same = await raw(`${head}Content-Length: ${body.length}\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
  check(same.status === 200, 'framing: a repeated identical Content-Length is accepted', same.head);
  const chunked = await raw(`${head}Transfer-Encoding: Chunked\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`);
  check(chunked.status === 200 && chunked.json?.choices?.length === 1, 'framing: a chunked body alone is read (the coding in any case)', chunked.head);
}

// ---- the malformed-request matrix: each gets a 4xx (or, where the HTTP layer cannot parse the
// request at all, at least no 2xx or 5xx), never a hang; the server keeps serving
{
  const H = `Host: x\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n`;
  const cases = [
    ['garbage request line', 'HELLO\r\n\r\n', false],
    ['unknown HTTP version', 'GET /health HTTP/9.9\r\nHost: x\r\n\r\n', false, 505],
    ['header without a colon', `GET /health HTTP/1.1\r\n${H}Nonsense\r\n\r\n`, false],
    // libmicrohttpd answers these itself, before any handler runs, and 0.9.75 writes its status
    // line and headers twice (docs/serve.md, "Limits and security"): 2 status lines allowed
    ['malformed Content-Length', `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: abc\r\n\r\n{}`, false, 0, 2],
    ['negative Content-Length', `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: -5\r\n\r\n{}`, false, 0, 2],
    ['header of 64 KiB', `GET /v1/models HTTP/1.1\r\n${H}X-Big: ${'a'.repeat(65536)}\r\n\r\n`, false],
    ['URL of 64 KiB', `GET /${'a'.repeat(65536)} HTTP/1.1\r\n${H}\r\n`, false],
    ['bad chunk size', `POST /v1/completions HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`, false],
    ['no body', `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: 0\r\n\r\n`, true],
    ['body of NUL bytes', `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: 4\r\n\r\n\0\0\0\0`, true],
    ['JSON nested 5,000 deep', (() => { const b = '['.repeat(5000) + ']'.repeat(5000); return `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
    ['JSON with trailing garbage', (() => { const b = '{"prompt":"x","max_tokens":1} }'; return `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
    ['unknown method', `BREW /v1/completions HTTP/1.1\r\n${H}\r\n`, true],
    ['GET on a POST route', `GET /v1/chat/completions HTTP/1.1\r\n${H}\r\n`, true],
    ['a message without a role', (() => { const b = '{"messages":[{"content":"x"}]}'; return `POST /v1/chat/completions HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
    ['a huge max_tokens', (() => { const b = '{"prompt":"x","max_tokens":1e300}'; return `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
    ['prompt ids that are not integers', (() => { const b = '{"prompt":[1.5,2]}'; return `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
    ['stop_token_ids out of range', (() => { const b = '{"prompt":"x","stop_token_ids":[-1]}'; return `POST /v1/completions HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
    ['tokenize without a prompt', (() => { const b = '{}'; return `POST /tokenize HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
    ['detokenize a huge id', (() => { const b = '{"tokens":[1e30]}'; return `POST /detokenize HTTP/1.1\r\n${H}Content-Length: ${b.length}\r\n\r\n${b}`; })(), true],
  ];
  for (const [name, bytes, ours, also, lines = 1] of cases) {
    const t0 = Date.now();
    const r = await raw(bytes, 5000);
    const ms = Date.now() - t0;
    const ok = r.why !== 'timeout' && r.statusLines <= lines && (ours ? r.status >= 400 && r.status < 500 && r.valid && typeof r.json?.error?.message === 'string'
      : r.status === 0 || (r.status >= 400 && r.status < 500) || r.status === also);
    check(ok, `malformed: ${name} -> ${ours ? '4xx with a JSON error' : '4xx or closed'} (${r.status || r.why}, ${ms} ms)`, r.head.slice(0, 300));
  }
  check((await health()) === 200, 'the server keeps serving after the malformed requests');
}

// ---- authentication
{
  const get = (h) => raw(`GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${h}\r\n`);
  check((await get(`Authorization: bearer ${key}\r\n`)).status === 200, 'auth: the scheme in lower case');
  check((await get(`Authorization: BEARER ${key}\r\n`)).status === 200, 'auth: the scheme in upper case');
  const two = await get(`Authorization: Bearer wrong\r\nAuthorization: Bearer ${key}\r\n`);
  const two2 = await get(`Authorization: Bearer ${key}\r\nAuthorization: Bearer wrong\r\n`);
  check(two.status === 401 && two2.status === 401 && two.json?.error?.code === 'invalid_api_key', 'auth: two Authorization headers are refused (either order)', [two.head, two2.head]);
  check((await get('Authorization: Bearer \r\n')).status === 401, 'auth: an empty Bearer token is refused');
  check((await get(`Authorization: Basic ${key}\r\n`)).status === 401, 'auth: another scheme is refused');
  check((await get('')).status === 401, 'auth: no header -> 401');
  const m = await raw('GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  const h = await raw('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  check(m.status === 401 && h.status === 200, 'auth: /metrics needs the key, /health does not');
  const big = await raw(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\nConnection: close\r\n\r\n${'x'.repeat(200000)}`);
  check(big.status === 401 && big.valid, 'auth: an unauthenticated body is answered 401 (not parsed)', big.head);
}

// ---- UTF-8: invalid bytes in a request never reach a reply
{
  const bad = Buffer.concat([Buffer.from('{"prompt":"ab'), Buffer.from([0xff, 0xc3]), Buffer.from('","echo":true,"max_tokens":1}')]);
  const r = await raw(Buffer.concat([Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${'Authorization: Bearer ' + key}\r\nContent-Length: ${bad.length}\r\nConnection: close\r\n\r\n`), bad]));
  check(r.status === 400 && r.valid, 'utf-8: a prompt with invalid bytes -> 400, the reply valid UTF-8', r.body.toString('latin1'));
  const m = await raw(`GET /v1/models/%ff%c3 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n\r\n`);
  check(m.status === 404 && m.valid && m.json?.error?.message.includes('\ufffd'), 'utf-8: /v1/models/%ff -> 404, the message valid UTF-8', m.body.toString('latin1'));
  const u = await raw(`GET /%ff HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n\r\n`);
  check(u.status === 404 && u.valid, 'utf-8: an unknown route with invalid bytes -> 404, valid UTF-8', u.body.toString('latin1'));
  const bm = Buffer.concat([Buffer.from('{"model":"'), Buffer.from([0xfe]), Buffer.from('","prompt":"x"}')]);
  const mm = await raw(Buffer.concat([Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Length: ${bm.length}\r\nConnection: close\r\n\r\n`), bm]));
  check(mm.status >= 400 && mm.status < 500 && mm.valid, 'utf-8: a model name with invalid bytes -> 4xx, valid UTF-8', mm.body.toString('latin1'));
  const ok = await post('/v1/completions', JSON.stringify({ prompt: 'héllo 🎉', echo: true, max_tokens: 2, temperature: 0 }));
  check(ok.status === 200 && ok.valid && ok.json.choices[0].text.startsWith('héllo 🎉'), 'utf-8: valid text is echoed as sent');
}

// ---- seeds: exact over [-2^63, 2^64); -1 is 2^64 - 1
{
  const ids = async (lit) => {
    const r = await post('/v1/completions', `{"prompt":"Seeds","max_tokens":8,"temperature":1.5,"return_token_ids":true,"cache_prompt":false,"seed":${lit}}`);
    return r.status === 200 ? r.json.choices[0].token_ids.join(',') : `status ${r.status}`;
  };
  const v = {};
  for (const lit of ['9007199254740992', '9007199254740993', '9223372036854775808', '9223372036854775809', '18446744073709551615', '-1',
    '-9223372036854775808', '-9223372036854775807', '18446744073709551616', '1.5'])
    v[lit] = await ids(lit);
  check(v['9007199254740992'] !== v['9007199254740993'], 'seed: 2^53 and 2^53 + 1 differ', v);
  check(v['9223372036854775808'] !== v['9223372036854775809'] && v['9223372036854775809'] !== v['18446744073709551615'] &&
    !v['9223372036854775808'].startsWith('status'), 'seed: 2^63, 2^63 + 1 and 2^64 - 1 differ', v);
  check(v['18446744073709551615'] === v['-1'] && v['-9223372036854775808'] === v['9223372036854775808'] &&
    v['-9223372036854775807'] === v['9223372036854775809'], 'seed: negative seeds are taken modulo 2^64', v);
  check(v['18446744073709551616'] === 'status 400' && v['1.5'] === 'status 400', 'seed: 2^64 and 1.5 are refused', v);
}

// ---- the scoring cap (--max-score-tokens 100)
{
  const t = (await post('/tokenize', JSON.stringify({ prompt: 'word '.repeat(150) }))).json.tokens;
  const over = await post('/v1/completions', JSON.stringify({ prompt: t, echo: true, logprobs: 5, max_tokens: 0 }));
  const under = await post('/v1/completions', JSON.stringify({ prompt: t.slice(0, 90), echo: true, logprobs: 5, max_tokens: 0 }));
  check(t.length > 100 && over.status === 400 && over.json?.error?.code === 'max_score_tokens_exceeded', 'scoring over --max-score-tokens -> 400', over.json);
  check(under.status === 200 && under.json.choices[0].logprobs.token_logprobs.length === 90, 'scoring under the cap is answered');
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
