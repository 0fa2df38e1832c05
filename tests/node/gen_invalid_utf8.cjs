#!/usr/bin/env node
// Lines that are JSON strings holding raw, mostly invalid UTF-8 bytes (never '"', '\\' or
// control bytes, so each line stays one JSON string), and what the WHATWG/Unicode decoder makes
// of them (each maximal invalid subpart becomes U+FFFD, as Rust's from_utf8_lossy does).
//   node gen_invalid_utf8.cjs OUT_LINES OUT_EXPECTED [--seed N] [--count N]
"use strict";
const { options, seeded } = require("./common.cjs");
const fs = require("fs");
const args = process.argv.slice(2);
const opt = options(args);
const rnd = seeded(Number(opt("--seed", "1")), 0xc2b2ae35);
const count = Number(opt("--count", "2000"));
const pieces = [[0xe6, 0x97, 0xa5], [0xf0, 0x9f, 0x98, 0x80], [0xc3, 0xa9], [0x61], [0x20], [0xed, 0xa0, 0x80], [0xc0, 0xaf],
  [0xf4, 0x90, 0x80, 0x80], [0xe0, 0x80], [0xf0, 0x9f], [0xff], [0x80], [0xbf, 0xbf]];
const lines = [], expect = [];
const dec = new TextDecoder("utf-8");
for (let i = 0; i < count; i++) {
  const bytes = [];
  const n = 1 + Math.floor(rnd() * 24);
  for (let k = 0; k < n; k++) {
    if (rnd() < 0.5) bytes.push(...pieces[Math.floor(rnd() * pieces.length)]);
    else bytes.push(0x80 + Math.floor(rnd() * 128));
  }
  const b = Buffer.from(bytes);
  lines.push(Buffer.concat([Buffer.from('"'), b, Buffer.from('"\n')]));
  expect.push(JSON.stringify(dec.decode(b)));
}
fs.writeFileSync(args[0], Buffer.concat(lines));
fs.writeFileSync(args[1], expect.join("\n") + "\n");
