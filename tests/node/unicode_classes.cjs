#!/usr/bin/env node
// Which code points Hugging Face's Rust tokenizers (its Oniguruma regex engine) puts in each
// Unicode class the pre-tokenizer patterns use: \p{L} \p{M} \p{N} \p{P} \p{S} \s.
// Prints one line per class: "L 41-5a,61-7a,..." (hex code point ranges, inclusive).
// tests/unit/test_unicode.c compares dsv4's regex classes against this file.
"use strict";
const { Tokenizer } = require("tokenizers");
const classes = ["L", "M", "N", "P", "S", "s"];
const SEP = "\u0001"; // in none of the classes
// every scalar value except surrogates and the separator itself
const cps = [];
for (let c = 0; c <= 0x10ffff; c++) if ((c < 0xd800 || c > 0xdfff) && c !== 1) cps.push(c);
const text = cps.map((c) => String.fromCodePoint(c) + SEP).join("");
for (const k of classes) {
  const re = k === "s" ? "\\s" : `\\p{${k}}`;
  const tok = Tokenizer.fromString(JSON.stringify({
    version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: "Split", pattern: { Regex: re }, behavior: "Isolated", invert: false },
    post_processor: null, decoder: null,
    model: { type: "WordLevel", vocab: { "[UNK]": 0 }, unk_token: "[UNK]" },
  }));
  const pieces = tok.getPreTokenizer().preTokenizeString(text);
  const hit = new Set();
  for (const [p] of pieces) if (!p.includes(SEP)) hit.add(p.codePointAt(0));
  const ranges = [];
  let start = -1, prev = -2;
  for (const c of [...hit].sort((a, b) => a - b)) {
    if (c !== prev + 1) { if (start >= 0) ranges.push([start, prev]); start = c; }
    prev = c;
  }
  if (start >= 0) ranges.push([start, prev]);
  process.stdout.write(k + " " + ranges.map(([a, b]) => (a === b ? a.toString(16) : a.toString(16) + "-" + b.toString(16))).join(",") + "\n");
}
