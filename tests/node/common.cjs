// What the Node test tools share: option lookup, the seeded generator, and the Engram token
// map's normalizer chain (DeepSeek-V4.1 spec 9.1) as Hugging Face's own normalizers.
"use strict";

// opt(args)(key, default): the value after `key` in args, or default.
const options = (args) => (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };

// A mulberry32 stream seeded with seed * mult (each tool its own multiplier, so the tools'
// streams differ for the same seed); returns uniform numbers in [0, 1).
function seeded(seed, mult) {
  let st = (Number(seed) * mult) >>> 0;
  return function rnd() {
    st = (st + 0x6d2b79f5) >>> 0;
    let t = st;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// The token map's normalizer chain, built with the `tokenizers` package's Tokenizer class.
function engramChain(Tokenizer) {
  return Tokenizer.fromString(JSON.stringify({
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
}

module.exports = { options, seeded, engramChain };
