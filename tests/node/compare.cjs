#!/usr/bin/env node
// Compares the tokenizer's outputs with the peer's, line by line.
//   node compare.cjs STRINGS PEER_IDS DSV4_IDS DSV4_DECODED [--decode PEER DSV4] [--keys PEER DSV4]
//                    [--map PEER DSV4] [--lossy EXPECTED DSV4] [--same PEER DSV4]...
// Checks: identical ids; dsv4's decode(encode(s)) == s; --decode: the same decode of random id
// lists; --keys: the same Engram token-map key per id (one JSON [id, key] per line); --map: the
// same token map; --lossy: decode(encode(raw bytes)) equal to the Unicode decoder's reading;
// --same (repeatable): two files of JSON lines equal line by line. Prints the first failures, then "text: N passed, M failed".
"use strict";
const fs = require("fs");
const lines = (f) => fs.readFileSync(f, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
const argv = process.argv.slice(2);
const [sf, of, df, rf] = argv;
const flag = (k) => { const i = argv.indexOf(k); return i >= 0 ? [argv[i + 1], argv[i + 2]] : [null, null]; };
const [ordf, drdf] = flag("--decode"), [pkf, dkf] = flag("--keys"), [pmf, dmf] = flag("--map"), [lef, ldf] = flag("--lossy");
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
if (pkf) {
  const PK = lines(pkf), DK = lines(dkf);
  if (PK.length !== DK.length) { fail++; console.log(`token-map keys: ${PK.length} ids from the peer, ${DK.length} from dsv4`); }
  for (let i = 0; i < PK.length; i++) {
    if (JSON.stringify(PK[i]) === JSON.stringify(DK[i])) pass++;
    else { fail++; show(`token-map key differs: peer ${JSON.stringify(PK[i])} dsv4 ${JSON.stringify(DK[i])}`); }
  }
}
if (pmf) {
  const PM = lines(pmf)[0] || [], DM = lines(dmf)[0] || [];
  const ok = JSON.stringify(PM) === JSON.stringify(DM);
  if (ok) pass++; else { fail++; console.log(`token maps differ (peer ${new Set(PM).size} classes, dsv4 ${new Set(DM).size})`); }
}
if (lef) {
  const LE = lines(lef), LD = lines(ldf);
  if (LE.length !== LD.length) { fail++; console.log(`invalid UTF-8: ${LE.length} expected lines, ${LD.length} from dsv4`); }
  for (let i = 0; i < LE.length; i++) {
    if (LE[i] === LD[i]) pass++;
    else { fail++; show(`invalid UTF-8 line ${i + 1}: expected ${JSON.stringify(LE[i])} dsv4 ${JSON.stringify(LD[i])}`); }
  }
}
for (let i = 0; i < argv.length; i++) {
  if (argv[i] !== "--same") continue;
  const P = lines(argv[i + 1]), Q = lines(argv[i + 2]);
  if (P.length !== Q.length) { fail++; console.log(`${argv[i + 1]}: ${P.length} lines, ${argv[i + 2]}: ${Q.length}`); }
  for (let k = 0; k < P.length; k++) {
    if (JSON.stringify(P[k]) === JSON.stringify(Q[k])) pass++;
    else { fail++; show(`${argv[i + 2]} line ${k + 1}: peer ${JSON.stringify(P[k]).slice(0, 150)} dsv4 ${JSON.stringify(Q[k]).slice(0, 150)}`); }
  }
}
console.log(`text: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
