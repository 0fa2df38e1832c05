// The chat page at `/` in headless Chromium (Debian's chromium, driven by playwright-core):
// two turns typed into the page; the first answer equals the API's for the same request, the
// second turn resumes from the cache; the conversation survives a reload; a failed turn stands
// out and leaves the conversation as it was; an empty field is left out of the request; a
// stopped reply is marked; replies render paragraphs and code blocks; "new chat" clears. Only 127.0.0.1 is reachable: every other host fails to
// resolve, other traffic goes to a dead local proxy, and the page's own requests elsewhere are
// aborted. Usage: node web.mjs --port P --key K [--chromium PATH]
// Prints "ok ..."/"FAIL ..." lines and "N passed, M failed".
import { chromium } from 'playwright-core';

const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (i % 2 ? a : [...a, [x.replace(/^--/, ''), v[i + 1]]]), []));
const base = `http://127.0.0.1:${args.port}`;
let passed = 0, failed = 0;
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
function check(cond, what, detail) {
  if (cond) { passed++; console.log(`ok   ${what}`); }
  else { failed++; console.log(`FAIL ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 400) : ''}`); }
}

const browser = await chromium.launch({
  executablePath: args.chromium || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-features=OptimizationHints,MediaRouter,Translate'],
  proxy: { server: 'http://127.0.0.1:9', bypass: '127.0.0.1' },
});
try {
  const page = await browser.newPage();
  await page.route('**/*', (r) => (r.request().url().startsWith(base) ? r.continue() : r.abort()));
  const errors = [], bodies = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) bodies.push(JSON.parse(r.postData())); });
  const done = (n) => page.waitForFunction((n) => document.querySelectorAll('.assistant[data-done]').length === n, n, { timeout: 30000 });
  await page.goto(`${base}/`);
  await page.fill('#key', args.key);
  await page.dispatchEvent('#key', 'change');
  await page.fill('#temp', '0');
  await page.fill('#max', '8');
  await page.waitForFunction(() => document.getElementById('model').textContent !== 'dsv4', null, { timeout: 10000 });
  check((await page.textContent('#model')).length > 0, 'the page names the model');

  await page.fill('#input', 'Hello from the page');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.assistant[data-done]', { timeout: 30000 });
  const first = await page.textContent('.assistant .answer');
  const api = await (await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${args.key}` },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hello from the page' }], temperature: 0, max_tokens: 8 }) })).json();
  check(first.length > 0 && first === api.choices[0].message.content, 'first answer streamed into the page equals the API answer', { first, api: api.choices?.[0] });

  await page.fill('#input', 'And a second turn');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => document.querySelectorAll('.assistant[data-done]').length === 2, null, { timeout: 30000 });
  const cached = Number(await page.getAttribute('.assistant >> nth=1', 'data-cached'));
  check(cached > 0, 'the second turn resumes from the cache', { cached });

  // a reload keeps the conversation and the settings
  const answers = async () => page.$$eval('.assistant .answer', (els) => els.map((e) => e.textContent));
  const before = await answers();
  await page.reload();
  await done(2);
  check(same(await answers(), before) && (await page.$$('.msg.user')).length === 2 && (await page.inputValue('#max')) === '8',
    'the conversation and the settings survive a reload', { before, after: await answers() });

  // a failed turn: it stands out, and the next message goes without it
  await page.fill('#max', '99999999');
  await page.fill('#input', 'This one fails');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.assistant[data-done="error"]', { timeout: 30000 });
  const err = await page.$eval('.assistant.error', (b) => ({ text: b.querySelector('.errtext')?.textContent, border: getComputedStyle(b).borderTopColor }));
  check(/context/.test(err.text ?? '') && err.border === 'rgb(220, 38, 38)', 'a failed turn is shown as an error that stands out', err);
  await page.fill('#max', '8');
  await page.fill('#input', 'After the failure');
  await page.press('#input', 'Enter');
  await done(4);
  const after = bodies.at(-1);
  const last = await page.getAttribute('.assistant >> nth=3', 'data-done');
  check(after.messages.length === 5 && !after.messages.some((m) => m.content === 'This one fails') && ['length', 'stop'].includes(last),
    'a failed turn leaves the history as it was: the next turn succeeds', { messages: after.messages.map((m) => m.content), last });

  // empty fields are unset; a stopped reply is marked and kept
  await page.fill('#temp', '');
  await page.fill('#max', '');
  await page.fill('#input', 'Unset fields, then stop');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => { const a = document.querySelectorAll('.assistant .answer'); return a.length === 5 && a[4].textContent.length > 0; }, null, { timeout: 30000 });
  await page.click('#stop');
  await page.waitForSelector('.assistant[data-done="stopped"]', { timeout: 30000 });
  const unset = bodies.at(-1);
  const stopped = await page.$eval('.assistant[data-done="stopped"]', (b) => ({ cls: b.className, before: getComputedStyle(b.querySelector('.stats'), '::before').content }));
  check(!('temperature' in unset) && !('max_tokens' in unset), 'an empty field is left out of the request (the server default)', unset);
  check(/stopped/.test(stopped.cls) && /stopped/.test(stopped.before), 'a stopped reply is marked as stopped', stopped);
  const kept = await page.evaluate(() => JSON.parse(localStorage.getItem('dsv4-chat')).history);
  check(kept.length === 8 && kept[7].stopped === true, 'the stopped reply is kept in the conversation', kept.map((m) => m.role));

  // paragraphs and code blocks
  await page.evaluate(() => localStorage.setItem('dsv4-chat', JSON.stringify({ history: [{ role: 'user', content: 'q' },
    { role: 'assistant', content: 'One.\n\nTwo <b>not bold</b>.\n\n```c\nint x = 1;\n```\nThree.' }], temp: '0', max: '8', think: false })));
  await page.reload();
  await done(1);
  const r = await page.$eval('.assistant .answer', (a) => ({ p: [...a.querySelectorAll('p')].map((x) => x.textContent), code: a.querySelector('pre code')?.textContent, b: a.querySelectorAll('b').length }));
  check(same(r, { p: ['One.', 'Two <b>not bold</b>.', 'Three.'], code: 'int x = 1;', b: 0 }), 'replies render paragraphs and code blocks (as text)', r);

  // new chat clears the conversation, across a reload too
  await page.click('#reset');
  await page.reload();
  await page.waitForFunction(() => document.getElementById('model').textContent !== 'dsv4', null, { timeout: 10000 });
  check((await page.$$('.msg')).length === 0, '"new chat" clears the conversation (and what a reload restores)');
  check(errors.length === 0, 'no page errors', errors);
} catch (e) {
  check(false, 'the page test ran', String(e));
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
