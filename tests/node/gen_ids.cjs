#!/usr/bin/env node
// Random id lists for decode tests: one JSON array per line. Ids are drawn from the whole
// vocabulary, with extra weight on the byte-level tokens that hold partial UTF-8 characters,
// so the lists exercise the invalid-UTF-8 (U+FFFD) rule of decoding.
//   node gen_ids.cjs [--seed N] [--count N] [--nvocab N]
"use strict";
const args = process.argv.slice(2);
const opt = (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };
let st = (Number(opt("--seed", "1")) * 0x85ebca6b) >>> 0;
function rnd() {
  st = (st + 0x6d2b79f5) >>> 0;
  let t = st;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const count = Number(opt("--count", "3000")), nvocab = Number(opt("--nvocab", "128815"));
const out = [];
for (let i = 0; i < count; i++) {
  const n = 1 + Math.floor(rnd() * 30), ids = [];
  for (let j = 0; j < n; j++) ids.push(rnd() < 0.4 ? Math.floor(rnd() * 300) : Math.floor(rnd() * nvocab)); // low ids: single bytes
  out.push(JSON.stringify(ids));
}
process.stdout.write(out.join("\n") + "\n");
