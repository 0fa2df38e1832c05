#!/usr/bin/env node
// Every code point (surrogates excepted), then each line of STRINGS, through the Engram token
// map's normalizer chain with Hugging Face's own normalizers. Writes the inputs (one JSON string
// per line) to IN and the peer's outputs to OUT.
//   node normalize_oracle.cjs IN OUT [STRINGS]
"use strict";
const fs = require("fs");
const { Tokenizer } = require("tokenizers");
const chain = Tokenizer.fromString(JSON.stringify({
  version: "1.0", truncation: null, padding: null, added_tokens: [], pre_tokenizer: null, post_processor: null, decoder: null,
  model: { type: "WordLevel", vocab: { "[UNK]": 0 }, unk_token: "[UNK]" },
  normalizer: { type: "Sequence", normalizers: [
    { type: "NFKC" }, { type: "NFD" }, { type: "StripAccents" }, { type: "Lowercase" },
    { type: "Replace", pattern: { Regex: "[ \\t\\r\\n]+" }, content: " " },
    { type: "Replace", pattern: { Regex: "^ $" }, content: "\ue000" },
    { type: "Strip", strip_left: true, strip_right: true },
    { type: "Replace", pattern: { String: "\ue000" }, content: " " },
  ] },
})).getNormalizer();
const ins = [], outs = [];
for (let c = 0; c <= 0x10ffff; c++) {
  if (c >= 0xd800 && c <= 0xdfff) continue;
  const s = String.fromCodePoint(c);
  ins.push(JSON.stringify(s));
  outs.push(JSON.stringify(chain.normalizeString(s)));
}
if (process.argv[4])
  for (const l of fs.readFileSync(process.argv[4], "utf8").split("\n")) {
    if (!l) continue;
    ins.push(l);
    outs.push(JSON.stringify(chain.normalizeString(JSON.parse(l))));
  }
fs.writeFileSync(process.argv[2], ins.join("\n") + "\n");
fs.writeFileSync(process.argv[3], outs.join("\n") + "\n");
