#!/usr/bin/env node
// Random id lists for decode tests: one JSON array per line. Ids are drawn from the whole
// vocabulary, with extra weight on the byte-level tokens that hold partial UTF-8 characters,
// so the lists exercise the invalid-UTF-8 (U+FFFD) rule of decoding.
//   node gen_ids.cjs [--seed N] [--count N] [--nvocab N]
"use strict";
const { options, seeded } = require("./common.cjs");
const args = process.argv.slice(2);
const opt = options(args);
const rnd = seeded(Number(opt("--seed", "1")), 0x85ebca6b);
const count = Number(opt("--count", "3000")), nvocab = Number(opt("--nvocab", "128815"));
const out = [];
for (let i = 0; i < count; i++) {
  const n = 1 + Math.floor(rnd() * 30), ids = [];
  for (let j = 0; j < n; j++) ids.push(rnd() < 0.4 ? Math.floor(rnd() * 300) : Math.floor(rnd() * nvocab)); // low ids: single bytes
  out.push(JSON.stringify(ids));
}
process.stdout.write(out.join("\n") + "\n");
