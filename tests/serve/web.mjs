// The chat page at `/` in headless Chromium (Debian's chromium, driven by playwright-core):
// two turns typed into the page; the first answer equals the API's for the same request, the
// second turn resumes from the cache. Only 127.0.0.1 is reachable: every other host fails to
// resolve, other traffic goes to a dead local proxy, and the page's own requests elsewhere are
// aborted. Usage: node web.mjs --port P --key K [--chromium PATH]
// Prints "ok ..."/"FAIL ..." lines and "N passed, M failed".
import { chromium } from 'playwright-core';

const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (i % 2 ? a : [...a, [x.replace(/^--/, ''), v[i + 1]]]), []));
const base = `http://127.0.0.1:${args.port}`;
let passed = 0, failed = 0;
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
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
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
  check(errors.length === 0, 'no page errors', errors);
} catch (e) {
  check(false, 'the page test ran', String(e));
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
