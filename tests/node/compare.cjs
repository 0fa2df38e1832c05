#!/usr/bin/env node
// Compares the tokenizer's outputs with the peer's, line by line.
//   node compare.cjs STRINGS ORACLE_IDS DSV4_IDS DSV4_DECODED [ORACLE_DECODED_RANDOM DSV4_DECODED_RANDOM]
// Checks: identical ids; dsv4's decode(encode(s)) == s; and, for random id lists, dsv4's decode ==
// the peer's decode. Prints the first failures with the code points involved, then
// "text: N passed, M failed".
"use strict";
const fs = require("fs");
const lines = (f) => fs.readFileSync(f, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
const [sf, of, df, rf, ordf, drdf] = process.argv.slice(2);
const S = lines(sf), O = lines(of), D = lines(df), R = lines(rf);
let pass = 0, fail = 0, shown = 0;
const hex = (s) => Array.from(s).map((c) => "U+" + c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")).join(" ");
const show = (msg) => { if (shown++ < 15) console.log(msg); };
if (O.length !== S.length || D.length !== S.length || R.length !== S.length) {
  console.log(`line counts differ: strings ${S.length}, oracle ${O.length}, dsv4 ${D.length}, decoded ${R.length}`);
  fail++;
}
for (let i = 0; i < S.length; i++) {
  const a = JSON.stringify(O[i]), b = JSON.stringify(D[i]);
  if (a === b) pass++;
  else {
    fail++;
    let k = 0;
    while (k < O[i].length && O[i][k] === D[i][k]) k++;
    show(`ids differ on line ${i + 1} at position ${k}: peer ${JSON.stringify(O[i].slice(k, k + 6))} dsv4 ${JSON.stringify((D[i] || []).slice(k, k + 6))}\n  text ${JSON.stringify(S[i]).slice(0, 200)}\n  ${hex(S[i]).slice(0, 300)}`);
  }
  if (R[i] === S[i]) pass++;
  else { fail++; show(`decode(encode(s)) != s on line ${i + 1}: ${JSON.stringify(S[i]).slice(0, 120)} -> ${JSON.stringify(R[i]).slice(0, 120)}`); }
}
if (ordf) {
  const OR = lines(ordf), DR = lines(drdf);
  if (OR.length !== DR.length) { fail++; console.log(`random-id decode: line counts differ ${OR.length} vs ${DR.length}`); }
  for (let i = 0; i < OR.length; i++) {
    if (OR[i] === DR[i]) pass++;
    else { fail++; show(`decode of random ids differs on line ${i + 1}: peer ${JSON.stringify(OR[i]).slice(0, 120)} dsv4 ${JSON.stringify(DR[i]).slice(0, 120)}`); }
  }
}
console.log(`text: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
