#!/usr/bin/env node
// Encodes the same text with dsv4 (build/dsv4 tokenize --time) and with Hugging Face tokenizers
// (the Rust binding, one thread) and prints MB/s for both. Only encoding is timed: not loading,
// not JSON. Each side runs in a fresh process (cold word cache), best of 3.
//   node bench/tokenizer_bench.js [--mb N]
// Corpora: "seeds" = the seed text of the tokenizer tests (tests/data/seeds) repeated to N MB (prose and code, English-heavy);
// "mixed" = the test generator's strings (seed 3): many scripts, emoji, numbers, whitespace.
"use strict";
const fs = require("fs");
const path = require("path");
const os = require("os");
const { execFileSync, spawnSync } = require("child_process");
const root = path.join(__dirname, "..");
const nodeDir = path.join(root, "tests", "node");
const args = process.argv.slice(2);
const mb = Number(args.includes("--mb") ? args[args.indexOf("--mb") + 1] : 8);
const seedDir = path.join(root, "tests", "data", "seeds");
const tokdir = path.join(nodeDir, "node_modules", "@lenml", "tokenizer-deepseek_v3", "models");

function chunks(text, size) { // pieces of about `size` UTF-16 units, never splitting a surrogate pair
  const out = [];
  for (let i = 0; i < text.length;) {
    let j = Math.min(text.length, i + size);
    if (j < text.length && text.charCodeAt(j - 1) >= 0xd800 && text.charCodeAt(j - 1) <= 0xdbff) j++;
    out.push(text.slice(i, j));
    i = j;
  }
  return out;
}

let seeds = "";
for (const f of fs.readdirSync(seedDir).sort()) seeds += fs.readFileSync(path.join(seedDir, f), "utf8");
let big = "";
while (Buffer.byteLength(big) < mb * 1e6) big += seeds;
const mixed = execFileSync("node", [path.join(nodeDir, "gen_strings.cjs"), "--seed", "3"], { maxBuffer: 1 << 30 })
  .toString().split("\n").filter((l) => l).map((l) => JSON.parse(l)).join("\n");

const hfScript = `
const { Tokenizer } = require(${JSON.stringify(path.join(nodeDir, "node_modules", "tokenizers"))});
const fs = require("fs");
const lines = fs.readFileSync(process.argv[1], "utf8").split("\\n").filter((l) => l).map((l) => JSON.parse(l));
const tok = Tokenizer.fromFile(${JSON.stringify(path.join(tokdir, "tokenizer.json"))});
(async () => {
  let bytes = 0;
  for (const s of lines) bytes += Buffer.byteLength(s);
  const t0 = process.hrtime.bigint();
  for (const s of lines) await tok.encode(s, null, { addSpecialTokens: false });
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(bytes + " " + secs);
})();`;

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "dsv4-bench-"));
const env = { ...process.env, RAYON_NUM_THREADS: "1", TOKENIZERS_PARALLELISM: "false" };
for (const [name, text] of [["seeds", big], ["mixed", mixed]]) {
  const file = path.join(tmp, name + ".jsonl");
  fs.writeFileSync(file, chunks(text, Number(process.env.CHUNK || 65536)).map((c) => JSON.stringify(c)).join("\n") + "\n");
  let best = { dsv4: Infinity, hf: Infinity }, bytes = 0;
  for (let r = 0; r < 3; r++) {
    const run = spawnSync(path.join(root, "build", "dsv4"), ["tokenize", "-t", tokdir, "--time"],
      { input: fs.readFileSync(file), stdio: ["pipe", "ignore", "pipe"], maxBuffer: 1 << 30 });
    if (run.status !== 0) throw new Error("dsv4 tokenize failed: " + run.stderr);
    const err = run.stderr.toString();
    const m = /encode: (\d+) bytes in ([\d.]+) s/.exec(err);
    bytes = Number(m[1]);
    best.dsv4 = Math.min(best.dsv4, Number(m[2]));
    const [hb, hs] = execFileSync("node", ["-e", hfScript, file], { env, maxBuffer: 1 << 30 }).toString().trim().split(" ").map(Number);
    if (hb !== bytes) throw new Error(`byte counts differ: ${hb} vs ${bytes}`);
    best.hf = Math.min(best.hf, hs);
  }
  const f = (s) => (bytes / 1e6 / s).toFixed(1);
  console.log(`${name}: ${(bytes / 1e6).toFixed(1)} MB  dsv4 ${f(best.dsv4)} MB/s  hf-tokenizers ${f(best.hf)} MB/s  (ratio ${(best.hf / best.dsv4).toFixed(2)}x)`);
}
fs.rmSync(tmp, { recursive: true });
