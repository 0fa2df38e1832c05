#!/usr/bin/env node
// Every code point (surrogates excepted), then each line of STRINGS, through the Engram token
// map's normalizer chain with Hugging Face's own normalizers. Writes the inputs (one JSON string
// per line) to IN and the peer's outputs to OUT.
//   node normalize_oracle.cjs IN OUT [STRINGS]
"use strict";
const { engramChain } = require("./common.cjs");
const fs = require("fs");
const { Tokenizer } = require("tokenizers");
const chain = engramChain(Tokenizer);
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
